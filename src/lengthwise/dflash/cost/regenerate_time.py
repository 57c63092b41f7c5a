"""Seconds of regeneration (``dflash prepare --regenerate``) before it runs.

:func:`regenerate_prompts` renders every prompt regeneration gives the target and
:func:`plan_batches` replays its order (shards, rounds, batches of prompts sorted by length:
:func:`~lengthwise.dflash.prompt_batches.batch_offsets`). A batch is priced by a
:class:`GenerateProfile` (per prompt token, decoding step, row and step, attended pair)
fitted on a few of the run's own batches timed here (:func:`measure_generate_profile`),
decoding as long as the expected longest of its rows' responses (:func:`expected_longest`,
over the responses the target wrote there). :func:`estimate_regenerate_time` puts it
together. See docs/dflash.md, "The time of regeneration".

Example::

    >>> prof = GenerateProfile(device="cpu", per_prefill_token=0.0, per_step=0.01,
    ...                        per_row_step=0.0, per_pair=0.0, responses=[10, 20],
    ...                        max_new_tokens=64)
    >>> plan = plan_batches([np.array([5, 9, 7])], batch_size=2)
    >>> plan.rows.tolist(), plan.width.tolist()
    ([2, 1], [7, 9])
    >>> t = predict_generate(plan, prof)
    >>> t.batch_seconds.round(3).tolist()    # longest of 2: 20 w.p. 3/4; of 1: 15 on average
    [0.175, 0.15]
    >>> t.render()
    'about 0.33 s for 3 responses in 2 batches (0.16 s a batch) on cpu'
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.dflash.cost.profile import (
    Profile,
    check_one_process,
    device_name,
    duration,
    fit_costs,
)
from lengthwise.dflash.prompt_batches import batch_offsets
from lengthwise.errors import ConfigError, DataError

__all__ = ["PROFILE_BATCHES", "GenerateBatches", "GenerateProfile", "GenerateTime",
           "RegeneratePrompts", "attended_pairs", "cut_answers", "estimate_regenerate_time",
           "expected_longest", "fit_generate_profile", "measure_generate_profile",
           "plan_batches", "predict_generate", "regenerate_prompts", "timed_batches"]

#: batches timed for a profile (after a short warm-up): one more than the profile's terms
PROFILE_BATCHES = 5


@dataclass(frozen=True)
class GenerateBatches:
    """Every batch regeneration runs, in its order: ``rows`` prompts left-padded to ``width``
    tokens, of shard ``shard`` and round ``round``."""

    rows: np.ndarray
    width: np.ndarray
    shard: np.ndarray
    round: np.ndarray

    @property
    def batches(self) -> int:
        return int(self.rows.size)


def plan_batches(rounds: list[np.ndarray], *, batch_size: int, max_tokens: int | None = None,
                 max_new_tokens: int = 0, shards: list[np.ndarray] | None = None,
                 ) -> GenerateBatches:
    """The batches of regeneration: ``rounds[r]`` holds the prompt lengths of round ``r``
    and ``shards[r]`` their conversations' shards (all one shard when not given). Each
    shard's rounds run in turn, each round's prompts sorted by length and cut by
    :func:`~lengthwise.dflash.prompt_batches.batch_offsets`.

    Example::

        >>> b = plan_batches([np.array([3, 8, 4, 6]), np.array([12, 5])], batch_size=3,
        ...                  shards=[np.array([0, 0, 1, 1]), np.array([0, 1])])
        >>> b.shard.tolist(), b.round.tolist(), b.rows.tolist(), b.width.tolist()
        ([0, 0, 1, 1], [0, 1, 0, 1], [2, 1, 2, 1], [8, 12, 6, 5])
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    lens = [np.asarray(x, dtype=np.int64) for x in rounds]
    where = ([np.asarray(s, dtype=np.int64) for s in shards] if shards is not None
             else [np.zeros(x.size, dtype=np.int64) for x in lens])
    if len(where) != len(lens) or any(s.shape != x.shape for s, x in zip(where, lens,
                                                                           strict=True)):
        raise DataError("plan_batches: one shard per prompt of every round")
    cols: list[list[np.ndarray]] = [[], [], [], []]  # rows, width, shard, round
    for k in np.unique(np.concatenate(where)) if lens else ():
        for r, (x, s) in enumerate(zip(lens, where, strict=True)):
            mine = np.sort(x[s == k], kind="stable")
            if mine.size == 0:
                continue
            cuts = batch_offsets(mine, batch_size=batch_size, max_tokens=max_tokens,
                                 max_new_tokens=max_new_tokens)
            for col, value in zip(cols, (np.diff(cuts), mine[cuts[1:] - 1], k, r), strict=True):
                col.append(np.broadcast_to(value, cuts.size - 1))
    return GenerateBatches(*(np.concatenate(c).astype(np.int64) if c else np.zeros(0, np.int64)
                             for c in cols))


def attended_pairs(rows: Any, width: Any, steps: Any) -> np.ndarray:
    """Token pairs a batch attends: per row the prompt's causal pairs (``width**2 / 2``, the
    padding included) and at each decoding step the cache so far (``width + s``).

    >>> attended_pairs(2, 10, 4).tolist()
    196.0
    """
    r, w, s = (np.asarray(a, dtype=np.float64) for a in (rows, width, steps))
    return r * (w * w / 2 + s * (w + s / 2))


def expected_longest(responses: Any, rows: Any, cap: int) -> np.ndarray:
    """The expected longest of ``rows`` responses drawn from ``responses`` (each at most
    ``cap``): ``sum_v v * (F(v)**rows - F(v-)**rows)`` over their empirical distribution.

    >>> expected_longest([10, 20], [1, 2, 3], cap=64).tolist()
    [15.0, 17.5, 18.75]
    """
    v = np.sort(np.minimum(np.asarray(responses, dtype=np.float64), cap))
    if v.size == 0:
        raise DataError("expected_longest: no responses to draw from")
    values, counts = np.unique(v, return_counts=True)
    cdf = np.cumsum(counts) / v.size
    before = np.concatenate([[0.0], cdf[:-1]])
    r = np.asarray(rows, dtype=np.float64)[..., None]
    return np.sum(values * (cdf ** r - before ** r), axis=-1)


@dataclass(frozen=True)
class GenerateProfile(Profile):
    """Seconds per unit of a generate batch on one device, and the responses it timed:
    ``per_prefill_token`` per padded prompt token, ``per_step`` per decoding step whatever
    its rows, ``per_row_step`` per row and step, ``per_pair`` per attended pair;
    ``responses``: the lengths the target wrote (with the stop token, at most
    ``max_new_tokens``); ``start_seconds``: loading the target and rendering the prompts.

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> GenerateProfile("cpu", 1e-4, 0.02, 1e-3, 1e-8, [5, 9], 16).save(f)
    >>> GenerateProfile.load(f).responses
    [5, 9]
    """

    kind = "regeneration"
    write = "dflash estimate --stage regenerate --time --save-profile"
    priced = ("per_prefill_token", "per_step", "per_row_step", "per_pair")
    required = (*priced, "responses", "max_new_tokens")
    costs = (*priced, "start_seconds")
    timed = "batches"

    device: str
    per_prefill_token: float
    per_step: float
    per_row_step: float
    per_pair: float
    responses: list[int]
    max_new_tokens: int
    start_seconds: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def check(cls, data: dict[str, Any], where: str) -> None:
        """``max_new_tokens`` a count, ``responses`` lengths from 1 to it."""
        cap, resp = data["max_new_tokens"], data["responses"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise DataError(f"{where}: max_new_tokens must be a count >= 1, got "
                            f"{reprlib.repr(cap)}")
        if (not isinstance(resp, list) or not resp
                or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= cap
                           for x in resp)):
            raise DataError(f"{where}: responses must be a list of lengths from 1 to "
                            f"max_new_tokens ({cap})")

    def batch_seconds(self, rows: Any, width: Any, steps: Any) -> np.ndarray:
        """Predicted seconds of batches of ``rows`` prompts of ``width`` decoding ``steps``."""
        r, w, s = (np.asarray(a, dtype=np.float64) for a in (rows, width, steps))
        return (self.per_prefill_token * r * w + self.per_step * s + self.per_row_step * r * s
                + self.per_pair * attended_pairs(r, w, s))

    def mean_answer(self, cap: int) -> float:
        """Mean tokens of an answer the target writes under ``cap``: its responses cut there,
        without the stop token of those that ended (the template writes its own).

        >>> GenerateProfile("cpu", 0, 0, 0, 0, responses=[5, 17, 30], max_new_tokens=32
        ...                 ).mean_answer(16)    # (4 + 16 + 16) / 3
        12.0
        """
        resp = np.asarray(self.responses, dtype=np.float64)
        cut = np.minimum(resp, cap)
        return float(np.mean(np.where((resp < self.max_new_tokens) & (resp <= cap),
                                      cut - 1, cut)))


def fit_generate_profile(rows: Any, width: Any, steps: Any, seconds: Any, *, device: str,
                         responses: list[int], max_new_tokens: int,
                         start_seconds: float = 0.0) -> GenerateProfile:
    """Fit :meth:`GenerateProfile.batch_seconds` to timed batches; terms the batches cannot
    tell apart are left at 0.

    >>> p = fit_generate_profile([4, 4, 2, 4], [10, 30, 20, 50], [8, 16, 12, 4],
    ...                          [0.92, 1.88, 1.0, 0.64], device="cpu",
    ...                          responses=[8, 16, 12], max_new_tokens=16)
    >>> round(p.per_step, 3), round(p.per_row_step, 3), round(p.per_prefill_token, 4)
    (0.05, 0.015, 0.001)
    """
    r, w, s, y = (np.asarray(a, dtype=np.float64).ravel() for a in (rows, width, steps, seconds))
    if not (r.size == w.size == s.size == y.size) or y.size == 0:
        raise DataError("fit_generate_profile: one row count, width, step count and time "
                        "per batch")
    if not (np.all(np.isfinite(y)) and np.all(y > 0) and np.all(s > 0) and np.all(r > 0)):
        raise DataError("fit_generate_profile: every timed batch needs a positive time, "
                        "rows and steps")
    x = np.stack([r * w, s, r * s, attended_pairs(r, w, s)], axis=1)
    coef, errors = fit_costs(x, y)
    if not np.any(coef > 0):  # one batch, or nothing to tell apart: time per step and row
        coef, errors = fit_costs(x, y, np.array(
            [0.0, 0.0, float(np.sum(r * s / y) / np.sum((r * s / y) ** 2)), 0.0]))
    return GenerateProfile(
        device=device, per_prefill_token=float(round(coef[0], 12)),
        per_step=float(round(coef[1], 12)), per_row_step=float(round(coef[2], 12)),
        per_pair=float(round(coef[3], 15)),
        responses=[int(v) for v in responses], max_new_tokens=int(max_new_tokens),
        start_seconds=float(start_seconds),
        fit={"batches": int(y.size), "seconds": y.round(4).tolist(), "rows": r.tolist(),
             "width": w.tolist(), "steps": s.tolist(), **errors})


@dataclass(frozen=True)
class GenerateTime:
    """Predicted seconds of every batch of regeneration, per rank and in all."""

    batch_seconds: np.ndarray
    rows: np.ndarray
    rank: np.ndarray
    world: int
    start_seconds: float
    device: str
    cut_share: float  # of the timed responses, the share cut at max_new_tokens

    def rank_seconds(self) -> np.ndarray:
        """Seconds of each rank's batches (its shards')."""
        return np.bincount(self.rank, weights=self.batch_seconds, minlength=self.world)

    @property
    def generate_seconds(self) -> float:
        """The slowest rank's batches: what the run waits for."""
        return float(self.rank_seconds().max()) if self.batch_seconds.size else 0.0

    @property
    def total_seconds(self) -> float:
        return self.generate_seconds + self.start_seconds

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "batches": int(self.batch_seconds.size),
                "responses": int(self.rows.sum()), "world": self.world,
                "batch_seconds_mean": (float(self.batch_seconds.mean())
                                       if self.batch_seconds.size else 0.0),
                "generate_seconds": self.generate_seconds, "start_seconds": self.start_seconds,
                "total_seconds": self.total_seconds, "cut_share": self.cut_share}

    def render(self) -> str:
        """One line: the whole regeneration, then a batch."""
        mean = float(self.batch_seconds.mean()) if self.batch_seconds.size else 0.0
        ranks = f" on each of {self.world} ranks" if self.world > 1 else ""
        extra = (f"; {duration(self.start_seconds, exact=True)} to start"
                 if self.start_seconds else "")
        return (f"about {duration(self.total_seconds, exact=True)} for {int(self.rows.sum()):,} "
                f"responses in {self.batch_seconds.size:,} batches{ranks} "
                f"({duration(mean, exact=True)} a batch{extra}) on {self.device}")


def predict_generate(plan: GenerateBatches, profile: GenerateProfile, *, world: int = 1,
                     max_new_tokens: int | None = None) -> GenerateTime:
    """Every batch's predicted seconds; rank ``k % world`` runs shard ``k``.

    ``max_new_tokens``: the run's cap (the profile's when not given); one above the
    profile's is refused where the timed responses were cut at it.
    """
    cap = int(max_new_tokens if max_new_tokens is not None else profile.max_new_tokens)
    resp = np.asarray(profile.responses, dtype=np.int64)
    cut = float(np.mean(resp >= profile.max_new_tokens)) if resp.size else 0.0
    if cap > profile.max_new_tokens and cut > 0:
        raise ConfigError(f"--max-new-tokens {cap}: the profile timed responses of at most "
                          f"{profile.max_new_tokens} tokens and {100 * cut:.0f} % reached it, "
                          "so longer ones are not known; time the run with its own "
                          "--max-new-tokens")
    steps = expected_longest(resp, plan.rows, cap)
    return GenerateTime(batch_seconds=profile.batch_seconds(plan.rows, plan.width, steps),
                        rows=plan.rows, rank=(plan.shard % max(1, world)).astype(np.int64),
                        world=max(1, int(world)), start_seconds=profile.start_seconds,
                        device=profile.device,
                        cut_share=float(np.mean(np.minimum(resp, cap) >= cap)))


@dataclass(frozen=True)
class RegeneratePrompts:
    """The prompts of regeneration, round by round: ``lengths[r]`` in tokens, of conversations
    ``conversation[r]`` in shards ``shard[r]``, with ``answered[r]`` tokens of the data's own
    earlier answers; ``seconds``: the time rendering them took."""

    lengths: list[np.ndarray]
    conversation: list[np.ndarray]
    shard: list[np.ndarray]
    answered: list[np.ndarray]
    seconds: float

    def with_answers(self, answer: float) -> RegeneratePrompts:
        """These prompts with each earlier answer ``answer`` tokens long in place of the data's.

        >>> p = RegeneratePrompts([np.array([9]), np.array([40])], [np.array([0])] * 2,
        ...                       [np.array([0])] * 2, [np.array([0]), np.array([25])], 0.0)
        >>> p.with_answers(6.0).lengths[1].tolist()
        [21]
        """
        lengths = [np.maximum(1, np.rint(x - a + r * answer)).astype(np.int64)
                   for r, (x, a) in enumerate(zip(self.lengths, self.answered, strict=True))]
        return dataclasses.replace(self, lengths=lengths)

    def batches(self, cfg: Any) -> GenerateBatches:
        """:func:`plan_batches` of these prompts under ``cfg``'s (a ``PrepareConfig``) limits."""
        return plan_batches(self.lengths, batch_size=cfg.batch_size, max_tokens=cfg.max_tokens,
                            max_new_tokens=cfg.max_new_tokens, shards=self.shard)

    def members(self, shard: int, rnd: int, index: int, cfg: Any) -> np.ndarray:
        """Conversations of batch ``index`` of ``shard``'s round ``rnd`` (sorted as run)."""
        mine = np.flatnonzero(self.shard[rnd] == shard)
        order = mine[np.argsort(self.lengths[rnd][mine], kind="stable")]
        cuts = batch_offsets(self.lengths[rnd][order], batch_size=cfg.batch_size,
                             max_tokens=cfg.max_tokens, max_new_tokens=cfg.max_new_tokens)
        return self.conversation[rnd][order[cuts[index]:cuts[index + 1]]]


def _conversations(source: str | Path, cfg: Any) -> list[list[dict[str, str]]]:
    """The conversations of ``source``, each ending with an assistant turn to write."""
    from lengthwise.dflash.chat import normalise
    from lengthwise.dflash.chat_files import ChatSource

    if not Path(source).exists():
        raise DataError(f"{source}: no such file or folder")
    chats = ChatSource(Path(source), field=cfg.field, split=cfg.split)
    if len(chats) == 0:
        raise DataError(f"{source}: no conversations")
    convs = []
    for _, where, raw in chats.rows():
        conv = normalise(raw, where=where, allow_empty_assistant=True)
        if conv[-1]["role"] != "assistant":
            conv.append({"role": "assistant", "content": ""})
        convs.append(conv)
    return convs


def _turns(conv: list[dict[str, str]]) -> list[int]:
    return [j for j, m in enumerate(conv) if m["role"] == "assistant"]


def regenerate_prompts(source: str | Path, renderer: Any, cfg: Any, *,
                       show: bool = True) -> RegeneratePrompts:
    """The length of every prompt regeneration of ``source`` gives the target (``cfg``: a
    ``PrepareConfig``), rendered with ``renderer``; ``show``: a progress bar."""
    from lengthwise.dflash.prepare import _render_or_name
    from lengthwise.progress import progress

    started = time.perf_counter()
    convs = _conversations(source, cfg)
    lengths: list[list[int]] = []
    conv_of: list[list[int]] = []
    answered: list[list[int]] = []
    for i, conv in enumerate(progress(convs, desc="dflash estimate: rendering prompts",
                                      unit="chat", total=len(convs), enable=show)):
        before = 0  # tokens of the data's answers so far
        for r, j in enumerate(_turns(conv)):
            if r == len(lengths):
                lengths.append([]), conv_of.append([]), answered.append([])
            ids = _render_or_name(lambda j=j, conv=conv: renderer.prompt_ids(conv[:j]),
                                  f"{source} row {i}")
            lengths[r].append(len(ids))
            conv_of[r].append(i)
            answered[r].append(before)
            before += len(renderer.tokenizer.encode(conv[j]["content"],
                                                    add_special_tokens=False))
    conv_arr = [np.asarray(c, dtype=np.int64) for c in conv_of]
    return RegeneratePrompts(lengths=[np.asarray(x, dtype=np.int64) for x in lengths],
                             conversation=conv_arr,
                             shard=[c // cfg.shard_rows for c in conv_arr],
                             answered=[np.asarray(a, dtype=np.int64) for a in answered],
                             seconds=time.perf_counter() - started)


def cut_answers(convs: list[list[dict[str, str]]], tokenizer: Any,
                cap: int) -> list[list[dict[str, str]]]:
    """Copies of ``convs`` whose earlier answers (assistant turns a later one follows) hold
    at most their first ``cap`` tokens, the longest the target's can be.

    Example (a tokenizer of words)::

        >>> class Words:
        ...     def encode(self, text, add_special_tokens=False): return text.split()
        ...     def decode(self, ids, skip_special_tokens=True): return " ".join(ids)
        >>> conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a b c"},
        ...         {"role": "user", "content": "more"}, {"role": "assistant", "content": "d e f"}]
        >>> [m["content"] for m in cut_answers([conv], Words(), 2)[0]]
        ['hi', 'a b', 'more', 'd e f']
    """
    out = []
    for conv in convs:
        copy = [dict(m) for m in conv]
        for j in _turns(conv)[:-1]:
            ids = tokenizer.encode(conv[j]["content"], add_special_tokens=False)
            if len(ids) > cap:
                copy[j]["content"] = tokenizer.decode(ids[:cap], skip_special_tokens=True)
        out.append(copy)
    return out


def timed_batches(plan: GenerateBatches, k: int) -> np.ndarray:
    """Positions of the ``k`` batches a profile times: spread evenly over the run's batches
    ordered by width (the narrowest and the widest among them).

    >>> plan = plan_batches([np.array([5, 90, 7]), np.array([3, 40])], batch_size=1)
    >>> plan.width.tolist(), timed_batches(plan, 3).tolist()
    ([5, 7, 90, 3, 40], [1, 2, 3])
    """
    if k < 1:
        raise ConfigError(f"--profile-steps must be at least 1 batch, got {k}")
    by_width = np.lexsort((plan.rows, plan.width))
    pick = np.unique(np.linspace(0, plan.batches - 1, min(k, plan.batches)).round()
                     ).astype(np.int64)
    return np.sort(by_width[pick])


def measure_generate_profile(source: str | Path, target: str | Path, cfg: Any, *,
                             prompts: RegeneratePrompts, batches: int = PROFILE_BATCHES,
                             renderer: Any = None) -> GenerateProfile:
    """Time ``batches`` of the run's own batches (after a warm-up of two short prompts) with
    the target loaded as regeneration loads it, and fit a profile.

    A later round's timed prompts hold the data's earlier answers cut to
    ``--max-new-tokens`` (:func:`cut_answers`), so no timed batch is wider than the run's
    can be. On CPU the process gives large freed buffers back as regeneration's does. Its
    start is loading the target plus rendering every prompt. Prints one line to stderr.
    """
    import torch

    from lengthwise.dflash.cost.resident import follow_live_tensors
    from lengthwise.dflash.generate import generate_responses
    from lengthwise.dflash.regenerate import TurnGenerator

    check_one_process()
    renderer = renderer if renderer is not None else _renderer(target, cfg)
    data = _conversations(source, cfg)
    convs = cut_answers(data, renderer.tokenizer, cfg.max_new_tokens)
    lengths = [x.copy() for x in prompts.lengths]  # later rounds rendered with cut answers
    for i in (i for i, (a, b) in enumerate(zip(data, convs, strict=True)) if a != b):
        for r, j in enumerate(_turns(convs[i])[1:], start=1):
            at = int(np.searchsorted(prompts.conversation[r], i))  # conversations ascend
            lengths[r][at] = len(renderer.prompt_ids(convs[i][:j]))
    timed = dataclasses.replace(prompts, lengths=lengths)
    plan = timed.batches(cfg)
    if plan.batches == 0:
        raise DataError(f"{source}: no assistant turn to write")
    picked = timed_batches(plan, batches)
    print(f"lengthwise dflash estimate: timing {picked.size} generate batches of this run on "
          f"{cfg.device} (of {plan.batches:,}; after a warm-up)", file=sys.stderr, flush=True)
    follow_live_tensors(cfg.device)  # as dflash prepare --regenerate runs: its malloc's cost
    started = time.perf_counter()
    gen = TurnGenerator(target, renderer, cfg)
    if gen.backend != "hf":
        raise ConfigError("--time prices Hugging Face generate; this machine would regenerate "
                          f"with {gen.backend}: time it with --backend hf or price it there")
    loaded = time.perf_counter() - started

    def prompt_ids(b: int, first: int | None = None) -> list[np.ndarray]:
        """The prompt ids of the ``b``-th batch of its shard's round."""
        k, r = int(plan.shard[b]), int(plan.round[b])
        index = int(np.sum((plan.shard[:b] == k) & (plan.round[:b] == r)))
        return [np.asarray(renderer.prompt_ids(convs[int(i)][:_turns(convs[int(i)])[r]]),
                           dtype=np.int64)
                for i in timed.members(k, r, index, cfg)[:first]]

    generate_responses(gen.model, prompt_ids(0, 2), max_new_tokens=2, eos=gen.stops,
                       temperature=0.0, seed=0, batch_size=2, device=gen.device)  # warm-up
    rows, width, steps, seconds, responses = [], [], [], [], []
    for b in picked:
        batch = prompt_ids(int(b))
        t0 = time.perf_counter()
        outs = gen._generate(batch, seed=int(b))
        seconds.append(time.perf_counter() - t0)
        lens = [max(1, len(o)) for o in outs]
        rows.append(len(batch))
        width.append(max(p.size for p in batch))
        steps.append(max(lens))
        responses += lens
    prof = fit_generate_profile(rows, width, steps, seconds,
                                device=device_name(cfg.device, torch.get_num_threads()),
                                responses=responses, max_new_tokens=cfg.max_new_tokens,
                                start_seconds=loaded + prompts.seconds)
    return dataclasses.replace(prof, fit={**prof.fit, "load_seconds": round(loaded, 3),
                                          "render_seconds": round(prompts.seconds, 3)})


def _renderer(target: str | Path, cfg: Any) -> Any:
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.target import load_tokenizer

    return ChatRenderer(load_tokenizer(target), enable_thinking=cfg.enable_thinking,
                        name=f"--target {target}")


def estimate_regenerate_time(source: str | Path, target: str | Path, cfg: Any, *,
                             world: int = 1, profile: GenerateProfile | None = None,
                             batches: int = PROFILE_BATCHES, show: bool = True,
                             ) -> tuple[GenerateTime, GenerateProfile, RegeneratePrompts]:
    """The predicted time of ``dflash prepare --regenerate`` of ``source`` at ``world``
    ranks, priced by ``profile`` or by one measured here; with the profile and the prompts
    priced (later rounds' with the target's answers: their longest sizes the memory
    estimate)."""
    renderer = _renderer(target, cfg)
    prompts = regenerate_prompts(source, renderer, cfg, show=show)
    if profile is None:
        profile = measure_generate_profile(source, target, cfg, prompts=prompts,
                                           batches=batches, renderer=renderer)
    answered = prompts.with_answers(profile.mean_answer(cfg.max_new_tokens))
    timing = predict_generate(answered.batches(cfg), profile, world=world,
                              max_new_tokens=cfg.max_new_tokens)
    return timing, profile, answered
