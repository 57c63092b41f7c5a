"""Conversations written by the target turn after turn, decoded together, each keeping its cache.

Regeneration's turns are not independent prompts: a conversation's next prompt is its
last prompt, the turn the target wrote, and the next user turn. :func:`decode_conversations`
therefore decodes *conversations*: a batch of at most ``rows`` of them shares one
:class:`~lengthwise.dflash.row_cache.RowCache`, and a row that ends its turn asks
``prompt(conversation, written)`` for the next one. When that prompt begins with the
row's tokens so far, only its new tokens are run through the target (a prefill of the
suffix); else the row starts again from the whole prompt (counted in
:attr:`DecodeCounts.refills`). A conversation with no turn left frees its row, and the
next waiting conversation takes it at once, so the batch stays full until the last ones.

Every prompt is prefilled alone (no padding) and scores its last position only; each
decode step runs every live row one token. Admission keeps ``rows x`` the widest row's
prompt plus ``max_new_tokens`` within ``max_tokens`` (a conversation already in the batch
goes on past it). Greedy at ``temperature`` 0; above, each conversation draws from its
own generator, seeded by ``seed(conversation)``, so its tokens do not depend on the batch.

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

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

__all__ = ["DecodeCounts", "decode_conversations"]


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
                         ) -> Generator[list[tuple[int, list[int]]], None, DecodeCounts]:
    """Write every turn of ``conversations`` (admitted in that order); yields, after each
    step, the turns ended in it as ``(conversation, ids)`` and returns the
    :class:`DecodeCounts`.

    ``prompt(c, None)`` is conversation ``c``'s first prompt and ``prompt(c, ids)`` the
    one after the turn ``ids`` (None: the conversation is done). A turn ends at its first
    stop token (kept) or at ``max_new_tokens`` tokens.
    """
    import torch

    from lengthwise.dflash.row_cache import RowCache, attention_mask
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
