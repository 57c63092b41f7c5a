"""Peak extra memory of the chunked LM head + cross-entropy at a 151,936-token vocabulary.

Run as a script (Linux): ``head ROWS ANCHORS BLOCK CHUNK VOCAB HIDDEN`` prints one JSON
line with the measured peak extra bytes of ``head_loss`` (forward and backward) over
a micro-batch and what the meter saw of a known allocation; ``objective CHUNK VOCAB``
prints the peak extra bytes of a whole DFlash micro-batch (``DFlashTask.forward`` and
its backward: the frozen target's features, the draft, the LM head and the loss) with
a target of that vocabulary. The peak is the
process's high-water resident set (``VmHWM``, reset through ``/proc/self/clear_refs``)
minus the resident set before the call; run it with ``MALLOC_MMAP_THRESHOLD_=65536``
so every large buffer is fresh mapped memory that the resident set counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from memory_estimate import reset_high_water as _reset  # noqa: E402
from memory_estimate import status_bytes as _status  # noqa: E402


def main(rows: int, anchors: int, block: int, chunk: int, vocab: int, hidden: int) -> None:
    import torch

    from lengthwise.dflash.loss import head_loss
    from lengthwise.dflash.objective import IGNORE

    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    slots = rows * anchors * block
    h = torch.randn(rows, anchors * block, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (rows, anchors, block))
    labels[:, :, 0] = IGNORE  # slot 0 predicts nothing
    labels[0, anchors // 2:] = IGNORE  # unused blocks of a row with fewer anchors
    weights = (labels != IGNORE).float()
    # first call: torch's own one-time allocations are not the objective's
    head_loss(h[:, :block], head, labels[:, :1], weights[:, :1], chunk=chunk).weighted.backward()
    h.grad = None
    base = _reset()
    out = head_loss(h, head, labels, weights, chunk=chunk)
    out.weighted.backward()
    peak = _status("VmHWM:") - base
    base = _reset()
    probe = torch.ones(chunk, vocab)
    seen = _status("VmHWM:") - base
    del probe
    print(json.dumps({"peak": peak, "slots": slots, "supervised": out.count,
                      "probe": chunk * vocab * 4, "probe_seen": seen,
                      "grad_finite": bool(torch.isfinite(h.grad).all())}))


def objective(chunk: int, vocab: int) -> None:
    import torch
    import transformers

    from lengthwise.dflash.model import DFlashConfig, DFlashDraft
    from lengthwise.dflash.target import Target
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.dflash.train_config import DFlashTrainConfig
    from lengthwise.pytorch.collate import PadCollator

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tcfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size=128, max_position_embeddings=512,
                                    use_cache=False)
    target = Target(transformers.LlamaForCausalLM(tcfg), layers=[0, 1])
    draft = DFlashDraft(DFlashConfig.from_target(tcfg, num_layers=1, block_size=16,
                                                 target_layers=[0, 1], mask_token_id=vocab - 1))
    cfg = DFlashTrainConfig(steps=1, grad_accum=1, max_tokens=512, max_len=256, block_size=16,
                            num_anchors=32, head_chunk=chunk, warmup=0, progress=False)
    task = DFlashTask(draft, target, cfg, order="stratified")
    gen = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(2):
        ids = torch.randint(0, vocab, (256,), generator=gen).tolist()
        samples.append({"input_ids": ids, "labels": [-100] * 8 + ids[8:]})
    blocks = task.prepare(PadCollator(pad_token_id=0)(samples), [[0], [1]], 0)
    task.forward(draft, blocks).loss.backward()  # the first call's one-time allocations
    base = _reset()
    out = task.forward(draft, blocks)
    out.loss.backward()
    peak = _status("VmHWM:") - base
    print(json.dumps({"peak": peak, "slots": blocks.slots, "supervised": blocks.supervised,
                      "loss_finite": bool(torch.isfinite(out.loss))}))


if __name__ == "__main__":
    if sys.argv[1] == "objective":
        objective(*(int(x) for x in sys.argv[2:]))
    else:
        main(*(int(x) for x in sys.argv[2:]))
