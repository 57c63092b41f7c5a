"""Conversations decoded turn after turn in one continuous batch
(:mod:`lengthwise.dflash.generate`) against HF ``generate`` on each whole prompt."""

from __future__ import annotations

import pytest
from _dflash_tiny import float64_llama

from lengthwise.dflash.generate import decode_conversations

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STOPS = [3, 5]
CAP = 7


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama in float64 (no argmax ties)."""
    return float64_llama(max_position_embeddings=256)


def _hf(model, prompt: list[int]) -> list[int]:
    """``model.generate``'s greedy turn after the whole ``prompt``, cut after its first stop."""
    with torch.no_grad():
        seq = model.generate(torch.tensor([prompt]), max_new_tokens=CAP, do_sample=False,
                             eos_token_id=STOPS, pad_token_id=STOPS[0])
    new = seq[0, len(prompt):].tolist()
    ends = [k for k, t in enumerate(new) if t in STOPS]
    return new[: ends[0] + 1] if ends else new


class Chats:
    """Conversations of 1-3 turns of varied lengths, as a template would render them: the next
    prompt is the last one, the turn written and a user turn; a conversation in ``rewrite``
    re-renders its turns with another last token (its prompts do not extend its rows)."""

    def __init__(self, n: int, rewrite: frozenset[int] = frozenset()) -> None:
        gen = torch.Generator().manual_seed(1)
        self.users = [[torch.randint(4, 12, (int(torch.randint(1, 9, (1,), generator=gen)),),
                                     generator=gen).tolist() for _ in range(1 + c % 3)]
                      for c in range(n)]
        self.rewrite, self.turns = rewrite, {c: [] for c in range(n)}
        self.prompts: dict[int, list[list[int]]] = {c: [] for c in range(n)}

    def prompt(self, c: int, written: list[int] | None) -> list[int] | None:
        if written is not None:
            self.turns[c].append(written)
        r = len(self.turns[c])
        if r == len(self.users[c]):
            return None
        ids = [1]
        for k in range(r):
            said = list(self.turns[c][k])
            if c in self.rewrite:
                said[-1] = 11 if said[-1] != 11 else 10
            ids += self.users[c][k] + [2] + said
        ids += self.users[c][r] + [2]
        self.prompts[c].append(ids)
        return ids


def _run(model, chats: Chats, n: int, **kw):
    run = decode_conversations(model, list(range(n)), chats.prompt, max_new_tokens=CAP,
                               stops=STOPS, **kw)
    ended = []
    while True:
        try:
            ended += next(run)
        except StopIteration as end:
            return ended, end.value


def test_greedy_turns_are_those_of_hf_generate_on_each_whole_prompt(model):
    """Five conversations through two rows (refilled as conversations end), each keeping its
    cache between its turns except the one whose prompts do not extend it (refilled whole)."""
    n = 6
    chats = Chats(n, rewrite=frozenset({4}))
    ended, counts = _run(model, chats, n, rows=2)
    assert sorted(c for c, _ in ended) == sorted(c for c in range(n)
                                                 for _ in chats.users[c])
    lengths = set()
    for c in range(n):
        assert len(chats.turns[c]) == len(chats.users[c])
        for ids, got in zip(chats.prompts[c], chats.turns[c], strict=True):
            assert got == _hf(model, ids), c
            lengths.add(len(got))
    assert len(lengths) > 2 and CAP in lengths  # turns end at different steps, some cut
    later = sum(len(u) - 1 for u in chats.users)
    assert counts.refills == len(chats.users[4]) - 1 and later > counts.refills
    assert counts.reused_tokens > 0 and counts.prefills == n + later
    assert counts.row_steps + counts.prefills == sum(len(w) for t in chats.turns.values()
                                                     for w in t)


def test_the_token_budget_keeps_rows_waiting_without_changing_a_turn(model):
    n = 5
    wide, narrow = Chats(n), Chats(n)
    _run(model, wide, n, rows=4)
    _, counts = _run(model, narrow, n, rows=4, max_tokens=40)
    assert narrow.turns == wide.turns
    assert counts.steps > 0


def test_sampled_turns_follow_each_conversations_seed_not_the_batch(model):
    n = 4

    def sample(rows, base):
        chats = Chats(n)
        _run(model, chats, n, rows=rows, temperature=1.5, seed=lambda c: base + c)
        return chats.turns

    first = sample(1, 0)
    assert sample(3, 0) == first and sample(3, 100) != first
