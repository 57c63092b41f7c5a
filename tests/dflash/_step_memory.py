"""Predicted and measured peak of one DFlash training step on CPU, at one shape.

Run as a script (Linux): ``_step_memory.py JSON`` with the shape as a JSON object
(target sizes and run settings) prints one JSON line: ``predicted`` (bytes the step
adds at its peak, from :func:`lengthwise.dflash.memory.estimate_step`, traced under
fake tensors before any real tensor exists) and ``measured`` (the same step run for
real: ``DFlashTask.forward``, backward, clipping, AdamW, ``zero_grad``, as the
training loop runs it, after a first step that made the optimizer's state). The
measured peak is the process's high-water resident set (``VmHWM``, reset through
``/proc/self/clear_refs``) minus the resident set before the step; run it with
``MALLOC_MMAP_THRESHOLD_=65536`` and one thread so every large buffer is fresh mapped
memory that the resident set counts and frees.
"""

from __future__ import annotations

import json
import sys

from _head_memory import _reset, _status


def main(shape: dict) -> None:
    import torch
    import transformers

    from lengthwise.dflash.memory import estimate_step, step_blocks, step_shape
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.recipe import new_draft
    from lengthwise.dflash.target import Target
    from lengthwise.dflash.train import DFlashTask, DFlashTrainConfig
    from lengthwise.train.device import autocast_dtype

    torch.set_num_threads(1)
    h, layers, heads, kv, inter, vocab = shape["target"]
    tcfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv,
                                    head_dim=h // heads, intermediate_size=inter,
                                    tie_word_embeddings=False, use_cache=False)
    cfg = DFlashTrainConfig(steps=2, device="cpu", progress=False, warmup=0, **shape["run"])
    rows = shape.get("rows", 1)
    est = estimate_step(tcfg, cfg, rows=rows)

    torch.manual_seed(0)
    target = Target(transformers.AutoModelForCausalLM.from_config(tcfg),
                    layers=target_layer_ids(layers, cfg.num_features or cfg.draft_layers))
    draft = new_draft(target, cfg, mask_token_id=vocab - 1)
    task = DFlashTask(draft, target, cfg, order="stratified",
                      amp=autocast_dtype(cfg.dtype, "cpu"))
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    tokens, per_row = step_shape(cfg, rows)
    micro = [step_blocks(rows, tokens, per_row, cfg.block_size, vocab)
             for _ in range(min(cfg.grad_accum, 2))]

    def step() -> None:
        for b in micro:
            out = task.forward(draft, b)
            (out.loss * (1.0 / out.norm)).backward()
            del out
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's state and torch's one-time allocations
    base = _reset()
    step()
    measured = _status("VmHWM:") - base
    print(json.dumps({"predicted": est.step_peak, "measured": measured, "peak": est.peak,
                      "parts": est.parts, "slots": est.slots}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
