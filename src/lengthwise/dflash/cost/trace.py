"""Tracing the stages' own modules under fake tensors (shapes, no storage): the bytes they hold.

The estimates run the stages' code on tensors without storage while :class:`LiveBytes`
records every storage an operation creates and frees. On CUDA, fused attention stands in
for its kernels (:func:`kernels`); the LM head runs three of its chunks
(:func:`few_head_chunks`). From a target's second layer on every layer adds the same bytes,
so a target is traced at two shallow depths and extrapolated (:func:`per_layer`).

Example::

    >>> import transformers
    >>> t = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6,
    ...                              num_attention_heads=4, intermediate_size=64)
    >>> fig = per_layer(lambda n: {"w": weight_bytes(fake_causal_lm(t, n, torch.float32))}, 6, 1)
    >>> fig["w"] == weight_bytes(fake_causal_lm(t, 6, torch.float32))
    True
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lengthwise.errors import ConfigError

__all__ = ["LiveBytes", "fake_causal_lm", "fake_draft", "few_head_chunks", "kernels", "per_layer",
           "storage_bytes", "weight_bytes", "weight_dtype", "with_layers"]


class LiveBytes(TorchDispatchMode):
    """Live bytes of the storages operations create, their peak, and what was live then.

    A storage whose last dimension is ``vocab`` is a chunk of the LM head's logits
    (``logits_chunk``); any other, ``activations``. Each storage gets a serial (its key
    may come back once freed): ``at_peak`` maps serials to ``(bytes, kind)``.
    """

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
        from torch.multiprocessing.reductions import StorageWeakRef

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
def _fused_kernels() -> Iterator[None]:
    """Fused attention for the target (SDPA) and the draft (flex), swapped in and put back."""
    import lengthwise.dflash.attention as attention
    import lengthwise.dflash.loss as loss

    saved = (torch.nn.functional.scaled_dot_product_attention, attention.flex_attend,
             loss.block_flex_mask)
    torch.nn.functional.scaled_dot_product_attention = (
        lambda q, k, v, *a, **kw: _FusedAttention.apply(q, k, v))
    attention.flex_attend = lambda q, k, v, mask: _FusedAttention.apply(q, k, v)
    loss.block_flex_mask = lambda *a, **k: object()
    try:
        yield
    finally:
        (torch.nn.functional.scaled_dot_product_attention, attention.flex_attend,
         loss.block_flex_mask) = saved


def kernels(kind: str) -> contextlib.AbstractContextManager[None]:
    """The attention kernels of device ``kind``: CUDA's fused ones, else the code's own."""
    return _fused_kernels() if kind == "cuda" else contextlib.nullcontext()


def _chunks_kept(n: int, chunk: int) -> list[int]:
    """The first two and the last of the LM head's chunk starts over ``n`` slots."""
    starts = range(0, n, chunk)  # head.chunk_starts, which this stands in for
    return list(starts) if len(starts) <= 3 else [starts[0], starts[1], starts[-1]]


@contextlib.contextmanager
def few_head_chunks() -> Iterator[None]:
    """The LM head runs its first two chunks and its last one: each allocates the same
    buffers and frees them before the next, so the peak is every chunk's, in a time that
    does not grow with the slots."""
    import lengthwise.dflash.head as head

    saved, head.chunk_starts = head.chunk_starts, _chunks_kept
    try:
        yield
    finally:
        head.chunk_starts = saved


def with_layers(config: Any, layers: int, vocab: int | None = None) -> Any:
    """``config`` with ``layers`` decoder layers (a ``layer_types`` cut to them) and
    ``vocab`` rows.

    >>> import transformers
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
    """The target's ``transformers`` model at ``layers`` layers, in ``dtype``, under fake
    tensors (made inside a ``FakeTensorMode`` when none is active)."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    active = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    with contextlib.nullcontext() if active else FakeTensorMode():
        return transformers.AutoModelForCausalLM.from_config(with_layers(config, layers),
                                                             dtype=dtype).eval()


def per_layer(trace: Callable[[int], dict[str, int]], depth: int, k: int) -> dict[str, int]:
    """``trace(n)``'s figures at ``depth`` layers, from traces at two shallow depths.

    ``k``: the fewest layers the trace takes. The first layer differs from the others (the
    embedding's output is freed there), so the two depths are 2 or more.
    """
    lo_n = max(2, k + 1)
    if depth <= lo_n + 1:
        return trace(depth)
    lo, hi = trace(lo_n), trace(lo_n + 1)
    return {name: lo[name] + (depth - lo_n) * (hi[name] - lo[name]) for name in lo}


def weight_dtype(name: Any, kind: str, config: Any) -> torch.dtype:
    """The weights' dtype a stage loads: ``name``, else float32 on CPU, the config's on CUDA.

    >>> weight_dtype(None, "cpu", None), weight_dtype("bfloat16", "cpu", None)
    (torch.float32, torch.bfloat16)
    """
    from lengthwise.dflash.target import WEIGHT_DTYPES

    if name is not None:
        if str(name) not in WEIGHT_DTYPES:
            raise ConfigError(f"--dtype must be one of float32, bfloat16, float16, got {name!r}")
        return WEIGHT_DTYPES[str(name)]
    if kind != "cuda":
        return torch.float32
    return checkpoint_dtype(config) or torch.bfloat16


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype ``config.json`` gives the checkpoint's weights (``None``: not given)."""
    from lengthwise.dflash.target import WEIGHT_DTYPES

    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, torch.dtype):
        return own
    return WEIGHT_DTYPES.get(str(own).removeprefix("torch.")) if own else None


def fake_draft(target_config: Any, cfg: Any, layers: list[int]) -> Any:
    """The draft ``dflash train`` builds for ``cfg`` (:func:`~lengthwise.dflash.recipe.new_draft`'s
    sizes) reading the target's ``layers``, in training mode; call it under fake tensors."""
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    return DFlashDraft(DFlashConfig.from_target(
        target_config, num_layers=cfg.draft_layers, block_size=cfg.block_size, gamma=cfg.gamma,
        target_layers=layers, mask_token_id=int(target_config.vocab_size) - 1)).train()
