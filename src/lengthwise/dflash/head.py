"""The LM head and cross-entropy in chunks of slots, recomputed in the backward.

The draft's loss needs the target's LM head on every supervised block slot:
``N x V`` logits (``V``: the vocabulary, 151,936 for Qwen3) plus an fp32 copy
for the softmax, tens of GiB at the reference shape. :func:`chunked_cross_entropy`
never holds them: the forward computes ``chunk`` slots' logits at a time and
keeps only each slot's cross-entropy and whether its top-1 was right; the
backward recomputes each chunk's logits and turns them straight into the
gradient of the hidden states. Peak extra memory is a few ``chunk x V`` fp32
buffers (:func:`chunk_bound_bytes`), whatever ``N`` is.

The arithmetic is the dense path's: ``F.linear`` in the compute dtype (the
autocast dtype, else the head's), then fp32 ``F.cross_entropy``, so the loss is
the same to rounding.

Example::

    >>> import torch
    >>> h = torch.randn(5, 8, requires_grad=True); w = torch.randn(11, 8)
    >>> labels, weights = torch.tensor([1, 2, 3, 4, 5]), torch.ones(5)
    >>> loss, ce, hit = chunked_cross_entropy(h, w, None, labels, weights, chunk=2)
    >>> dense = torch.nn.functional.cross_entropy(h @ w.T, labels, reduction="sum")
    >>> bool(torch.allclose(loss, dense)), tuple(ce.shape), hit.dtype
    (True, (5,), torch.bool)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from lengthwise.errors import ConfigError

__all__ = [
    "BUFFERS", "chunk_bound_bytes", "chunk_starts", "chunked_agreement", "chunked_cross_entropy",
]

#: fp32 ``chunk x V`` buffers alive at once at most (logits, their fp32 copy and
#: the log-softmax or softmax made from it)
BUFFERS = 3


def chunk_bound_bytes(chunk: int, vocab: int) -> int:
    """The memory bound of one chunk: ``BUFFERS`` fp32 buffers of ``chunk x vocab``.

    Example::

        >>> round(chunk_bound_bytes(1024, 151_936) / 2**30, 2)  # GiB
        1.74
    """
    return BUFFERS * int(chunk) * int(vocab) * 4


def chunk_starts(n: int, chunk: int) -> range:
    """The first slot of each chunk the head runs over ``n`` slots (forward and backward).

    Example::

        >>> list(chunk_starts(5, 2))
        [0, 2, 4]
    """
    return range(0, n, chunk)


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            dtype: torch.dtype) -> torch.Tensor:
    b = None if bias is None else bias.to(dtype)
    return F.linear(h.to(dtype), weight.to(dtype), b)


class _ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                labels: torch.Tensor, weights: torch.Tensor, chunk: int, dtype: torch.dtype,
                soft: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        acc = torch.promote_types(dtype, torch.float32)  # fp32 at least, as the dense path
        ce = torch.empty(n, dtype=acc, device=hidden.device)
        hit = torch.empty(n, dtype=torch.bool, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in chunk_starts(n, chunk):
                logits = _logits(hidden[s:s + chunk], weight, bias, dtype).to(acc)
                lab = labels[s:s + chunk]
                if soft is None:
                    ce[s:s + chunk] = F.cross_entropy(logits, lab, reduction="none")
                else:  # KL(p_target || p_draft) per slot
                    logp = _logits(soft[s:s + chunk], weight, bias, dtype).to(acc).log_softmax(-1)
                    ce[s:s + chunk] = (logp.exp() * (logp - logits.log_softmax(-1))).sum(-1)
                    del logp
                hit[s:s + chunk] = logits.argmax(dim=-1) == lab
                del logits
        ctx.save_for_backward(hidden, weight, bias, labels, weights, soft)
        ctx.chunk, ctx.dtype = chunk, dtype
        ctx.mark_non_differentiable(ce, hit)
        return (ce * weights.to(acc)).sum(), ce, hit

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        hidden, weight, bias, labels, weights, soft = ctx.saved_tensors
        chunk, dtype = ctx.chunk, ctx.dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(dtype, torch.float32)
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=acc) if need_b else None
        scale = weights.to(acc) * grad.to(acc)
        w = weight.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in chunk_starts(hidden.shape[0], chunk):
                h = hidden[s:s + chunk]
                g = torch.softmax(_logits(h, weight, bias, dtype).to(acc), dim=-1)
                if soft is None:
                    rows = torch.arange(g.shape[0], device=g.device)
                    g[rows, labels[s:s + chunk]] -= 1.0
                else:
                    g -= torch.softmax(_logits(soft[s:s + chunk], weight, bias, dtype).to(acc),
                                       dim=-1)
                g = (g.mul_(scale[s:s + chunk, None])).to(dtype)
                if need_h:
                    grad_h[s:s + chunk] = (g @ w).to(hidden.dtype)
                if need_w:
                    grad_w += (g.t() @ h.to(dtype)).to(acc)
                if need_b:
                    grad_b += g.to(acc).sum(dim=0)
                del g
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          labels: torch.Tensor, weights: torch.Tensor, *, chunk: int = 1024,
                          dtype: torch.dtype | None = None, soft: torch.Tensor | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sum(weights * CE(hidden @ weight.T + bias, labels))``, the per-slot CE, top-1 hits.

    ``hidden``: ``(N, H)`` supervised slots only; ``labels``: ``(N,)`` token ids;
    ``weights``: ``(N,)``; ``chunk``: slots per LM-head chunk; ``dtype``: the
    logits' compute dtype (default: the head's); the softmax runs in fp32 (or
    fp64 for fp64 logits). ``soft``: ``(N, H)`` the target's hidden states whose
    distributions (through the same head) the slots learn instead of ``labels``: the
    per-slot loss is then ``KL(p_target || p_draft)`` (``labels`` still give the hits).
    The sum is differentiable (hidden states, and the head
    when it requires grad); the per-slot CE and the hits are not.
    """
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ConfigError(f"chunk (slots per LM-head chunk) must be a positive integer, "
                          f"got {chunk!r}")
    if hidden.ndim != 2 or labels.shape != hidden.shape[:1] or weights.shape != labels.shape:
        raise ValueError(f"need hidden (N, H), labels (N,), weights (N,); got "
                         f"{tuple(hidden.shape)}, {tuple(labels.shape)}, {tuple(weights.shape)}")
    if soft is not None and soft.shape != hidden.shape:
        raise ValueError(f"soft must have hidden's shape {tuple(hidden.shape)}, got "
                         f"{tuple(soft.shape)}")
    return _ChunkedCE.apply(hidden, weight, bias, labels, weights, chunk,
                            dtype or weight.dtype, soft)


@torch.no_grad()
def chunked_agreement(draft_hidden: torch.Tensor, target_hidden: torch.Tensor,
                      weight: torch.Tensor, bias: torch.Tensor | None, *, temperature: float,
                      chunk: int = 1024, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per slot ``1 - TV(p_draft, p_target)`` at ``temperature``, ``chunk`` slots at a time.

    ``draft_hidden``, ``target_hidden``: ``(N, H)``, each slot's draft hidden state and the
    target's final hidden state at the position before the slot's token; both go through
    the one head (``weight``, ``bias``) in ``dtype`` (default: the head's), the softmax
    at ``temperature`` in fp32. ``1 - TV`` is the chance that speculative sampling keeps
    the draft's token; at temperature 0 it is whether the two top-1 tokens agree.

    Example::

        >>> h = torch.randn(4, 8); w = torch.randn(11, 8)
        >>> chunked_agreement(h, h, w, None, temperature=1.0, chunk=3).tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    if not temperature >= 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    dtype = dtype or weight.dtype
    acc = torch.promote_types(dtype, torch.float32)
    out = torch.empty(draft_hidden.shape[0], dtype=acc, device=draft_hidden.device)
    with torch.autocast(draft_hidden.device.type, enabled=False):
        for s in range(0, draft_hidden.shape[0], chunk):
            # at most BUFFERS chunk x V buffers alive: each is scaled, then turned into its
            # probabilities and dropped, in place of new copies
            ld = _logits(draft_hidden[s:s + chunk], weight, bias, dtype).to(acc)
            lt = _logits(target_hidden[s:s + chunk], weight, bias, dtype).to(acc)
            if temperature == 0:
                out[s:s + chunk] = (ld.argmax(dim=-1) == lt.argmax(dim=-1)).to(acc)
                continue
            p = torch.softmax(lt.div_(temperature), dim=-1)
            del lt
            q = torch.softmax(ld.div_(temperature), dim=-1)
            del ld
            out[s:s + chunk] = 1.0 - 0.5 * p.sub_(q).abs_().sum(dim=-1)
            del p, q
    return out.clamp_(0.0, 1.0)
