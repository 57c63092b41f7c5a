"""Seconds of regeneration (``dflash prepare --regenerate``) before it runs.

Regeneration answers every assistant turn of every conversation with the target itself:
shard by shard (``--shard-rows`` conversations, ranks taking shards in turn), round by
round (the ``r``-th assistant turn of every conversation), in batches of prompts sorted by
length, at most ``--batch-size`` of them and ``--max-tokens`` padded prompt plus new tokens
(:func:`batch_offsets`; :class:`~lengthwise.dflash.regenerate.TurnGenerator`).
:func:`plan_batches` replays that order on the prompts' lengths and gives every batch's
rows and width (its longest prompt, the others left-padded to it).

A batch's time is its prefill (``rows * width`` padded prompt tokens) and its decoding:
priced as if it ran until every row has written its stop token or ``--max-new-tokens`` (an
upper bound: a row that stops leaves the batch), a batch decodes as many steps as its
longest response, each step for all its rows, and
attends over every pair of its tokens (the prompt's causal pairs in the prefill, the cache
at each step). The responses' lengths are not known before the target writes them: a
:class:`GenerateProfile` holds those the target wrote in a few timed batches of the run's
own prompts, and a batch of ``rows`` is priced at the expected longest of ``rows`` of them
(:func:`expected_longest`). :func:`fit_generate_profile` fits the seconds per prefill
token, per decoding step, per row and step and per attended pair on the timed batches.

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

import reprlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.dflash.run_time import duration, read_profile, save_profile
from lengthwise.errors import ConfigError, DataError

__all__ = ["GenerateBatches", "GenerateProfile", "GenerateTime", "attended_pairs",
           "batch_offsets", "expected_longest",
           "fit_generate_profile", "plan_batches", "predict_generate"]


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

    @property
    def prompts(self) -> int:
        return int(self.rows.sum())


def batch_offsets(lengths: np.ndarray, *, batch_size: int, max_tokens: int | None,
                  max_new_tokens: int) -> np.ndarray:
    """Boundaries of the batches regeneration cuts prompts of ``lengths`` (ascending) into:
    consecutive runs of at most ``batch_size`` prompts whose rows, each padded to the
    longest prompt and given ``max_new_tokens`` more, hold at most ``max_tokens`` tokens
    (None: no limit; a prompt over it alone). The planner's greedy cut
    (:func:`lengthwise.planning.batching.greedy_batches`).

    Example::

        >>> batch_offsets(np.array([3, 4, 6, 8]), batch_size=3, max_tokens=30,
        ...               max_new_tokens=4).tolist()
        [0, 3, 4]
    """
    from lengthwise.planning.batching import greedy_batches, row_limit

    n = int(np.asarray(lengths).size)
    cuts = [0, n]
    if max_tokens is not None and n:
        cuts = greedy_batches(np.arange(n), np.asarray(lengths, dtype=np.int64) + max_new_tokens,
                              row_limit(max_tokens=max_tokens))[1].tolist()
    starts = [s for a, b in zip(cuts[:-1], cuts[1:], strict=True) for s in range(a, b, batch_size)]
    return np.asarray(starts + [n], dtype=np.int64)


def plan_batches(rounds: list[np.ndarray], *, batch_size: int, max_tokens: int | None = None,
                 max_new_tokens: int = 0, shards: list[np.ndarray] | None = None,
                 ) -> GenerateBatches:
    """The batches of regeneration: ``rounds[r]`` holds the prompt lengths of round ``r``
    (the ``r``-th assistant turn of each conversation that has one) and ``shards[r]`` their
    conversations' shards (all one shard when not given). Each shard's rounds run in turn,
    each round's prompts sorted by length and cut by :func:`batch_offsets`.

    Example::

        >>> b = plan_batches([np.array([3, 8, 4, 6]), np.array([12, 5])], batch_size=3,
        ...                  shards=[np.array([0, 0, 1, 1]), np.array([0, 1])])
        >>> b.shard.tolist(), b.round.tolist(), b.rows.tolist(), b.width.tolist()
        ([0, 0, 1, 1], [0, 1, 0, 1], [2, 1, 2, 1], [8, 12, 6, 5])
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    rows, width, shard, rnd = [], [], [], []
    lens = [np.asarray(x, dtype=np.int64) for x in rounds]
    where = ([np.asarray(s, dtype=np.int64) for s in shards] if shards is not None
             else [np.zeros(x.size, dtype=np.int64) for x in lens])
    if len(where) != len(lens) or any(s.shape != x.shape for s, x in zip(where, lens,
                                                                           strict=True)):
        raise DataError("plan_batches: one shard per prompt of every round")
    every = np.unique(np.concatenate(where)) if lens else np.zeros(0, dtype=np.int64)
    for k in every:
        for r, (x, s) in enumerate(zip(lens, where, strict=True)):
            mine = np.sort(x[s == k], kind="stable")
            if mine.size == 0:
                continue
            cuts = batch_offsets(mine, batch_size=batch_size, max_tokens=max_tokens,
                                 max_new_tokens=max_new_tokens)
            rows.append(np.diff(cuts))
            width.append(mine[cuts[1:] - 1])
            shard.append(np.full(cuts.size - 1, k))
            rnd.append(np.full(cuts.size - 1, r))

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    return GenerateBatches(rows=cat(rows), width=cat(width), shard=cat(shard), round=cat(rnd))


def attended_pairs(rows: Any, width: Any, steps: Any) -> np.ndarray:
    """Token pairs a batch attends: per row the prompt's causal pairs (``width**2 / 2``, the
    padding included) and at each decoding step the cache so far (``width + s``).

    Example::

        >>> attended_pairs(2, 10, 4).tolist()
        196.0
    """
    r, w, s = (np.asarray(a, dtype=np.float64) for a in (rows, width, steps))
    return r * (w * w / 2 + s * (w + s / 2))


def expected_longest(responses: Any, rows: Any, cap: int) -> np.ndarray:
    """The expected longest of ``rows`` responses drawn from ``responses`` (lengths in
    tokens, each at most ``cap``): ``sum_v v * (F(v)**rows - F(v-)**rows)`` over the
    empirical distribution ``F``, for every count in ``rows``.

    Example::

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
class GenerateProfile:
    """Seconds per unit of a generate batch on one device, and the responses it timed.

    ``per_prefill_token``: seconds per padded prompt token; ``per_step``: per decoding
    step of a batch, whatever its rows (the weights read once a step); ``per_row_step``:
    per row and step; ``per_pair``: per token pair attended (:func:`attended_pairs`: what
    grows with the square of the width); ``responses``: the lengths the target wrote in the
    timed batches (with the stop token, at most ``max_new_tokens``); ``start_seconds``: loading the
    target and rendering the prompts; ``fit``: the timed batches and how well the fit
    repeats them.
    """

    device: str
    per_prefill_token: float
    per_step: float
    per_row_step: float
    per_pair: float
    responses: list[int]
    max_new_tokens: int
    start_seconds: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)

    def batch_seconds(self, rows: Any, width: Any, steps: Any) -> np.ndarray:
        """Predicted seconds of batches of ``rows`` prompts of ``width`` decoding ``steps``."""
        r, w, s = (np.asarray(a, dtype=np.float64) for a in (rows, width, steps))
        return (self.per_prefill_token * r * w + self.per_step * s + self.per_row_step * r * s
                + self.per_pair * attended_pairs(r, w, s))

    def mean_answer(self, cap: int) -> float:
        """Mean tokens of an answer the target writes under ``cap``: its responses cut there,
        without the stop token of those that ended (the template writes its own).

        Example::

            >>> GenerateProfile("cpu", 0, 0, 0, 0, responses=[5, 17, 30], max_new_tokens=32
            ...                 ).mean_answer(16)    # (4 + 16 + 16) / 3
            12.0
        """
        resp = np.asarray(self.responses, dtype=np.float64)
        ended = resp < self.max_new_tokens
        cut = np.minimum(resp, cap)
        return float(np.mean(np.where(ended & (resp <= cap), cut - 1, cut)))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (``--save-profile``)."""
        save_profile(self, path)

    @classmethod
    def load(cls, path: str | Path) -> GenerateProfile:
        """A profile written by :meth:`save` (``--device-profile``); a clear error otherwise.

        Example::

            >>> import tempfile, os
            >>> f = os.path.join(tempfile.mkdtemp(), "g.json")
            >>> GenerateProfile("cpu", 1e-4, 0.02, 1e-3, 1e-8, [5, 9], 16).save(f)
            >>> GenerateProfile.load(f).responses
            [5, 9]
        """
        where = f"--device-profile {path}"
        costs = ("per_prefill_token", "per_step", "per_row_step", "per_pair")
        names = ("device", *costs, "responses", "max_new_tokens")
        data = read_profile(path, kind="regeneration",
                            write="dflash estimate --stage regenerate --time --save-profile",
                            required=names[1:], costs=(*costs, "start_seconds"), priced=costs,
                            timed="batches")
        cap, resp = data["max_new_tokens"], data["responses"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise DataError(f"{where}: max_new_tokens must be a count >= 1, got "
                            f"{reprlib.repr(cap)}")
        if (not isinstance(resp, list) or not resp
                or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= cap
                           for x in resp)):
            raise DataError(f"{where}: responses must be a list of lengths from 1 to "
                            f"max_new_tokens ({cap})")
        return cls(**{k: data[k] for k in (*names, "start_seconds", "fit") if k in data})


def fit_generate_profile(rows: Any, width: Any, steps: Any, seconds: Any, *, device: str,
                         responses: list[int], max_new_tokens: int,
                         start_seconds: float = 0.0) -> GenerateProfile:
    """Fit ``seconds = per_prefill_token * rows * width + per_step * steps + per_row_step *
    rows * steps + per_pair * attended_pairs(rows, width, steps)`` to timed batches:
    non-negative least squares on relative residuals (each batch counts alike); terms the
    batches cannot tell apart are left at 0.

    Example::

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
    from lengthwise.pytorch.calibrate import _nnls

    x = np.stack([r * w, s, r * s, attended_pairs(r, w, s)], axis=1)
    coef = _nnls(x / y[:, None], np.ones_like(y))
    if not np.any(coef > 0):  # one batch, or nothing to tell apart: time per step and row
        coef = np.array([0.0, 0.0, float(np.sum(y * r * s / y**2) / np.sum((r * s / y) ** 2)),
                         0.0])
    pred = x @ coef
    err = np.abs(pred - y) / y
    return GenerateProfile(
        device=device, per_prefill_token=float(round(coef[0], 12)),
        per_step=float(round(coef[1], 12)), per_row_step=float(round(coef[2], 12)),
        per_pair=float(round(coef[3], 15)),
        responses=[int(v) for v in responses], max_new_tokens=int(max_new_tokens),
        start_seconds=float(start_seconds),
        fit={"batches": int(y.size), "seconds": y.round(4).tolist(), "rows": r.tolist(),
             "width": w.tolist(), "steps": s.tolist(),
             "median_relative_error": float(np.median(err)),
             "max_relative_error": float(err.max())})


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
        n = int(self.rows.sum())
        mean = float(self.batch_seconds.mean()) if self.batch_seconds.size else 0.0
        ranks = f" on each of {self.world} ranks" if self.world > 1 else ""
        extra = (f"; {duration(self.start_seconds, exact=True)} to start"
                 if self.start_seconds else "")
        return (f"about {duration(self.total_seconds, exact=True)} for {n:,} responses in "
                f"{self.batch_seconds.size:,} batches{ranks} "
                f"({duration(mean, exact=True)} a batch{extra}) on {self.device}")


def predict_generate(plan: GenerateBatches, profile: GenerateProfile, *, world: int = 1,
                     max_new_tokens: int | None = None) -> GenerateTime:
    """Every batch's predicted seconds; rank ``k % world`` runs shard ``k``.

    ``max_new_tokens``: the run's cap (the profile's when not given). A cap above the
    profile's is refused where the timed responses were cut at it: how much longer they
    would have run is not known.
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
