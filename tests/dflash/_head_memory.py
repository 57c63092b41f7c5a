"""Peak extra memory of the chunked LM head + cross-entropy at a 151,936-token vocabulary.

Run as a script (Linux): prints one JSON line with the measured peak extra bytes of
``head_loss`` (forward and backward) over a micro-batch, the stated chunk bound, the
dense logits' size, and what the meter saw of a known allocation. The peak is the
process's high-water resident set (``VmHWM``, reset through ``/proc/self/clear_refs``)
minus the resident set before the call; run it with ``MALLOC_MMAP_THRESHOLD_=65536``
so every large buffer is fresh mapped memory that the resident set counts.
"""

from __future__ import annotations

import json
import sys


def _status(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset() -> int:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current resident set
    return _status("VmRSS:")


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


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:]))
