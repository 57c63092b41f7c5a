"""Peak memory of a DFlash training step, predicted before launch from the target's config.

:func:`estimate_step` reads nothing but a target config (``config.json``): it
builds the target and the draft under fake tensors (shapes and dtypes, no
storage), then runs one training step of the run's settings through the real
code (:func:`~lengthwise.dflash.loss.block_hidden`, the chunked LM head and
cross-entropy, ``backward``, gradient clipping, AdamW, ``zero_grad``) while a
dispatch mode records every tensor storage an operation creates and when it is
freed. The peak of the live bytes, plus the weights and optimizer state that
exist before the step, is the predicted peak of ``torch.cuda.max_memory_allocated``
on one GPU. A first step runs untraced, so the traced one has the optimizer's
state (the steady state); with ``grad_accum > 1`` the traced step holds two
micro-batches, the second running with the first one's gradients alive.

The micro-batch is the worst case of the settings: ``rows`` rows (default 1) of
``max_tokens`` tokens in all, with the slot budget filled (``max_slots`` slots,
or ``block_size`` per token), every block slot but the anchor supervised. With
``cached=True`` (``dflash train --features``) the step runs no target forward: the
micro-batch brings the target's features, read from the cache, as ``dflash train``
moves them to the device; the target's weights, embedding and LM head are still held.

What the trace cannot run is stood in for, by kind of device:

- ``cuda``: the target in bf16 with fused attention (the score matrix is never
  held: a fused kernel keeps its inputs, output and log-sum-exp), the draft in
  fp32 under bf16 autocast, attending under the block-sparse flex mask (also a
  fused kernel; the block mask itself is a few MiB and is left out), fused AdamW.
- ``cpu``: the kernels torch picks on CPU (the draft's dense mask), what
  :mod:`tests.dflash` compares with the resident memory of a real step.

The target is built at a shallow depth (the layers feeding the draft, plus one, and at
least two) and the bytes of its other layers added: their weights, and at each target
forward's peak what they add to it (traced once at one layer more), which makes that
forward the step's peak where it is larger. The figures are those of the trace at full
depth (tested), in a fraction of its time; :data:`SHALLOW_TARGET` turns it off.

Outside the trace: the CUDA context and library workspaces, and the caching
allocator's fragmentation (``torch.cuda.memory_reserved`` minus allocated).
With ``world > 1`` DDP holds its gradient buckets, a copy of the gradients
(``ddp_buckets``).

Example::

    >>> import transformers
    >>> from lengthwise.dflash.train_config import DFlashTrainConfig
    >>> t = transformers.Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=4,
    ...                              num_attention_heads=4, num_key_value_heads=2,
    ...                              intermediate_size=64, head_dim=8)
    >>> cfg = DFlashTrainConfig(steps=1, max_tokens=64, max_len=64, block_size=4,
    ...                         num_anchors=8, draft_layers=1, device="cpu")
    >>> est = estimate_step(t, cfg)
    >>> est.slots, est.peak > est.parts["weights"] > 0
    (240, True)
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lengthwise.errors import ConfigError

__all__ = ["DEVICE_MEMORY", "MAX_LAYERS", "MAX_STEP_SIZE", "MemoryEstimate", "check_target_fields",
           "estimate_step", "fits_line", "memory_size", "read_target_config", "step_blocks",
           "step_shape"]

GIB = 2**30
#: memory of named devices as ``nvidia-smi`` reports it (MiB)
DEVICE_MEMORY: dict[str, int] = {
    "h200": 143_771 * 2**20, "h100-80g": 81_559 * 2**20, "a100-80g": 81_920 * 2**20,
    "a100-40g": 40_960 * 2**20, "l40s": 46_068 * 2**20,
}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
#: the parts of a peak, in the order they are printed
PARTS = ("weights", "optimizer", "gradients", "ddp_buckets", "activations", "logits_chunk")


def memory_size(text: str) -> int:
    """Bytes of a size such as ``141GiB``, ``80GB`` or ``h200`` (a :data:`DEVICE_MEMORY` name).

    Example::

        >>> memory_size("141GiB") == 141 * 2**30, memory_size("80 GB"), memory_size("h200")
        (True, 80000000000, 150754820096)
    """
    name = str(text).strip().lower()
    if name in DEVICE_MEMORY:
        return DEVICE_MEMORY[name]
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", name)
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"device memory {text!r}: give a size such as 141GiB or 80GB, or one "
                          f"of {', '.join(DEVICE_MEMORY)}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def read_target_config(path: str | Path) -> Any:
    """The ``transformers`` config of a target: its folder or its ``config.json``, nothing else."""
    import transformers

    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"--target {path}: no config.json there")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{file}: not a Hugging Face model config (no model_type)")
    from lengthwise.dflash.target import check_builtin_model

    check_builtin_model(path, data)
    from huggingface_hub.errors import StrictDataclassError

    known = transformers.CONFIG_MAPPING  # a lazy mapping: its get() finds nothing
    kind = known[str(data["model_type"])] if str(data["model_type"]) in known else None
    if kind is not None:
        check_target_fields(data, file, getattr(kind, "attribute_map", {}))
    try:
        config = transformers.AutoConfig.for_model(**data)
    except (ValueError, KeyError, TypeError, StrictDataclassError) as exc:
        raise ConfigError(f"{file}: {' '.join(str(exc).split())}") from None
    _check_heads(config, file)
    return config


#: the fields of a target config the estimate reads: required, and optional (absent or null)
TARGET_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "vocab_size")
OPTIONAL_TARGET_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
#: the most decoder layers (the target's, the draft's) the estimate traces: each costs the trace
#: tens of milliseconds, and the deepest open models have fewer than 128
MAX_LAYERS = 256
#: the most tokens, and draft slots, of the micro-batch the estimate traces: the target's
#: ``tokens x tokens`` causal mask (and on CPU the draft's ``slots x (tokens + slots)`` one)
#: must have a size torch can count
MAX_STEP_SIZE = 10**9
#: trace the target at a shallow depth and add the bytes of the other layers (the same
#: figures, in a fraction of the time: tests compare it with the trace at full depth)
SHALLOW_TARGET = True


def check_target_fields(data: dict[str, Any], file: Path | str,
                        names: dict[str, str] | None = None) -> None:
    """Refuse a ``config.json`` (``data``) whose fields the estimate reads cannot be used.

    Each of :data:`TARGET_FIELDS` must be there (``transformers``' default would stand in
    for the target's own size) and, like those of :data:`OPTIONAL_TARGET_FIELDS` that are
    not null, be an integer >= 1; ``names`` maps a field to the model's own key
    (``attribute_map``: ``n_embd`` for ``hidden_size``). Raises a :class:`ConfigError`
    naming ``file`` and the key.

    Example::

        >>> check_target_fields({"hidden_size": 32, "num_hidden_layers": 2,
        ...     "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 0}, "c.json")
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: c.json: vocab_size must be an integer >= 1, got 0
    """
    names = names or {}
    for name in (*TARGET_FIELDS, *OPTIONAL_TARGET_FIELDS):
        key = names.get(name, name)
        value = data.get(key)
        if value is None:
            if name in TARGET_FIELDS:
                raise ConfigError(f"{file}: no {key}: the estimate needs the target's own value "
                                  "(there is no default for it)")
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{file}: {key} must be an integer >= 1, got {value!r}")
    key = names.get("num_hidden_layers", "num_hidden_layers")
    _check_layers(f"{file}: {key}", data[key])


def _check_heads(config: Any, file: Path | str) -> None:
    """Refuse heads that do not split the width (no ``head_dim``) or the key-value heads."""
    heads, width = config.num_attention_heads, config.hidden_size
    if getattr(config, "head_dim", None) is None and width % heads:
        raise ConfigError(f"{file}: hidden_size {width} is not a multiple of "
                          f"num_attention_heads {heads} and there is no head_dim")
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv:
        raise ConfigError(f"{file}: num_attention_heads {heads} is not a multiple of "
                          f"num_key_value_heads {kv}")


def _check_layers(what: str, layers: int) -> None:
    if layers > MAX_LAYERS:
        raise ConfigError(f"{what} {layers:,} is more layers than the estimate traces (at most "
                          f"{MAX_LAYERS})")


@dataclass
class MemoryEstimate:
    """The predicted peak of one training step and what it is made of (bytes)."""

    peak: int
    parts: dict[str, int]
    slots: int
    supervised: int
    tokens: int
    device: str
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
        for name in PARTS:
            if name in self.parts:
                lines.append(f"  {name:<13} {self.parts[name] / GIB:8.2f} GiB")
        lines[-1] += f" at the peak; {self.logits_high / GIB:.2f} GiB at most during the step"
        if device_bytes is not None:
            lines.append(fits_line(self.peak, device_bytes, reserve=reserve))
        return "\n".join(lines)


def fits_line(peak: int, device_bytes: int, *, reserve: int = GIB) -> str:
    """Whether a ``peak`` of bytes fits ``device_bytes`` with ``reserve`` set aside (the CUDA
    context's; 0 on CPU), in one line.

    Example::

        >>> fits_line(3 * GIB, 8 * GIB)
        'fits in 8.0 GiB (with 1.0 GiB for the CUDA context): +4.0 GiB to spare'
        >>> fits_line(3 * GIB, 2 * GIB, reserve=0)
        'does NOT fit in 2.0 GiB: -1.0 GiB to spare'
    """
    left = device_bytes - reserve - peak
    verdict = "fits" if left >= 0 else "does NOT fit"
    context = f" (with {reserve / GIB:.1f} GiB for the CUDA context)" if reserve else ""
    return f"{verdict} in {device_bytes / GIB:.1f} GiB{context}: {left / GIB:+.1f} GiB to spare"


class _Tracker(TorchDispatchMode):
    """Live bytes of the storages operations create, their peak, and what was live then."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.live: dict[int, tuple[Any, int, str, int]] = {}
        self.made = 0
        self.now = 0
        self.peak = 0
        self.logits_now = 0
        self.logits_peak = 0
        self.at_peak: dict[int, tuple[int, str]] = {}

    def _sweep(self) -> None:
        dead = [k for k, (ref, *_) in self.live.items() if ref.expired()]
        for k in dead:
            _, size, kind, _ = self.live.pop(k)
            self.now -= size
            if kind == "logits_chunk":
                self.logits_now -= size

    def serials(self, tensors: Any) -> set[int]:
        """The serials of the live storages of ``tensors``."""
        keys = {t.untyped_storage()._cdata for t in tensors}
        return {self.live[k][3] for k in keys if k in self.live}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None,
                           ) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef

        out = func(*args, **(kwargs or {}))
        self._sweep()
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        grew = False
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            key = s._cdata
            if key in self.live or key in inputs:
                continue  # a view or an in-place result
            kind = "logits_chunk" if t.ndim and t.shape[-1] == self.vocab else "activations"
            self.made += 1  # a freed storage's key may come back: the serial tells them apart
            self.live[key] = (StorageWeakRef(s), s.nbytes(), kind, self.made)
            self.now += s.nbytes()
            if kind == "logits_chunk":
                self.logits_now += s.nbytes()
                self.logits_peak = max(self.logits_peak, self.logits_now)
            grew = True
        if grew and self.now > self.peak:
            self.peak = self.now
            self.at_peak = {n: (b, kind) for _, b, kind, n in self.live.values()}
        return out


class _FusedAttention(torch.autograd.Function):
    """The memory of a fused attention kernel: inputs, output and log-sum-exp, no scores."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        delta = torch.empty_like(lse)  # rowsum(grad * out), as fused backward kernels keep
        del delta
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fused_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                *args: Any, **kwargs: Any) -> torch.Tensor:
    return _FusedAttention.apply(query, key, value)


def _fused_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any,
                ) -> torch.Tensor:
    return _FusedAttention.apply(q, k, v)


@contextlib.contextmanager
def _fused_kernels() -> Iterator[None]:
    """Fused attention for the target (SDPA) and the draft (flex), as on CUDA.

    The functions are swapped in their modules for the trace (one thread) and put back.
    """
    import lengthwise.dflash.attention as attention
    import lengthwise.dflash.loss as loss

    saved = (torch.nn.functional.scaled_dot_product_attention, attention.flex_attend,
             loss.block_flex_mask)
    torch.nn.functional.scaled_dot_product_attention = _fused_sdpa
    attention.flex_attend = _fused_flex
    loss.block_flex_mask = lambda *a, **k: object()  # the block-sparse mask: a few MiB
    try:
        yield
    finally:
        (torch.nn.functional.scaled_dot_product_attention, attention.flex_attend,
         loss.block_flex_mask) = saved


def _chunks_kept(n: int, chunk: int) -> list[int]:
    """The first two and the last of the LM head's chunk starts over ``n`` slots."""
    starts = range(0, n, chunk)  # head.chunk_starts, which this stands in for
    return list(starts) if len(starts) <= 3 else [starts[0], starts[1], starts[-1]]


@contextlib.contextmanager
def _few_head_chunks() -> Iterator[None]:
    """The LM head runs its first two chunks and its last one, for the trace.

    Each chunk allocates the same buffers and frees them before the next one, into
    outputs made once for all slots, so the chunks in between hold nothing the kept
    ones do not: the peak is that of every chunk, traced in a time that does not grow
    with the slots (a million chunks at ``max_tokens`` 10**9).
    """
    import lengthwise.dflash.head as head

    saved = head.chunk_starts
    head.chunk_starts = _chunks_kept
    try:
        yield
    finally:
        head.chunk_starts = saved


def step_blocks(rows: int, tokens: int, anchors: int, block_size: int, vocab: int) -> Any:
    """A micro-batch of ``rows x tokens // rows`` tokens, ``anchors`` blocks per row.

    Anchors are spread evenly over each row (one sample per row); every block slot but
    the anchor is supervised. Values are arbitrary; the shapes are the run's.
    """
    from lengthwise.dflash.blocks import Blocks
    from lengthwise.dflash.objective import IGNORE

    cols = tokens // rows
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, cols), generator=gen)
    positions = torch.arange(cols).expand(rows, cols).contiguous()
    anchor = torch.linspace(1, cols - block_size, anchors).long().expand(rows, anchors)
    labels = torch.randint(0, vocab, (rows, anchors, block_size), generator=gen)
    labels[:, :, 0] = IGNORE
    weights = (labels != IGNORE).float()
    return Blocks(input_ids=ids, position_ids=positions, attention_mask=None,
                  anchors=anchor.contiguous(), starts=torch.zeros_like(anchor),
                  labels=labels, weights=weights,
                  sample_ids=torch.arange(rows).unsqueeze(1).expand(rows, anchors).contiguous(),
                  packed=False, meta={})


def step_shape(cfg: Any, rows: int = 1) -> tuple[int, int]:
    """``(tokens, anchors per row)`` of the worst micro-batch of ``cfg`` in ``rows`` rows."""
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


def _train_step(draft: Any, target: Any, optimizer: Any, blocks: list[Any], *, chunk: int,
                amp: Any, flex: bool, clip: float, tracker: _Tracker) -> set[int]:
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
            chunk=chunk, amp=amp)
        (weighted * (1.0 / max(1, idx.numel()))).backward()
        del hidden, weighted
    keys = tracker.serials(p.grad for p in draft.parameters() if p.grad is not None)
    torch.nn.utils.clip_grad_norm_(draft.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return keys


def _with_layers(config: Any, layers: int) -> Any:
    """``config`` with ``layers`` decoder layers (a per-layer ``layer_types`` cut to them)."""
    import copy

    out = copy.deepcopy(config)
    out.num_hidden_layers = layers
    kinds = getattr(out, "layer_types", None)
    if isinstance(kinds, list) and kinds:
        out.layer_types = (kinds * layers)[:layers]
    return out


def _forward_peak(target: Any, blocks: Any) -> int:
    """The bytes the target's features of ``blocks`` hold at their peak (a fresh tracker)."""
    tracker = _Tracker(target.vocab_size)
    with tracker:
        feats = target.features(blocks.input_ids, attention_mask=blocks.attention_mask,
                                position_ids=blocks.position_ids)
        del feats
    return tracker.peak


class _TargetForwards:
    """The peak inside each of the step's target forwards, and what was live then.

    With the target traced at a shallow depth, :meth:`extend_to` adds to each forward's
    peak the bytes the missing layers add, and makes it the step's peak where it is more.
    """

    def __init__(self, target: Any, tracker: _Tracker) -> None:
        self.target, self.tracker = target, tracker
        self.peaks: list[tuple[int, dict[int, tuple[int, str]]]] = []

    def __enter__(self) -> _TargetForwards:
        own = self.target.features
        tracker = self.tracker

        def features(*args: Any, **kwargs: Any) -> Any:
            peak, at = tracker.peak, tracker.at_peak
            tracker._sweep()
            tracker.peak = tracker.now
            tracker.at_peak = {n: (b, kind) for _, b, kind, n in tracker.live.values()}
            try:
                return own(*args, **kwargs)
            finally:
                self.peaks.append((tracker.peak, tracker.at_peak))
                if peak >= tracker.peak:
                    tracker.peak, tracker.at_peak = peak, at

        self.target.features = features
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.target.features  # the class's method again

    def extend_to(self, extra: int) -> None:
        """Each forward ``extra`` bytes larger at its peak (the layers not traced)."""
        for peak, at in self.peaks:
            if peak + extra > self.tracker.peak:
                self.tracker.peak = peak + extra
                self.tracker.at_peak = {**at, -1: (extra, "activations")}


def _bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def estimate_step(target_config: Any, cfg: Any, *, rows: int = 1, world: int = 1,
                  cached: bool = False) -> MemoryEstimate:
    """The predicted peak of one training step of ``cfg`` (a ``DFlashTrainConfig``).

    ``target_config``: the target's ``transformers`` config (:func:`read_target_config`);
    ``cfg.device`` picks the kernels (``cuda``: fused attention, bf16 target; ``cpu``: the
    CPU ones), ``cfg.dtype`` the autocast dtype (default bf16 on CUDA, none on CPU);
    ``rows``: rows of the micro-batch; ``world``: data-parallel ranks (DDP buckets);
    ``cached``: the features are read from a feature cache (no target forward).
    """
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.model import DFlashConfig, DFlashDraft
    from lengthwise.dflash.target import Target
    from lengthwise.train.device import autocast_dtype

    if world < 1:
        raise ConfigError(f"world (data-parallel ranks) must be >= 1, got {world}")
    _check_layers("draft_layers", cfg.draft_layers)
    cuda = str(cfg.device).startswith("cuda")
    amp = autocast_dtype(cfg.dtype, "cuda" if cuda else "cpu")
    tokens, per_row = step_shape(cfg, rows)
    vocab = int(target_config.vocab_size)
    n_layers = int(target_config.num_hidden_layers)
    _check_layers("num_hidden_layers", n_layers)
    from lengthwise.dflash.objective import target_layer_ids

    layers = target_layer_ids(n_layers, cfg.num_features or cfg.draft_layers)
    kernels = _fused_kernels() if cuda else contextlib.nullcontext()
    # the target is traced at a shallow depth and its per-layer bytes extrapolated: the
    # draft reads len(layers) features whatever their ids, and from the second layer on
    # every layer adds the same weights and the same bytes to its forward's peak
    small = max(2, len(layers) + 1)
    shallow = SHALLOW_TARGET and small + 1 < n_layers
    dtype = torch.bfloat16 if cuda else torch.float32
    with FakeTensorMode(), kernels, _few_head_chunks():
        model = transformers.AutoModelForCausalLM.from_config(
            _with_layers(target_config, small) if shallow else target_config, dtype=dtype)
        target = Target(model, layers=list(range(len(layers))) if shallow else layers)
        draft = DFlashDraft(DFlashConfig.from_target(
            target_config, num_layers=cfg.draft_layers, block_size=cfg.block_size,
            gamma=cfg.gamma, target_layers=layers, mask_token_id=vocab - 1)).train()
        params = [p for p in draft.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                                      fused=True if cuda else None)
        for p in params:  # the optimizer's state, as after a first step
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        weights = _bytes([*model.parameters(), *model.buffers(), *draft.parameters(),
                          *draft.buffers()])
        state = _bytes([v for s in optimizer.state.values() for v in s.values()
                        if isinstance(v, torch.Tensor)])
        micro = [step_blocks(rows, tokens, per_row, cfg.block_size, vocab)
                 for _ in range(min(cfg.grad_accum, 2))]
        for b in micro if cached else ():  # the cache's rows, in the target's dtype
            b.features = torch.zeros(rows, tokens // rows,
                                     len(layers) * int(target_config.hidden_size), dtype=dtype)
        cached_bytes = _bytes([micro[0].features]) if cached else 0
        tracker = _Tracker(vocab)
        calls = _TargetForwards(target, tracker)
        with tracker, calls:
            grads = _train_step(draft, target, optimizer, micro, chunk=cfg.head_chunk,
                                amp=amp, flex=cuda, clip=cfg.clip, tracker=tracker)
        if shallow:
            deeper = transformers.AutoModelForCausalLM.from_config(
                _with_layers(target_config, small + 1), dtype=dtype)
            layer_bytes = _bytes([*deeper.parameters(), *deeper.buffers()]) - _bytes(
                [*model.parameters(), *model.buffers()])
            weights += (n_layers - small) * layer_bytes
            if not cached:
                grow = (n_layers - small) * (
                    _forward_peak(Target(deeper, layers=target.layers), micro[0])
                    - _forward_peak(target, micro[0]))
                calls.extend_to(grow)
    parts = {"weights": weights, "optimizer": state, "gradients": 0, "activations": 0,
             "logits_chunk": 0}
    for key, (size, kind) in tracker.at_peak.items():
        parts["gradients" if key in grads else kind] += size
    if world > 1:
        parts["ddp_buckets"] = _bytes(params)
    slots = rows * per_row * cfg.block_size
    settings = {"max_tokens": cfg.max_tokens, "rows": rows, "block_size": cfg.block_size,
                "num_anchors": cfg.num_anchors, "max_slots": cfg.max_slots,
                "head_chunk": cfg.head_chunk, "grad_accum": cfg.grad_accum,
                "draft_layers": cfg.draft_layers, "target_layers": layers,
                "dtype": str(amp or "fp32").replace("torch.", ""), "world": world,
                "gradient_checkpointing": False,
                "features_cached": cached_bytes}
    return MemoryEstimate(peak=sum(parts.values()), parts=parts, slots=slots,
                          supervised=slots - rows * per_row, tokens=tokens,
                          device="cuda" if cuda else "cpu", logits_high=tracker.logits_peak,
                          settings=settings)
