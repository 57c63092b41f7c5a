"""Which target's weights a draft was trained on: a small record of them, checked by eval.

``dflash train`` records :func:`weights_record` of the target it trains on (grown by the
mask token's row where training added it) in the draft's config, which ``dflash export``
keeps; ``dflash eval`` refuses a target whose weights are not those
(:func:`check_draft_target_weights`), as it refuses another tokenizer: a target of the same
shapes and tokenizer with other weights (another checkpoint, weights drawn afresh) would
give figures of a draft that was never trained for it.

The record holds the parameters' count, the sha256 of their shapes (in name order) and
:data:`SAMPLES` values read at fixed places, compared within a relative tolerance that a
float32 target read in bfloat16 or float16 keeps (:data:`REL_TOL`).

Example::

    >>> import torch, transformers
    >>> cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> model = transformers.LlamaForCausalLM(cfg)
    >>> rec = weights_record(model)
    >>> rec["parameters"], len(rec["sample"])
    (21, 64)
    >>> differs(rec, weights_record(model.to(torch.bfloat16)))
    0
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from lengthwise.errors import DataError

__all__ = ["REL_TOL", "SAMPLES", "check_draft_target_weights", "differs", "weights_record"]

#: values of the target's weights a record keeps
SAMPLES = 64
#: relative difference two records' values may have (a float32 weight read in bfloat16 or
#: float16 moves by at most 2**-9 of itself)
REL_TOL = 1e-2
#: absolute difference below which two values are equal (float16's subnormal steps)
ABS_TOL = 1e-6
#: the golden ratio's fraction: sample ``i`` sits at this times ``i + 1`` (mod 1) of its tensor
_SPREAD = (math.sqrt(5) - 1) / 2


def weights_record(model: Any) -> dict[str, Any]:
    """``parameters``, ``shapes_sha256`` and ``sample`` of a model's weights (module doc)."""
    params = [p for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0])]
    shapes = json.dumps([list(p.shape) for p in params])
    sample = []
    for i in range(SAMPLES if params else 0):
        flat = params[i * len(params) // SAMPLES].detach().reshape(-1)
        if flat.numel():
            value = float(flat[int((i + 1) * _SPREAD % 1.0 * flat.numel())])
            sample.append(value if math.isfinite(value) else None)
    return {"parameters": len(params),
            "shapes_sha256": hashlib.sha256(shapes.encode("utf-8")).hexdigest(),
            "sample": sample}


def differs(record: dict[str, Any], other: dict[str, Any]) -> int:
    """How many sampled values of two records differ (all of them when the shapes differ).

    Example::

        >>> a = {"parameters": 2, "shapes_sha256": "x", "sample": [1.0, 0.5]}
        >>> differs(a, {**a, "sample": [1.001, -0.5]}), differs(a, {**a, "shapes_sha256": "y"})
        (1, 2)
    """
    ours, theirs = record.get("sample") or [], other.get("sample") or []
    if (record.get("shapes_sha256") != other.get("shapes_sha256")
            or record.get("parameters") != other.get("parameters") or len(ours) != len(theirs)):
        return max(len(ours), len(theirs))
    return sum(not _close(a, b) for a, b in zip(ours, theirs, strict=True))


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) + ABS_TOL


def check_draft_target_weights(draft_config: Any, model: Any, *, draft: str,
                               target: str) -> None:
    """Refuse a target whose weights are not those the draft was trained on.

    A draft without the record (``DFlashConfig.target_weights``: published elsewhere) is
    not checked, as :func:`~lengthwise.dflash.tokenizer_id.check_draft_tokenizer` does not
    check a draft without its tokenizer record.
    """
    from lengthwise.dflash.tokenizer_id import DRAFT_TARGET_FIX

    record = getattr(draft_config, "target_weights", None)
    if not record:
        return
    mine = weights_record(model)
    n = differs(record, mine)
    if n:
        raise DataError(
            f"the draft {draft} was trained on other weights than --target {target}'s ({n} "
            f"of {len(record.get('sample') or [])} sampled values differ; the draft: "
            f"{record.get('parameters')} tensors, shapes sha256 "
            f"{str(record.get('shapes_sha256'))[:12]}; --target: {mine['parameters']} "
            f"tensors, shapes sha256 {mine['shapes_sha256'][:12]}); {DRAFT_TARGET_FIX}")
