"""Peak memory of a DFlash training step, predicted before launch from the target's config.

:func:`estimate_step` runs one step of the run's settings through the training code
(draft forward, chunked LM head and cross-entropy, backward, clipping, AdamW) on the target
and draft built under fake tensors (:mod:`~lengthwise.dflash.cost.trace`), after a first
step that made the optimizer's state; with ``grad_accum > 1`` it holds two micro-batches.
The peak of the live bytes plus the weights and optimizer state is the predicted peak of
``torch.cuda.max_memory_allocated``. The micro-batch is the worst of the settings
(:func:`step_shape`); ``cached``: its features come from a feature cache (no target
forward). The target is traced at a shallow depth, its other layers' bytes added
(:data:`SHALLOW_TARGET`). See docs/dflash.md, "Memory before launch".

Example::

    >>> import transformers
    >>> from lengthwise.dflash.train_config import DFlashTrainConfig
    >>> t = transformers.Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=4,
    ...                              num_attention_heads=4, num_key_value_heads=2,
    ...                              intermediate_size=64, head_dim=8)
    >>> cfg = DFlashTrainConfig(steps=1, max_tokens=64, max_len=64, block_size=4,
    ...                         num_anchors=8, draft_layers=1, device="cpu")
    >>> est = estimate_step(t, cfg)
    >>> est.slots, est.peak > est.parts["weights"] > est.target_weights > 0
    (240, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lengthwise.dflash.cost.device_memory import GIB, fits_line
from lengthwise.dflash.cost.target_config import check_layers
from lengthwise.dflash.cost.trace import (
    LiveBytes,
    fake_causal_lm,
    fake_draft,
    few_head_chunks,
    kernels,
    storage_bytes,
    weight_bytes,
)
from lengthwise.errors import ConfigError

__all__ = ["MAX_STEP_SIZE", "StepMemory", "estimate_step", "step_blocks", "step_shape"]

#: the parts of a peak, in the order they are printed
PARTS = ("weights", "optimizer", "gradients", "ddp_buckets", "activations", "logits_chunk")
#: the most tokens, and draft slots, of the micro-batch traced: the target's causal mask
#: (and on CPU the draft's dense one) must have a size torch can count
MAX_STEP_SIZE = 10**9
#: trace the target at a shallow depth and add the bytes of the other layers (the same
#: figures, in a fraction of the time: tests compare it with the trace at full depth)
SHALLOW_TARGET = True


@dataclass
class StepMemory:
    """The predicted peak of one training step and what it is made of (bytes)."""

    peak: int
    parts: dict[str, int]
    slots: int
    supervised: int
    tokens: int
    device: str
    target_weights: int  # the target's share of parts["weights"] (the rest is the draft's)
    logits_high: int = 0  # the most bytes of LM-head chunk buffers alive at once in the step
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def step_peak(self) -> int:
        """What the step adds at its peak to the memory held before it (weights, state)."""
        return self.peak - self.parts["weights"] - self.parts["optimizer"] - self.parts.get(
            "ddp_buckets", 0)

    def fits(self, device_bytes: int, *, reserve: int = GIB) -> bool:
        """Whether the peak plus ``reserve`` (CUDA context, workspaces) fits ``device_bytes``."""
        return self.peak + reserve <= device_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain data (bytes and GiB)."""
        return {"peak_bytes": self.peak, "peak_gib": self.peak / GIB,
                "parts_gib": {k: v / GIB for k, v in self.parts.items()},
                "logits_chunk_high_gib": self.logits_high / GIB, "slots": self.slots,
                "supervised": self.supervised, "tokens": self.tokens,
                "device": self.device, "settings": self.settings}

    def render(self, device_bytes: int | None = None, *, reserve: int = GIB) -> str:
        """A few lines: the peak, its parts and, with ``device_bytes``, whether it fits."""
        s = self.settings
        what = ("predicted peak per GPU" if self.device == "cuda" else
                "predicted peak of the training step's tensors (the weights, optimizer "
                "state and step; not the whole process)")
        lines = [f"{what}: {self.peak / GIB:.1f} GiB ({self.device}; "
                 f"{self.tokens} tokens, {self.slots} draft slots, {self.supervised} supervised;"
                 f" head chunk {s.get('head_chunk')}, {s.get('dtype')})"]
        if s.get("features_cached"):
            lines.append(f"  no target forward: the features are read from the cache (the "
                         f"micro-batch's, {s['features_cached'] / GIB:.2f} GiB, are in "
                         "activations; the target's weights stay for its embedding and LM head)")
        lines += [f"  {name:<13} {self.parts[name] / GIB:8.2f} GiB" for name in PARTS
                  if name in self.parts]
        lines[-1] += f" at the peak; {self.logits_high / GIB:.2f} GiB at most during the step"
        if device_bytes is not None:
            lines.append(fits_line(self.peak, device_bytes, reserve=reserve))
        return "\n".join(lines)


def step_blocks(rows: int, tokens: int, anchors: int, block_size: int, vocab: int) -> Any:
    """A micro-batch of ``rows x tokens // rows`` tokens, ``anchors`` blocks per row spread
    evenly (one sample per row), every block slot but the anchor supervised.

    >>> step_blocks(2, 64, 3, 4, 10).labels.shape
    torch.Size([2, 3, 4])
    """
    from lengthwise.dflash.blocks import Blocks
    from lengthwise.dflash.objective import IGNORE

    cols = tokens // rows
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, cols), generator=gen)
    anchor = torch.linspace(1, cols - block_size, anchors).long().expand(rows, anchors)
    labels = torch.randint(0, vocab, (rows, anchors, block_size), generator=gen)
    labels[:, :, 0] = IGNORE
    return Blocks(input_ids=ids, position_ids=torch.arange(cols).expand(rows, cols).contiguous(),
                  attention_mask=None, anchors=anchor.contiguous(),
                  starts=torch.zeros_like(anchor), labels=labels,
                  weights=(labels != IGNORE).float(),
                  sample_ids=torch.arange(rows).unsqueeze(1).expand(rows, anchors).contiguous(),
                  packed=False, meta={})


def step_shape(cfg: Any, rows: int = 1) -> tuple[int, int]:
    """``(tokens, anchors per row)`` of the worst micro-batch of ``cfg`` in ``rows`` rows.

    >>> from lengthwise.dflash.train_config import DFlashTrainConfig
    >>> step_shape(DFlashTrainConfig(max_tokens=1024, max_slots=2048, block_size=8), rows=2)
    (1024, 128)
    """
    if rows < 1 or cfg.max_tokens < rows * (cfg.block_size + 1):
        raise ConfigError(f"rows={rows}: a micro-batch of max_tokens={cfg.max_tokens} tokens "
                          f"cannot hold {rows} rows of a block of {cfg.block_size} each")
    if cfg.max_tokens > MAX_STEP_SIZE:
        raise ConfigError(f"max_tokens {cfg.max_tokens:,} is more tokens than the estimate "
                          f"traces (at most {MAX_STEP_SIZE:,})")
    cols = cfg.max_tokens // rows
    per_row = max(1, min(cfg.slot_budget // cfg.block_size // rows, cols - cfg.block_size))
    if rows * per_row * cfg.block_size > MAX_STEP_SIZE:
        given = (f"max_slots {cfg.max_slots:,}" if cfg.max_slots else
                 f"block_size {cfg.block_size} x max_tokens {cfg.max_tokens:,} (no max_slots)")
        raise ConfigError(f"{given}: {rows * per_row * cfg.block_size:,} draft slots are more "
                          f"than the estimate traces (at most {MAX_STEP_SIZE:,}; give "
                          "max_slots)")
    return cols * rows, per_row


def _train_step(draft: Any, target: Any, optimizer: Any, blocks: list[Any], *, cfg: Any,
                amp: Any, flex: bool, live: LiveBytes) -> set[int]:
    """One optimizer step over ``blocks`` as the training loop runs it; the gradients' serials.

    A micro-batch with ``features`` (a feature cache's) brings them to the device: a copy.
    """
    from lengthwise.dflash.loss import block_hidden, supervised_cross_entropy

    for b in blocks:
        r, a, k = b.labels.shape
        idx = torch.arange(r * a * k).view(r * a, k)[:, 1:].reshape(-1)
        hidden = block_hidden(draft, target, b, amp=amp, flex=flex,
                              feats=None if b.features is None else b.features.clone())
        weighted, _, _ = supervised_cross_entropy(
            hidden, target.lm_head, b.labels.reshape(-1), b.weights.reshape(-1).float(), idx,
            chunk=cfg.head_chunk, amp=amp)
        (weighted * (1.0 / max(1, idx.numel()))).backward()
        del hidden, weighted
    keys = live.serials(p.grad for p in draft.parameters() if p.grad is not None)
    torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return keys


class _TargetForwards:
    """The peak inside each of the step's target forwards, and what was live then; with the
    target traced at a shallow depth, :meth:`extend_to` adds the missing layers' bytes."""

    def __init__(self, target: Any, live: LiveBytes) -> None:
        self.target, self.live = target, live
        self.peaks: list[tuple[int, dict[int, tuple[int, str]]]] = []

    def __enter__(self) -> _TargetForwards:
        own, live = self.target.features, self.live

        def features(*args: Any, **kwargs: Any) -> Any:
            peak, at = live.peak, live.at_peak
            live.restart()
            try:
                return own(*args, **kwargs)
            finally:
                self.peaks.append((live.peak, live.at_peak))
                if peak >= live.peak:
                    live.peak, live.at_peak = peak, at

        self.target.features = features
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.target.features  # the class's method again

    def extend_to(self, extra: int) -> None:
        """Each forward ``extra`` bytes larger at its peak (the layers not traced)."""
        for peak, at in self.peaks:
            if peak + extra > self.live.peak:
                self.live.peak = peak + extra
                self.live.at_peak = {**at, -1: (extra, "activations")}


def _forward_peak(target: Any, blocks: Any) -> int:
    """The bytes the target's features of ``blocks`` hold at their peak."""
    live = LiveBytes(target.vocab_size)
    with live:
        feats = target.features(blocks.input_ids, attention_mask=blocks.attention_mask,
                                position_ids=blocks.position_ids)
        del feats
    return live.peak


def estimate_step(target_config: Any, cfg: Any, *, rows: int = 1, world: int = 1,
                  cached: bool = False) -> StepMemory:
    """The predicted peak of one training step of ``cfg`` (a ``DFlashTrainConfig``).

    ``cfg.device`` picks the kernels, ``cfg.dtype`` the autocast dtype (default bf16 on
    CUDA, none on CPU); ``rows``: rows of the micro-batch; ``world``: data-parallel ranks
    (DDP buckets); ``cached``: the features are read from a feature cache.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.target import Target
    from lengthwise.train.device import autocast_dtype

    if world < 1:
        raise ConfigError(f"world (data-parallel ranks) must be >= 1, got {world}")
    check_layers("draft_layers", cfg.draft_layers)
    cuda = str(cfg.device).startswith("cuda")
    amp = autocast_dtype(cfg.dtype, "cuda" if cuda else "cpu")
    tokens, per_row = step_shape(cfg, rows)
    vocab, depth = int(target_config.vocab_size), int(target_config.num_hidden_layers)
    check_layers("num_hidden_layers", depth)
    layers = target_layer_ids(depth, cfg.num_features or cfg.draft_layers)
    # the draft reads len(layers) features whatever their ids, and from the second layer
    # on every layer adds the same weights and the same bytes to its forward's peak
    small = max(2, len(layers) + 1)
    shallow = SHALLOW_TARGET and small + 1 < depth
    dtype = torch.bfloat16 if cuda else torch.float32
    with FakeTensorMode(), kernels("cuda" if cuda else "cpu"), few_head_chunks():
        model = fake_causal_lm(target_config, small if shallow else depth, dtype)
        target = Target(model, layers=list(range(len(layers))) if shallow else layers)
        draft = fake_draft(target_config, cfg, layers)
        params = [p for p in draft.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                                      fused=True if cuda else None)
        for p in params:  # the optimizer's state, as after a first step
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        target_weights = weight_bytes(model)
        state = storage_bytes([v for s in optimizer.state.values() for v in s.values()
                               if isinstance(v, torch.Tensor)])
        micro = [step_blocks(rows, tokens, per_row, cfg.block_size, vocab)
                 for _ in range(min(cfg.grad_accum, 2))]
        for b in micro if cached else ():  # the cache's rows, in the target's dtype
            b.features = torch.zeros(rows, tokens // rows,
                                     len(layers) * int(target_config.hidden_size), dtype=dtype)
        cached_bytes = storage_bytes([micro[0].features]) if cached else 0
        live = LiveBytes(vocab)
        calls = _TargetForwards(target, live)
        with live, calls:
            grads = _train_step(draft, target, optimizer, micro, cfg=cfg, amp=amp, flex=cuda,
                                live=live)
        if shallow:
            deeper = fake_causal_lm(target_config, small + 1, dtype)
            target_weights += (depth - small) * (weight_bytes(deeper) - weight_bytes(model))
            if not cached:
                calls.extend_to((depth - small) * (
                    _forward_peak(Target(deeper, layers=target.layers), micro[0])
                    - _forward_peak(target, micro[0])))
    parts = {"weights": target_weights + weight_bytes(draft), "optimizer": state,
             "gradients": 0, "activations": 0, "logits_chunk": 0}
    for key, (size, kind) in live.at_peak.items():
        parts["gradients" if key in grads else kind] += size
    if world > 1:
        parts["ddp_buckets"] = storage_bytes(params)
    slots = rows * per_row * cfg.block_size
    settings = {"max_tokens": cfg.max_tokens, "rows": rows, "block_size": cfg.block_size,
                "num_anchors": cfg.num_anchors, "max_slots": cfg.max_slots,
                "head_chunk": cfg.head_chunk, "grad_accum": cfg.grad_accum,
                "draft_layers": cfg.draft_layers, "target_layers": layers,
                "dtype": str(amp or "fp32").replace("torch.", ""), "world": world,
                "gradient_checkpointing": False, "features_cached": cached_bytes}
    return StepMemory(peak=sum(parts.values()), parts=parts, slots=slots,
                      supervised=slots - rows * per_row, tokens=tokens,
                      device="cuda" if cuda else "cpu", target_weights=target_weights,
                      logits_high=live.logits_peak, settings=settings)
