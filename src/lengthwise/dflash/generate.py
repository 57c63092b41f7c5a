"""The target's own responses: batched decode loops with a KV cache, greedy or sampled.

DFlash drafts learn the *target's* distribution, so their training responses are
best written by the target itself. Greedy responses are those of Hugging Face
``generate`` (up to ties of the argmax: other batches round differently).

Conversations written by the target turn after turn are decoded together, each keeping its
cache: regeneration's turns are not independent prompts (a conversation's next prompt is its
last prompt, the turn the target wrote, and the next user turn). :func:`decode_conversations`
therefore decodes *conversations*: a batch of at most ``rows`` of them shares one
:class:`RowCache`, and a row that ends its turn asks ``prompt(conversation, written)`` for
the next one (:func:`generate_responses`: prompts as conversations of one turn). When
that prompt begins with the row's tokens so far, only its new tokens are run through the
target (a prefill of the suffix); else the row starts again from the whole prompt (counted in
:attr:`DecodeCounts.refills`). A conversation with no turn left frees its row, and the
next waiting conversation takes it at once, so the batch stays full until the last ones.

Every prompt is prefilled alone (no padding) and scores its last position only; each
decode step runs every live row one token. Admission keeps ``rows x`` the widest row's
prompt plus ``max_new_tokens`` within ``max_tokens`` (a conversation already in the batch
goes on past it). Greedy at ``temperature`` 0; above, each conversation draws from its
own generator, seeded by ``seed(conversation)``, so its tokens do not depend on the batch.

Example::

    >>> import numpy as np, torch, transformers
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> model = transformers.LlamaForCausalLM(cfg)
    >>> out = generate_responses(model, [np.array([1, 2, 3])], max_new_tokens=4, eos=0,
    ...                          temperature=0.0, seed=0)
    >>> 1 <= out[0].size <= 4
    True
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.progress import progress

__all__ = ["DecodeCounts", "RowCache", "attention_mask", "conversation_seed",
           "decode_conversations", "generate_responses"]


def conversation_seed(seed: int, conversation: int) -> int:
    """The seed of conversation ``conversation``'s own generator in a run seeded ``seed``.

    >>> conversation_seed(0, 1), conversation_seed(1, 0)
    (7919, 7990271)
    """
    return (int(seed) * 1009 + int(conversation)) * 7919


def generate_responses(model: Any, prompts: list[np.ndarray], *, max_new_tokens: int,
                       eos: int | list[int], temperature: float, seed: int,
                       batch_size: int = 64, max_tokens: int | None = None,
                       device: Any = "cpu", show: bool = False) -> list[np.ndarray]:
    """The target's own continuation of every prompt (ends at a stop token ``eos`` or the cap).

    Each prompt is a conversation of one turn for :func:`decode_conversations`, the shortest
    admitted first: at most ``batch_size`` rows, within ``max_tokens`` (None: no token
    limit). ``temperature`` 0 is greedy decoding (the continuation speculative decoding must
    reproduce); above 0 prompt ``i`` samples from its own generator, seeded by ``seed`` and
    ``i``. ``show``: a progress bar over the responses.
    """

    stops = [eos] if isinstance(eos, int) else list(eos)
    order = np.argsort([p.size for p in prompts], kind="stable").tolist()
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    run = decode_conversations(
        model, order, lambda i, written: prompts[i].tolist() if written is None else None,
        max_new_tokens=max_new_tokens, stops=stops, rows=batch_size, max_tokens=max_tokens,
        temperature=temperature, seed=lambda i: conversation_seed(seed, i), device=device)
    written = (turn for ended in run for turn in ended)
    for i, ids in progress(written, desc="the target writes its responses", unit="response",
                           total=len(prompts), enable=show):
        out[i] = np.asarray(ids, dtype=np.int64)
    return out


@dataclass
class DecodeCounts:
    """Where :func:`decode_conversations`'s work went."""

    prefill_tokens: int = 0  # prompt tokens run through the target
    reused_tokens: int = 0  # tokens of earlier turns a prompt found in its row's cache
    refills: int = 0  # next prompts that did not begin with the row's tokens (whole prefill)
    prefills: int = 0  # prefill forwards (one a prompt)
    steps: int = 0  # decode steps
    row_steps: int = 0  # rows summed over the decode steps (new tokens decoded)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


@dataclass
class _Row:
    conv: int
    seq: list[int]  # the row's tokens: those in the cache, then the one to run next
    need: int  # its prompt plus max_new_tokens (the admission budget's row width)
    written: list[int]
    gen: Any  # the conversation's own torch.Generator (sampling), or None


def decode_conversations(model: Any, conversations: list[int],
                         prompt: Callable[[int, list[int] | None], list[int] | None], *,
                         max_new_tokens: int, stops: list[int], rows: int,
                         max_tokens: int | None = None, temperature: float = 0.0,
                         seed: Callable[[int], int] = int, device: Any = "cpu",
                         trace: list[tuple[int, int, int, float]] | None = None,
                         ) -> Generator[list[tuple[int, list[int]]], None, DecodeCounts]:
    """Write every turn of ``conversations`` (admitted in that order); yields, after each
    step, the turns ended in it as ``(conversation, ids)`` and returns the
    :class:`DecodeCounts`.

    ``prompt(c, None)`` is conversation ``c``'s first prompt and ``prompt(c, ids)`` the
    one after the turn ``ids`` (None: the conversation is done). A turn ends at its first
    stop token (kept) or at ``max_new_tokens`` tokens. ``trace`` (a list) receives each
    forward timed: ``(0, tokens run, tokens cached before them, seconds)`` of a prefill,
    ``(1, rows, cache width, seconds)`` of a decode step.

    Example::

        >>> import torch, transformers
        >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
        ...                                num_attention_heads=2, intermediate_size=32)
        >>> model = transformers.LlamaForCausalLM(cfg).eval()
        >>> turns = {0: [[1, 2, 3]], 1: [[4, 5]]}
        >>> run = decode_conversations(model, [0, 1], lambda c, w: turns[c].pop() if turns[c]
        ...                            else None, max_new_tokens=3, stops=[0], rows=2)
        >>> sorted(c for step in run for c, _ in step)
        [0, 1]
    """
    import torch

    from lengthwise.dflash.speculative import _cache_kwarg, _last_logits_only, _pick

    counts = DecodeCounts()
    cache = RowCache()
    kw, last_only = _cache_kwarg(model), _last_logits_only(model)
    stop = set(stops)
    waiting = deque(conversations)
    held: dict[int, list[int]] = {}  # first prompts of conversations the budget kept waiting
    live: list[_Row] = []
    ended: list[tuple[int, list[int]]] = []

    def pick(logits: Any, batch: list[_Row]) -> list[int]:
        if temperature == 0:
            return logits.argmax(dim=-1).tolist()
        return [int(_pick(logits[k:k + 1], temperature, r.gen)[0]) for k, r in enumerate(batch)]

    def take(row: _Row, tok: int) -> None:
        row.seq.append(tok)
        row.written.append(tok)

    @torch.inference_mode()
    def start(slot: int, row: _Row, ids: list[int]) -> None:
        """Prefill ``ids`` into ``slot`` after the row's cached tokens it begins with."""
        begin = time.perf_counter()
        have = len(row.seq) - 1 if row.seq else 0
        if row.seq and ids[:len(row.seq)] != row.seq:
            counts.refills += 1
            have = 0
        counts.reused_tokens += have
        feed = ids[have:]
        row.seq, row.written, row.need = list(ids), [], len(ids) + max_new_tokens
        cache.reserve(min(rows, max(slot + 1, 2 * cache.rows)), row.need)
        starts = torch.tensor([have], device=device)
        cache.bind(slice(slot, slot + 1), starts, len(ids))
        out = model(input_ids=torch.tensor([feed], device=device),
                    position_ids=torch.arange(have, len(ids), device=device)[None],
                    attention_mask=attention_mask(starts, len(feed), len(ids)),
                    use_cache=True, **last_only, **{kw: cache})
        take(row, pick(out.logits[:, -1].float(), [row])[0])
        counts.prefill_tokens += len(feed)
        counts.prefills += 1
        counts.prefill_seconds += time.perf_counter() - begin
        if trace is not None:
            trace.append((0, len(feed), have, time.perf_counter() - begin))

    @torch.inference_mode()
    def step() -> None:
        """Every live row one token further."""
        begin = time.perf_counter()
        starts = torch.tensor([len(r.seq) - 1 for r in live], device=device)
        width = int(starts.max()) + 1
        cache.bind(slice(0, len(live)), starts, width)
        out = model(input_ids=torch.tensor([[r.seq[-1]] for r in live], device=device),
                    position_ids=starts[:, None], attention_mask=attention_mask(starts, 1, width),
                    use_cache=True, **{kw: cache})
        for row, tok in zip(live, pick(out.logits[:, -1].float(), live), strict=True):
            take(row, tok)
        counts.steps += 1
        counts.row_steps += len(live)
        counts.decode_seconds += time.perf_counter() - begin
        if trace is not None:
            trace.append((1, len(live), width, time.perf_counter() - begin))

    def settle(slot: int) -> bool:
        """Start the row's next turns while its turn has ended; False: the row is free."""
        row = live[slot]
        while row.written[-1] in stop or len(row.written) >= max_new_tokens:
            ended.append((row.conv, row.written))
            ids = prompt(row.conv, row.written)
            if ids is None:
                return False
            start(slot, row, ids)
        return True

    @torch.inference_mode()
    def free(slots: list[int]) -> None:
        for slot in sorted(slots, reverse=True):  # the last row fills each freed one
            tail = live.pop()
            if slot < len(live):
                cache.move(len(live), slot, len(tail.seq) - 1)
                live[slot] = tail

    def admit() -> None:
        widest = max((r.need for r in live), default=0)
        while waiting and len(live) < rows:
            conv = waiting[0]
            ids = held.pop(conv) if conv in held else prompt(conv, None)
            if ids is None:  # nothing left to write
                waiting.popleft()
                continue
            if live and max_tokens is not None and (len(live) + 1) * max(
                    widest, len(ids) + max_new_tokens) > max_tokens:
                held[conv] = ids
                return
            waiting.popleft()
            gen = (torch.Generator(device=device).manual_seed(int(seed(conv)))
                   if temperature else None)
            live.append(_Row(conv, [], 0, [], gen))
            start(len(live) - 1, live[-1], ids)
            widest = max(widest, live[-1].need)
            if not settle(len(live) - 1):
                live.pop()

    was = model.training
    model.eval()
    try:
        admit()
        while live:
            step()
            free([slot for slot in range(len(live)) if not settle(slot)])
            admit()
            if ended:
                yield ended
                ended = []
        if ended:
            yield ended
    finally:
        model.train(was)
    return counts


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
    batch more rows: a preallocated KV cache whose rows are conversations, each from column 0,
    each its own length.

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
