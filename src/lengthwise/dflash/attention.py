"""The draft's attention kernel: a dense boolean mask, or a flex-attention block-sparse mask.

A block slot attends to its sample's context before its anchor and to its own
block: a few percent of the ``slots x (context + slots)`` pairs. On CPU the mask
is the dense boolean tensor of
:func:`~lengthwise.dflash.blocks.block_attention_mask`, an additive bias for
``scaled_dot_product_attention``. On CUDA :func:`block_flex_mask` gives
the same mask as a flex-attention ``BlockMask`` (the same rule, evaluated per
position, stored per tile of 128 x 128): the compiled kernel skips the tiles no
slot sees and never builds the dense bias. Both give the same outputs (tested
on CPU, where flex attention runs unfused); a slot that sees nothing gets a zero
output either way. (This torch runs flex attention on CPU without a backward, so
CPU training keeps the dense mask.)

Example::

    >>> import torch
    >>> anchors, starts = torch.tensor([[2, -1]]), torch.tensor([[0, 0]])
    >>> m = block_flex_mask(anchors, starts, 4, 2)
    >>> tuple(m.shape)
    (1, 1, 4, 8)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["block_flex_mask", "flex_attend", "use_flex"]

_COMPILED: dict[str, Any] = {}


def use_flex(device: torch.device | str) -> bool:
    """Whether blocks on ``device`` use the block-sparse flex mask (CUDA with flex attention)."""
    if torch.device(device).type != "cuda":
        return False
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def block_flex_mask(anchors: torch.Tensor, starts: torch.Tensor, context_len: int,
                    block_size: int) -> Any:
    """The flex-attention ``BlockMask`` of :func:`~lengthwise.dflash.blocks.block_attention_mask`.

    Shape ``(R, 1, A*B, L + A*B)``; slot ``q`` of block ``q // B`` sees context
    ``starts <= kv < anchor`` and its own block's slots, nothing when its anchor is ``-1``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    rows, width = anchors.shape
    q_len = width * block_size

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        blk = q // block_size
        anchor = anchors[b, blk]
        context = (kv < context_len) & (kv >= starts[b, blk]) & (kv < anchor)
        own = (kv >= context_len) & ((kv - context_len) // block_size == blk)
        return (anchor >= 0) & (context | own)

    return create_block_mask(mask_mod, rows, None, q_len, context_len + q_len,
                             device=anchors.device)


def _flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=True)
    return _COMPILED["flex"]


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any,
                ) -> torch.Tensor:
    """Attention of ``q (b, h, Q, d)`` over ``k, v (b, kv_h, K, d)`` under a ``BlockMask``.

    Compiled on CUDA (the fused block-sparse kernel); unfused elsewhere (tests).
    """
    from torch.nn.attention.flex_attention import flex_attention

    fn = _flex() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
