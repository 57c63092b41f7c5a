"""A preallocated KV cache whose rows are conversations, each from column 0, each its own length.

Hugging Face models write their keys and values through ``cache.update``; :class:`RowCache`
takes that call and writes them in place into one tensor per layer of ``rows`` rows (no
copy of the cache a step). Each forward runs on the rows ``bind`` names, writing a row's
new tokens from its own column; the caller passes the 4D attention mask
(:func:`attention_mask`) that hides each row's unwritten columns. A row that leaves is
overwritten by the last one (:meth:`RowCache.move`), so the live rows stay ``0..n-1``.

Example::

    >>> import torch
    >>> cache = RowCache()
    >>> cache.reserve(2, 4)
    >>> cache.bind(slice(0, 1), torch.tensor([0]), width=3)
    >>> k, v = cache.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2), 0)
    >>> tuple(k.shape), cache.rows, cache.capacity
    ((1, 1, 3, 2), 2, 64)
"""

from __future__ import annotations

from typing import Any

__all__ = ["RowCache", "attention_mask"]


def attention_mask(starts: Any, queries: int, width: int) -> Any:
    """``(rows, 1, queries, width)`` booleans: query ``j`` of a row whose new tokens start at
    column ``starts[row]`` sees the columns up to ``starts[row] + j``.

    Example::

        >>> import torch
        >>> attention_mask(torch.tensor([1]), 2, 3)[0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    import torch

    cols = torch.arange(width, device=starts.device)
    last = starts[:, None] + torch.arange(queries, device=starts.device)[None]
    return (cols[None, None] <= last[:, :, None])[:, None]


class RowCache:
    """Keys and values of the batch's rows, grown only when a row needs more columns, or the
    batch more rows."""

    def __init__(self) -> None:
        self.rows, self.capacity = 0, 0
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self._slots: slice = slice(0, 0)
        self._starts: Any = None
        self._width = 0
        self._flat: dict[int, Any] = {}

    def reserve(self, rows: int, width: int) -> None:
        """Room for ``rows`` rows of ``width`` columns (a copy of the cache when it grows)."""
        if rows <= self.rows and width <= self.capacity:
            return
        grown = max(width, self.capacity + self.capacity // 4) if width > self.capacity else width
        grown = max(-(-grown // 64) * 64, self.capacity)
        rows = max(rows, self.rows)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros(rows, old.shape[1], grown, old.shape[3])
                new[: self.rows, :, : self.capacity] = old
                store[i] = new
        self.rows, self.capacity = rows, grown

    def bind(self, slots: slice, starts: Any, width: int) -> None:
        """The next forward's rows ``slots``, the column each row's new tokens start at, and
        the columns its attention reads (``width``)."""
        self._slots, self._starts, self._width = slots, starts, width
        self._flat: dict[int, Any] = {}  # by heads: the rows' columns in a (-1, dim) view

    def update(self, key: Any, value: Any, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[Any, Any]:
        """Write ``key`` and ``value`` ``(rows, heads, queries, dim)`` at the bound columns;
        the bound rows' keys and values up to the bound width."""
        if layer_idx == len(self.keys):
            for store, new in ((self.keys, key), (self.values, value)):
                store.append(new.new_zeros(self.rows, new.shape[1], self.capacity,
                                           new.shape[3]))
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if key.shape[2] == 1:  # one token a row, each at its own column (one index_copy_)
            at = self._flat.get(k.shape[1])
            if at is None:
                import torch

                heads = torch.arange(k.shape[1], device=key.device)
                rows = torch.arange(self._slots.start, self._slots.stop, device=key.device)
                at = ((rows[:, None] * k.shape[1] + heads[None]) * self.capacity
                      + self._starts[:, None]).reshape(-1)
                self._flat[k.shape[1]] = at
            k.view(-1, k.shape[3]).index_copy_(0, at, key.reshape(-1, key.shape[3]))
            v.view(-1, v.shape[3]).index_copy_(0, at, value.reshape(-1, value.shape[3]))
        else:  # the tokens of one row
            start = int(self._starts[0])
            k[self._slots, :, start:start + key.shape[2]] = key
            v[self._slots, :, start:start + key.shape[2]] = value
        return k[self._slots, :, : self._width], v[self._slots, :, : self._width]

    def move(self, src: int, dst: int, length: int) -> None:
        """Row ``src``'s first ``length`` columns copied into row ``dst``."""
        for store in (self.keys, self.values):
            for t in store:
                t[dst, :, :length] = t[src, :, :length]
