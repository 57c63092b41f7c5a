"""The peak memory of a DFlash stage before it runs, from the target's ``config.json`` alone.

The stages' own code runs on fake tensors (shapes, no storage) while :class:`LiveBytes`
records every storage an operation creates and frees (:func:`kernels`: CUDA's fused
attention; :func:`few_head_chunks`; :func:`per_layer`: a target traced at two shallow depths).
:func:`estimate_step` is a training step's peak, ``estimate_<stage>`` a whole stage's process:
on CPU its resident memory, on CUDA the memory allocated per GPU. See docs/dflash.md.

Example::

    >>> t = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4,
    ...                              num_attention_heads=4, intermediate_size=64)
    >>> est = estimate_regenerate(t, batch_size=2, max_len=32, max_new_tokens=8, device="cpu")
    >>> est.stage, est.peak == sum(est.parts.values()), est.parts["weights"] > 0
    ('regenerate', True, True)
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import lengthwise.dflash.head as head
import lengthwise.dflash.loss as loss
import lengthwise.dflash.model as draft_model
from lengthwise.dflash.blocks import Blocks
from lengthwise.dflash.features import cache_bytes, plan_pass
from lengthwise.dflash.head import chunked_agreement
from lengthwise.dflash.loss import block_hidden, supervised_cross_entropy
from lengthwise.dflash.mask_token import mask_token_choice
from lengthwise.dflash.model import DFlashConfig, DFlashDraft
from lengthwise.dflash.objective import IGNORE, target_layer_ids
from lengthwise.dflash.speculative import _cache_kwarg, _cache_of
from lengthwise.dflash.target import WEIGHT_DTYPES, Target, check_builtin_model
from lengthwise.dflash.teacher_forced import SLOTS_PER_FORWARD
from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_name
from lengthwise.train.device import autocast_dtype

__all__ = ["DEVICE_MEMORY", "GIB", "MAX_LAYERS", "MAX_STEP_SIZE", "STAGES", "LiveBytes",
           "StageMemory", "StepMemory", "estimate_eval", "estimate_features",
           "estimate_regenerate", "estimate_step", "estimate_train", "fits_line", "grown_rows",
           "memory_size", "read_target_config", "step_blocks", "step_shape"]

GIB = 2**30
#: memory of named devices as ``nvidia-smi`` reports it
DEVICE_MEMORY: dict[str, int] = {
    "h200": 143_771 * 2**20, "h100-80g": 81_559 * 2**20, "a100-80g": 81_920 * 2**20,
    "a100-40g": 40_960 * 2**20, "l40s": 46_068 * 2**20,
}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
#: the fields of a target config the estimates read: required, and optional (absent or null)
TARGET_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "vocab_size")
OPTIONAL_TARGET_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
#: the most decoder layers (the target's, the draft's) traced: each costs tens of milliseconds
MAX_LAYERS = 256
#: the most tokens, and draft slots, of the micro-batch traced: the target's causal mask
#: (and on CPU the draft's dense one) must have a size torch can count
MAX_STEP_SIZE = 10**9
#: trace the target at a shallow depth and add the other layers' bytes (tests compare it
#: with the trace at full depth)
SHALLOW_TARGET = True
#: the parts of a step's peak, in the order they are printed
PARTS = ("weights", "optimizer", "gradients", "ddp_buckets", "activations", "logits_chunk")
#: what each stage's estimate covers, as printed
COVERS = {
    "train": "loading the target (and growing and saving it for the mask token), then a "
             "training step at the worst micro-batch of the settings",
    "regenerate": "generate of --batch-size prompts of --max-len tokens: the prefill and "
                  "the last of --max-new-tokens decoding steps",
    "eval": "speculative decoding of --batch-size prompts of --max-len tokens (prefill, "
            "verification), and the teacher-forced accuracy pass on their outputs",
    "features": "the target's forward of the pass's largest batch (--max-tokens padded "
                "tokens, every layer's hidden states) and the features it returns",
}
STAGES = tuple(COVERS)


def memory_size(text: str) -> int:
    """Bytes of a size such as ``141GiB``, ``80GB`` or ``h200`` (a :data:`DEVICE_MEMORY` name).

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


def fits_line(peak: int, device_bytes: int, *, reserve: int = GIB) -> str:
    """Whether ``peak`` bytes fit ``device_bytes`` with ``reserve`` (the CUDA context's).

    >>> fits_line(3 * GIB, 2 * GIB, reserve=0)
    'does NOT fit in 2.0 GiB: -1.0 GiB to spare'
    """
    left = device_bytes - reserve - peak
    verdict = "fits" if left >= 0 else "does NOT fit"
    context = f" (with {reserve / GIB:.1f} GiB for the CUDA context)" if reserve else ""
    return f"{verdict} in {device_bytes / GIB:.1f} GiB{context}: {left / GIB:+.1f} GiB to spare"


def _count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def read_target_config(path: str | Path) -> Any:
    """The ``transformers`` config of a target: its folder or its ``config.json``, nothing else."""
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
    check_builtin_model(path, data)
    known = transformers.CONFIG_MAPPING  # a lazy mapping: its get() finds nothing
    if str(data["model_type"]) in known:
        check_target_fields(data, file, getattr(known[str(data["model_type"])],
                                                "attribute_map", {}))
    try:
        config = transformers.AutoConfig.for_model(**data)
    except (ValueError, KeyError, TypeError, StrictDataclassError) as exc:
        raise ConfigError(f"{file}: {' '.join(str(exc).split())}") from None
    heads, width = config.num_attention_heads, config.hidden_size
    if getattr(config, "head_dim", None) is None and width % heads:
        raise ConfigError(f"{file}: hidden_size {width} is not a multiple of "
                          f"num_attention_heads {heads} and there is no head_dim")
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv:
        raise ConfigError(f"{file}: num_attention_heads {heads} is not a multiple of "
                          f"num_key_value_heads {kv}")
    return config


def check_target_fields(data: dict[str, Any], file: Path | str,
                        names: dict[str, str] | None = None) -> None:
    """Refuse a ``config.json`` (``data``) without each of :data:`TARGET_FIELDS` or with one of
    them, or of the optional ones, not an integer >= 1 (``names``: its ``attribute_map``).

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
        if not _count(value):
            raise ConfigError(f"{file}: {key} must be an integer >= 1, got {value!r}")
    key = names.get("num_hidden_layers", "num_hidden_layers")
    check_layers(f"{file}: {key}", data[key])


def check_layers(what: str, layers: int) -> None:
    """Refuse more than :data:`MAX_LAYERS` layers."""
    if layers > MAX_LAYERS:
        raise ConfigError(f"{what} {layers:,} is more layers than the estimate traces (at most "
                          f"{MAX_LAYERS})")


class LiveBytes(TorchDispatchMode):
    """Live bytes of the storages operations create, their peak, and what was live then
    (``at_peak``: serial to ``(bytes, kind)``, a last dimension of ``vocab`` the
    ``logits_chunk`` kind, any other ``activations``)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.live: dict[int, tuple[Any, int, str, int]] = {}
        self.made = self.now = self.peak = self.logits_now = self.logits_peak = 0
        self.at_peak: dict[int, tuple[int, str]] = {}

    def sweep(self) -> None:
        """Forget the storages freed since the last operation."""
        for k in [k for k, (ref, *_) in self.live.items() if ref.expired()]:
            _, size, kind, _ = self.live.pop(k)
            self.now -= size
            self.logits_now -= size if kind == "logits_chunk" else 0

    def restart(self) -> None:
        """The peak from now on: what is live now, and what comes next."""
        self.sweep()
        self.peak = self.now
        self.at_peak = {n: (b, kind) for _, b, kind, n in self.live.values()}

    def serials(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        """The serials of the live storages of ``tensors``."""
        keys = {t.untyped_storage()._cdata for t in tensors}
        return {self.live[k][3] for k in keys if k in self.live}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None,
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.sweep()
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        grew = False
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            if s._cdata in self.live or s._cdata in inputs:
                continue  # a view or an in-place result
            kind = "logits_chunk" if t.ndim and t.shape[-1] == self.vocab else "activations"
            self.made += 1
            self.live[s._cdata] = (StorageWeakRef(s), s.nbytes(), kind, self.made)
            self.now += s.nbytes()
            if kind == "logits_chunk":
                self.logits_now += s.nbytes()
                self.logits_peak = max(self.logits_peak, self.logits_now)
            grew = True
        if grew and self.now > self.peak:
            self.peak = self.now
            self.at_peak = {n: (b, kind) for _, b, kind, n in self.live.values()}
        return out


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors``.

    >>> storage_bytes([torch.zeros(4), torch.zeros(2, dtype=torch.float16)])
    20
    """
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                for t in tensors}.values())


def weight_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers of ``modules``.

    >>> weight_bytes(torch.nn.Linear(4, 2))
    40
    """
    return storage_bytes([t for m in modules for t in (*m.parameters(), *m.buffers())])


class _FusedAttention(torch.autograd.Function):
    """The memory of a fused attention kernel: inputs, output and log-sum-exp, no scores."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1], dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, _, lse = ctx.saved_tensors
        del ctx, grad
        torch.empty_like(lse)  # rowsum(grad * out), as fused backward kernels keep
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@contextlib.contextmanager
def _swapped(*swaps: tuple[Any, str, Any]) -> Iterator[None]:
    """Each ``(owner, name, value)`` set while the block runs, then put back."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    for owner, name, value in swaps:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def kernels(kind: str) -> contextlib.AbstractContextManager[None]:
    """The attention kernels of device ``kind``: on CUDA fused ones for the target (SDPA) and
    the draft (flex), else the code's own."""
    if kind != "cuda":
        return contextlib.nullcontext()

    def fused(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        return _FusedAttention.apply(q, k, v)

    return _swapped((torch.nn.functional, "scaled_dot_product_attention", fused),
                    (draft_model, "flex_attend", fused),  # the name the draft calls
                    (loss, "block_flex_mask", lambda *a, **k: object()))


def _chunks_kept(n: int, chunk: int) -> list[int]:
    """The first two and the last of the LM head's chunk starts over ``n`` slots."""
    starts = range(0, n, chunk)  # head.chunk_starts, which this stands in for
    return list(starts) if len(starts) <= 3 else [starts[0], starts[1], starts[-1]]


def few_head_chunks() -> contextlib.AbstractContextManager[None]:
    """The LM head runs its first two chunks and its last one: each allocates and frees the
    same buffers, so the peak is every chunk's, in a time that does not grow with the slots."""
    return _swapped((head, "chunk_starts", _chunks_kept))


@contextlib.contextmanager
def _fake(kind: str) -> Iterator[None]:
    """Fake tensors, the kernels of ``kind``, no gradients."""
    with FakeTensorMode(), kernels(kind), torch.no_grad():
        yield


def with_layers(config: Any, layers: int, vocab: int | None = None) -> Any:
    """``config`` with ``layers`` decoder layers and ``vocab`` rows.

    >>> with_layers(transformers.LlamaConfig(), 2, vocab=10).num_hidden_layers
    2
    """
    out = copy.deepcopy(config)
    out.num_hidden_layers = layers
    kinds = getattr(out, "layer_types", None)
    if isinstance(kinds, list) and kinds:
        out.layer_types = (kinds * layers)[:layers]
    if vocab is not None:
        out.vocab_size = vocab
    return out


def fake_causal_lm(config: Any, layers: int, dtype: torch.dtype) -> Any:
    """The target's model at ``layers`` layers in ``dtype`` under fake tensors."""
    active = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    with contextlib.nullcontext() if active else FakeTensorMode():
        return transformers.AutoModelForCausalLM.from_config(with_layers(config, layers),
                                                             dtype=dtype).eval()


def fake_draft(target_config: Any, cfg: Any, layers: list[int]) -> Any:
    """The draft ``dflash train`` builds for ``cfg`` reading the target's ``layers``, in
    training mode; call it under fake tensors."""

    return DFlashDraft(DFlashConfig.from_target(
        target_config, num_layers=cfg.draft_layers, block_size=cfg.block_size, gamma=cfg.gamma,
        target_layers=layers, mask_token_id=int(target_config.vocab_size) - 1)).train()


def per_layer(trace: Callable[[int], dict[str, int]], depth: int, k: int) -> dict[str, int]:
    """``trace(n)``'s figures at ``depth`` layers from two shallow depths (over ``k``, and 2
    or more: the first layer frees the embedding's output; the full depth without
    :data:`SHALLOW_TARGET`).

    >>> t = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6,
    ...                              num_attention_heads=4, intermediate_size=64)
    >>> w = lambda n: {"w": weight_bytes(fake_causal_lm(t, n, torch.float32))}
    >>> per_layer(w, 6, 1) == w(6)
    True
    """
    lo_n = max(2, k + 1)
    if not SHALLOW_TARGET or depth <= lo_n + 1:
        return trace(depth)
    lo, hi = trace(lo_n), trace(lo_n + 1)
    return {name: lo[name] + (depth - lo_n) * (hi[name] - lo[name]) for name in lo}


def weight_dtype(name: Any, kind: str, config: Any) -> torch.dtype:
    """The weights' dtype a stage loads: ``name``, else float32 on CPU, the config's on CUDA.

    >>> weight_dtype(None, "cpu", None), weight_dtype("bfloat16", "cpu", None)
    (torch.float32, torch.bfloat16)
    """
    if name is not None:
        if str(name) not in WEIGHT_DTYPES:
            raise ConfigError(f"--dtype must be one of float32, bfloat16, float16, got {name!r}")
        return WEIGHT_DTYPES[str(name)]
    if kind != "cuda":
        return torch.float32
    return checkpoint_dtype(config) or torch.bfloat16


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype ``config.json`` gives the checkpoint's weights (``None``: not given)."""
    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, torch.dtype):
        return own
    return WEIGHT_DTYPES.get(str(own).removeprefix("torch.")) if own else None


def _gib(parts: dict[str, int]) -> dict[str, float]:
    return {k: v / GIB for k, v in parts.items()}


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
        return {"peak_bytes": self.peak, "peak_gib": self.peak / GIB,
                "parts_gib": _gib(self.parts),
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
    """A micro-batch of ``rows`` samples of ``tokens // rows``, ``anchors`` blocks each spread
    evenly, every block slot but the anchor supervised.

    >>> step_blocks(2, 64, 3, 4, 10).labels.shape
    torch.Size([2, 3, 4])
    """
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


def _supervised(blocks: Any) -> torch.Tensor:
    """The flat indices of :func:`step_blocks`' supervised slots: all but the anchors'."""
    r, a, b = blocks.labels.shape
    return torch.arange(r * a * b).view(r * a, b)[:, 1:].reshape(-1)


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
    """One optimizer step over ``blocks`` as the training loop runs it (cached ``features``
    brought to the device: a copy); the gradients' serials."""
    for b in blocks:
        idx = _supervised(b)
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
    """The peak inside each of the step's target forwards, and what was live then."""

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


def _peak(vocab: int, run: Callable[[LiveBytes], Any]) -> int:
    """The peak of the bytes ``run(live)`` makes (what it returns dropped)."""
    live = LiveBytes(vocab)
    with live:
        run(live)
    return live.peak


def _forward_peak(target: Any, blocks: Any) -> int:
    """The bytes the target's features of ``blocks`` hold at their peak."""
    return _peak(target.vocab_size, lambda live: target.features(
        blocks.input_ids, attention_mask=blocks.attention_mask, position_ids=blocks.position_ids))


def estimate_step(target_config: Any, cfg: Any, *, rows: int = 1, world: int = 1,
                  cached: bool = False) -> StepMemory:
    """The predicted peak (``torch.cuda.max_memory_allocated``) of a training step of ``cfg``
    (a ``DFlashTrainConfig``; two micro-batches with ``grad_accum > 1``) after a first one;
    ``world``: data-parallel ranks; ``cached``: features read from a feature cache.

    >>> from lengthwise.dflash.train_config import DFlashTrainConfig
    >>> t = transformers.Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=4,
    ...                              num_attention_heads=4, num_key_value_heads=2,
    ...                              intermediate_size=64, head_dim=8)
    >>> est = estimate_step(t, DFlashTrainConfig(steps=1, max_tokens=64, max_len=64,
    ...     block_size=4, num_anchors=8, draft_layers=1, device="cpu"))
    >>> est.slots, est.peak > est.parts["weights"] > est.target_weights > 0
    (240, True)
    """
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


@dataclass
class StageMemory:
    """The predicted peak of a stage's process (bytes), its parts and the phase it falls in."""

    stage: str
    device: str
    peak: int
    parts: dict[str, int]
    phase: str
    phases: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)
    step: Any = None  # train: the step's StepMemory

    @property
    def what(self) -> str:
        """What the figure is: resident memory of the process (CPU), or allocated per GPU."""
        if self.device == "cuda":
            return "predicted peak allocated memory per GPU (CUDA; outside it: the CUDA " \
                   "context, library workspaces and the caching allocator's reserve)"
        return "predicted peak resident memory of the process (CPU)"

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "device": self.device, "measure": self.what,
                "covers": COVERS[self.stage], "peak_bytes": self.peak,
                "peak_gib": self.peak / GIB, "phase": self.phase,
                "parts_gib": _gib(self.parts), "phases_gib": _gib(self.phases),
                "settings": self.settings}

    def render(self) -> str:
        """A few lines: what is predicted, the peak, the phase and the parts."""
        return "\n".join(
            [f"{self.what}: {self.peak / GIB:.2f} GiB ({self.stage}: {COVERS[self.stage]})",
             f"  the peak falls in: {self.phase}; phases: "
             + ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.phases.items()) + " GiB",
             *(f"  {name:<22} {size / GIB:8.2f} GiB" for name, size in self.parts.items())])


def grown_rows(tokenizer: Any, target_config: Any, generation_config: Any = None) -> int:
    """Rows of the target's embedding once ``dflash train`` adds the mask token (chosen on a
    stand-in of the target, as it chooses; ``<|MASK|>`` added to ``tokenizer`` if chosen)."""
    rows = int(target_config.vocab_size)
    model = SimpleNamespace(config=target_config, generation_config=generation_config,
                            get_input_embeddings=lambda: SimpleNamespace(
                                weight=SimpleNamespace(shape=(rows,))))
    return max(rows, mask_token_choice(tokenizer, model)[1] + 1)


def _loaded(target_config: Any, device: str, dtype: Any) -> tuple[str, torch.dtype, int]:
    """The kind of ``device``, the dtype of the weights a stage loads and the target's depth."""
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: the estimate knows cpu and cuda")
    return kind, weight_dtype(dtype, kind, target_config), int(target_config.num_hidden_layers)


def _check(**sizes: int | None) -> None:
    for name, value in sizes.items():
        if value is not None and not _count(value):
            raise ConfigError(f"{flag_name(name)} must be an integer >= 1, "
                              f"got {value!r}")


def _finish(stage: str, kind: str, baseline: int, held: dict[str, int],
            phases: dict[str, dict[str, int]], settings: dict[str, Any]) -> StageMemory:
    """The peak: the process (CPU), what is held, and the parts of the largest phase."""
    totals = {name: sum(p.values()) for name, p in phases.items()}
    top = max(totals, key=lambda n: totals[n])
    parts = ({"process": baseline} if kind == "cpu" else {}) | held | phases[top]
    before = sum(parts.values()) - totals[top]
    return StageMemory(stage=stage, device=kind, peak=sum(parts.values()), parts=parts,
                       phase=top, phases={n: before + t for n, t in totals.items()},
                       settings=settings)


def _batch(rows: int, cols: int, pad: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token ids of ``rows x cols`` and their mask: ``left`` or ``right`` padding in every row
    but the first, or none."""
    ids = torch.zeros(rows, cols, dtype=torch.long)
    if pad is None:
        return ids, None
    mask = torch.ones(rows, cols, dtype=torch.long)
    mask[1:, slice(None, cols // 2) if pad == "left" else slice(cols // 2, None)] = 0
    return ids, mask


def _cached_step(model: Any, live: LiveBytes, ids: torch.Tensor, mask: Any, cols: int, *,
                 keep_first: bool = False, **kwargs: Any) -> None:
    """A forward of ``model`` on ``ids[:, :cols]`` with the cache of ``ids`` held: the peak
    from the cache on (``keep_first``: the first forward's output held too, as generate's)."""

    res = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    live.restart()  # what the prefill freed on returning; the cache is held
    cache = _cache_of(res)
    if not keep_first:
        del res
    if mask is not None:
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], cols)], dim=1)
    res = model(input_ids=ids[:, :cols], attention_mask=mask, use_cache=True,
                **{_cache_kwarg(model): cache}, **kwargs)
    del res, cache


def _traced(config: Any, dtype: torch.dtype, kind: str, k: int,
            passes: Callable[[Any, Any], dict[str, int]]) -> dict[str, int]:
    """The weights and the peaks ``passes(model, target)`` traces of the target (reading ``k``
    feature layers) under fake tensors, at its depth from two shallow ones (:func:`per_layer`)."""
    def trace(n: int) -> dict[str, int]:
        with _fake(kind):
            model = fake_causal_lm(config, n, dtype)
            return {"weights": weight_bytes(model),
                    **passes(model, Target(model, layers=list(range(k))) if k else None)}

    return per_layer(trace, int(config.num_hidden_layers), k)


def estimate_regenerate(target_config: Any, *, batch_size: int = 32, max_len: int = 1024,
                        max_new_tokens: int = 512, device: str = "cpu", dtype: Any = None,
                        baseline: int = 0) -> StageMemory:
    """The peak of ``dflash prepare --regenerate``; ``baseline``: the process's own bytes."""
    _check(batch_size=batch_size, max_len=max_len, max_new_tokens=max_new_tokens)
    kind, dt, depth = _loaded(target_config, device, dtype)
    vocab = int(target_config.vocab_size)

    def generate(model: Any, _: Any) -> dict[str, int]:  # the prefill, the last decoding step
        ids, mask = _batch(batch_size, max_len, "left")
        prefill = _peak(vocab, lambda live: model(input_ids=ids, attention_mask=mask,
                                                  use_cache=True, logits_to_keep=1))
        ids, mask = _batch(batch_size, max_len + max_new_tokens - 1, "left")
        return {"prefill": prefill, "decode": _peak(vocab, lambda live: _cached_step(
            model, live, ids, mask, 1, keep_first=True, logits_to_keep=1))}

    fig = _traced(target_config, dt, kind, 0, generate)
    phases = {"prefill": {"prefill (KV cache, activations)": fig["prefill"]},
              "last decoding step": {"KV cache and the step": fig["decode"]}}
    settings = {"batch_size": batch_size, "max_len": max_len, "max_new_tokens": max_new_tokens,
                "dtype": str(dt).removeprefix("torch."), "target_layers": depth}
    return _finish("regenerate", kind, baseline, {"weights": fig["weights"]}, phases, settings)


def _features_peak(target: Any, rows: int, cols: int, pad: str | None = None,
                   ) -> tuple[int, int]:
    """``(held after, peak)`` of ``target.features_and_output`` on ``rows x cols`` tokens."""
    live = LiveBytes(target.vocab_size)
    with live:
        ids, mask = _batch(rows, cols, pad)
        feats, last = target.features_and_output(ids, attention_mask=mask)
        live.sweep()  # the hidden states of every layer, freed on returning
        held = live.now
        del feats, last
    return held, live.peak


def _eval_draft_trace(config: Any, dtype: torch.dtype, draft_cfg: Any, rows: int, text: int,
                      anchors: int, head_chunk: int, kind: str) -> dict[str, int]:
    """The draft's weights and one forward of the accuracy pass's slots, with the LM heads."""
    from lengthwise.dflash.model import DFlashDraft

    vocab, k = int(config.vocab_size), len(draft_cfg.target_layers)
    with _fake(kind), few_head_chunks():
        target = Target(fake_causal_lm(config, k, dtype), layers=list(range(k)))
        saved = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the draft's .to(dtype)
        try:
            draft = DFlashDraft(draft_cfg).eval()
        finally:
            torch.set_default_dtype(saved)
        blocks = step_blocks(rows, rows * text, anchors, draft_cfg.block_size, vocab)
        feats = torch.zeros(rows, text, k * int(config.hidden_size), dtype=dtype)
        last = torch.zeros(rows, text, int(config.hidden_size), dtype=dtype)
        idx = _supervised(blocks)
        head_w = target.lm_head.weight
        live = LiveBytes(vocab)
        with live:  # evaluate_blocks: head_loss, then slot_agreement, on the same slots
            hidden = block_hidden(draft, target, blocks, feats=feats, flex=kind == "cuda")
            loss = supervised_cross_entropy(hidden, target.lm_head, blocks.labels.reshape(-1),
                                            blocks.weights.reshape(-1).float(), idx,
                                            chunk=head_chunk)
            del loss
            pos = torch.zeros(idx.numel(), dtype=torch.long)
            agree = chunked_agreement(
                hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx).to(head_w.dtype),
                last.reshape(-1, last.shape[-1]).index_select(0, pos).to(head_w.dtype), head_w,
                None, temperature=1.0, chunk=head_chunk, dtype=head_w.dtype)
            del hidden, agree
    return {"draft": weight_bytes(draft), "slots": live.peak}


def estimate_eval(target_config: Any, *, block_size: int = 16, draft_layers: int = 5,
                  num_features: int | None = None, batch_size: int = 16, max_len: int = 1024,
                  max_new_tokens: int = 256, max_tokens: int = 16384,
                  max_slots: int = 32768, head_chunk: int = 1024, device: str = "cpu",
                  dtype: Any = None, baseline: int = 0) -> StageMemory:
    """The peak of ``dflash eval`` (the draft's sizes training's, the others eval's flags)."""
    from lengthwise.dflash.model import DFlashConfig

    _check(block_size=block_size, draft_layers=draft_layers, num_features=num_features,
           batch_size=batch_size, max_len=max_len, max_new_tokens=max_new_tokens,
           max_tokens=max_tokens, max_slots=max_slots, head_chunk=head_chunk)
    if block_size < 2:
        raise ConfigError(f"--block-size must be >= 2, got {block_size}")
    if max_slots < block_size:
        raise ConfigError(f"--max-slots {max_slots} holds no block of --block-size "
                          f"{block_size}")
    kind, dt, depth = _loaded(target_config, device, dtype)
    layers = target_layer_ids(depth, num_features or draft_layers)
    text = min(max_len + max_new_tokens, max_tokens)  # a prompt and its output, cut as eval does
    slots = min(max_slots, SLOTS_PER_FORWARD)
    text_rows = max(1, min(8, slots // block_size, max_tokens // text))
    # anchors: every position of an output (at most max_new_tokens), split into forwards
    per_row = max(1, min(max_new_tokens, text - 1, slots // (text_rows * block_size)))
    cache_cols = 2 * (max_len + max_new_tokens)  # compacted when dead columns match live ones
    vocab = int(target_config.vocab_size)

    def decode(model: Any, target: Any) -> dict[str, int]:
        """The decoding prefill, a verification, the accuracy pass's target forward."""
        ids, mask = _batch(batch_size, max_len, "left")

        def prefill(live: LiveBytes) -> torch.Tensor:  # speculative_batch's
            res = model(input_ids=ids, attention_mask=mask, use_cache=True,
                        output_hidden_states=True, logits_to_keep=1)
            return torch.cat([res.hidden_states[i + 1] for i in target.layers], dim=-1)

        out = {"prefill": _peak(vocab, prefill)}
        # a verification of a block with the cache at its most
        out["verify"] = _peak(vocab, lambda live: _cached_step(
            model, live, _batch(batch_size, cache_cols, None)[0], None, block_size,
            output_hidden_states=True))
        out["features_held"], out["features"] = _features_peak(target, text_rows, text)
        return out

    fig = _traced(target_config, dt, kind, len(layers), decode)
    draft_cfg = DFlashConfig.from_target(target_config, num_layers=draft_layers,
                                         block_size=block_size, target_layers=layers,
                                         mask_token_id=int(target_config.vocab_size) - 1)
    dfig = _eval_draft_trace(target_config, dt, draft_cfg, text_rows, text, per_row,
                             head_chunk, kind)
    phases = {"decoding prefill": {"prefill (KV cache, hidden states)": fig["prefill"]},
              "verification": {"KV cache and the verification": fig["verify"]},
              "accuracy pass": {"target features": fig["features_held"],
                                "draft forward and heads": dfig["slots"]}}
    if fig["features"] > fig["features_held"] + dfig["slots"]:
        phases["accuracy pass"] = {"target forward": fig["features"]}
    settings = {"batch_size": batch_size, "max_len": max_len, "max_new_tokens": max_new_tokens,
                "block_size": block_size, "draft_layers": draft_layers,
                "target_layers": layers, "max_tokens": max_tokens, "max_slots": max_slots,
                "accuracy_batch": [text_rows, text],
                "accuracy_slots": text_rows * per_row * block_size,
                "dtype": str(dt).removeprefix("torch.")}
    return _finish("eval", kind, baseline, {"weights": fig["weights"], "draft": dfig["draft"]},
                   phases, settings)


def estimate_features(target_config: Any, cfg: Any, *, stored: Any = None,
                      device: str = "cpu", baseline: int = 0) -> StageMemory:
    """The peak of ``dflash features`` with ``cfg`` (a ``FeaturesConfig``): of the pass's first
    and most padded batches of the ``stored`` tokens per sample, else rows of ``max_len``.

    >>> from lengthwise.dflash.features import FeaturesConfig
    >>> t = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4,
    ...                              num_attention_heads=4, intermediate_size=64)
    >>> est = estimate_features(t, FeaturesConfig(num_features=2, max_tokens=64))
    >>> est.settings["batch"], est.peak > est.parts["weights"] > 0
    ([1, 64], True)
    """
    kind, dt, depth = _loaded(target_config, device, cfg.target_dtype)
    layers = cfg.layer_list() or target_layer_ids(depth, cfg.num_features)
    if layers[-1] >= depth:
        raise ConfigError(f"--layers {cfg.layers}: the target has layers 0 to {depth - 1}")
    per = cache_bytes(1, len(layers), int(target_config.hidden_size), cfg.dtype, cfg.last_hidden)
    if stored is None:
        cols = min(cfg.max_len or cfg.max_tokens, cfg.max_tokens)
        shapes = {(max(1, cfg.max_tokens // cols), cols)}
        shard = cfg.shard_mib * 2**20
    else:
        plan = plan_pass(stored, max_tokens=cfg.max_tokens,
                         shard_tokens=max(1, cfg.shard_mib * 2**20 // per))
        shard = per * max(plan.shard_tokens(s) for s in range(plan.shards.size - 1))
        rows = np.diff(plan.batches)
        cols = stored[plan.order[plan.batches[:-1]]]  # longest first: a batch's first member
        shapes = {(int(rows[b]), int(cols[b])) for b in (0, int(np.argmax(rows * cols)))}
    figs = {(r, c): _traced(target_config, dt, kind, len(layers), lambda _, target, r=r, c=c: {
        "peak": _features_peak(target, r, c, "right" if r > 1 else None)[1]})
        for r, c in sorted(shapes)}
    (rows, cols), fig = max(figs.items(), key=lambda kv: kv[1]["peak"])
    settings = {"max_tokens": cfg.max_tokens, "max_len": cfg.max_len, "batch": [rows, cols],
                "target_layers": layers, "dtype": str(dt).removeprefix("torch."),
                "stored_dtype": cfg.dtype, "last_hidden": cfg.last_hidden}
    held = {"weights": fig["weights"]} | ({"shard being written": shard} if kind == "cpu" else {})
    return _finish("features", kind, baseline, held,
                   {"target forward": {"forward, hidden states": fig["peak"]}}, settings)


def estimate_train(target_config: Any, cfg: Any, *, rows: int = 1, world: int = 1,
                   grown: int | None = None, baseline: int = 0,
                   cached: bool = False) -> StageMemory:
    """The peak of ``dflash train`` for ``cfg``: loading the target (``grown``: its rows with
    the mask token, :func:`grown_rows`), then :func:`estimate_step`'s step."""
    kind = "cuda" if str(cfg.device).startswith("cuda") else "cpu"
    vocab = int(target_config.vocab_size)
    rows_after = max(vocab, grown or vocab)
    step = estimate_step(with_layers(target_config, int(target_config.num_hidden_layers),
                                     rows_after), cfg, rows=rows, world=world, cached=cached)
    weights = step.target_weights
    phases = {"training step": {"draft": step.parts["weights"] - weights,
                                **{k: v for k, v in step.parts.items() if k != "weights"}}}
    held = {"weights": weights}
    if rows_after > vocab:  # the embedding (and an untied LM head) before growing
        with _fake(kind):
            model = fake_causal_lm(target_config, 1, torch.bfloat16 if kind == "cuda"
                                   else torch.float32)
            old = storage_bytes([model.get_input_embeddings().weight,
                                 model.get_output_embeddings().weight])
        if kind == "cpu" and checkpoint_dtype(target_config) == torch.float32:
            # the checkpoint's tensors are views of its mapped file, which stays mapped
            # (and resident) while any of them lives: the old embedding's pages too
            held["embedding before growing (file still mapped)"] = old
        else:
            phases["loading and growing the target"] = {"embedding before growing": old}
        if kind == "cpu":  # save_pretrained serialises every tensor before writing
            phases["saving the grown target"] = {"serialised weights": weights}
    settings = {**step.settings, "grown_rows": rows_after if rows_after > vocab else None}
    out = _finish("train", kind, baseline, held, phases, settings)
    out.step = step
    return out
