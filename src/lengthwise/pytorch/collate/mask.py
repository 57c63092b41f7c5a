"""The causal, block-diagonal attention mask of packed rows, built from ``position_ids``.

Example::

    >>> import torch
    >>> packed_attention_mask(torch.tensor([[0, 1, 0]]), dtype=torch.bool).shape
    torch.Size([1, 1, 3, 3])
"""

from __future__ import annotations

import torch

from lengthwise.errors import DataError

__all__ = ["packed_attention_mask"]


def packed_attention_mask(position_ids: torch.Tensor,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A causal, block-diagonal ``(B, 1, T, T)`` mask for packed rows.

    A new sample starts wherever the position id does not grow by one. Tokens
    attend only to earlier tokens of their own sample. With ``dtype=torch.bool``
    the mask is ``True`` where attention is allowed; with a floating dtype it is
    additive (0 allowed, the dtype's minimum blocked), as eager attention needs.
    Memory is ``B*T*T`` elements: meant for eager/SDPA attention at moderate ``T``;
    varlen kernels use ``cu_seq_lens`` instead.

    Example::

        >>> m = packed_attention_mask(torch.tensor([[0, 1, 0, 1]]), dtype=torch.bool)
        >>> m[0, 0].int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    """
    if position_ids.ndim == 1:
        position_ids = position_ids[None]
    if position_ids.ndim != 2:
        raise DataError("position_ids must be (batch, tokens), "
                        f"got shape {tuple(position_ids.shape)}")
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    segment = starts.long().cumsum(-1)
    t = position_ids.shape[1]
    causal = torch.ones((t, t), dtype=torch.bool, device=position_ids.device).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    allowed = allowed[:, None]
    if dtype == torch.bool:
        return allowed
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be torch.bool or a floating dtype, got {dtype}")
    out = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)
