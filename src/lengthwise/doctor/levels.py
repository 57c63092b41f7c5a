"""Levels: the loss of each length range in a log whose every line holds one length bucket.

A per-micro-batch log (its ``plan`` event says ``view: micro-batch``) holds one
micro-batch's loss per line, and a padded micro-batch is drawn whole from one length
bucket, so the lines can sit at one level per bucket: the seeds' "fluffy" curve. The
test, on the lines of the stable region:

* the loss is detrended as for bands (:func:`~lengthwise.doctor.bands.band_residual`);
* adjacent buckets (in length order) are merged into at most ``MAX_RANGES`` length
  ranges of about equal line counts, each of at least ``MIN_LINES`` lines: a plan's
  fine buckets (the demo's has 54) leave too few lines per bucket to estimate its level;
* the statistic is the share of the variance between the ranges (eta^2, the one-way
  ANOVA's F in another form); its p-value comes from ``PERMUTATIONS`` shuffles of the
  lines within consecutive windows of ``BLOCK`` lines, so that what the detrending left of
  the trend cannot pose as levels;
* the ranges must alternate at least ``MIN_ALTERNATION`` as often as in random order: when
  buckets come in runs (sorted batches), levels cannot be told from a drifting loss, and the
  test is not made;
* levels are found when p < ``ALPHA`` (0.01, the attribution's level); the share beyond
  chance is ``(eta^2 - chance) / (1 - chance)``, chance being the shuffles' mean.

A line's bucket is the plan's bucket index, a whole number from 0 to one less than the
plan's edges (any non-negative whole number when the plan names no edges). A line whose
bucket is anything else (a string, a negative or fractional number, an index past the
plan's edges) belongs to no length range: it is left out of the test and counted
(``invalid``, the first values shown in the note). A log with no bucket field at all is not
tested (:data:`NO_BUCKET_FIELD`).

Example::

    >>> rng = np.random.default_rng(0)
    >>> b = rng.integers(0, 3, 120)
    >>> y = 5.0 + np.array([-0.1, 0.0, 0.1])[b] + 0.05 * rng.standard_normal(120)
    >>> lv = bucket_levels(y - 5.0, y, b.tolist(), edges=[20, 60, 256])
    >>> lv.found, [r["lengths"] for r in lv.ranges]
    (True, ['up to 20', '21-60', '61-256'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

#: at most this many length ranges
MAX_RANGES = 6
#: every range holds at least this many lines
MIN_LINES = 10
#: lines are shuffled within windows of this many consecutive lines
BLOCK = 10
#: the ranges must alternate at least this share as often as in random order
MIN_ALTERNATION = 0.5
PERMUTATIONS = 999
ALPHA = 0.01
#: the shuffles are drawn and scored a few at a time, at most this many shuffled lines at once,
#: so that the test's memory does not grow with the log (999 shuffles of every line would
#: take 16 KiB a line)
CHUNK_LINES = 1 << 20


@dataclass(frozen=True)
class BucketLevels:
    """The loss level of each length range of a log whose lines each hold one bucket."""

    lines: int = 0
    ranges: list[dict[str, Any]] = field(default_factory=list)
    share: float | None = None
    chance: float | None = None
    p_value: float | None = None
    note: str = ""
    #: lines left out because their bucket is not one of the plan's bucket indices
    invalid: int = 0

    @property
    def found(self) -> bool:
        """Whether the ranges' levels differ beyond chance (p < ``ALPHA``)."""
        return self.p_value is not None and self.p_value < ALPHA

    @property
    def beyond_chance(self) -> float | None:
        """The share the ranges explain beyond chance, ``(share - chance) / (1 - chance)``."""
        if self.share is None or self.chance is None or self.chance >= 1.0:
            return None
        return max(0.0, (self.share - self.chance) / (1.0 - self.chance))

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``levels`` key of the attribution)."""

        def r(v: float | None) -> float | None:
            return None if v is None else round(float(v), 4)

        return {"lines": self.lines, "ranges": self.ranges, "share": r(self.share),
                "chance": r(self.chance), "beyond_chance": r(self.beyond_chance),
                "p_value": r(self.p_value), "found": self.found,
                "invalid_bucket_lines": self.invalid,
                "test": f"eta^2 of length ranges, {PERMUTATIONS} shuffles within windows of "
                        f"{BLOCK} lines, alpha={ALPHA}", "note": self.note}


def length_ranges(ids: list[Any], counts: list[int], lines: int) -> list[int]:
    """The range of each bucket (``ids`` in length order, ``counts`` lines each): adjacent
    buckets merged into at most ``MAX_RANGES`` ranges of about equal lines, each of at least
    ``MIN_LINES`` (a range short of them joins its smaller neighbour).

    Example::

        >>> length_ranges([0, 1, 2, 3], [30, 30, 5, 30], 95)
        [0, 1, 1, 2]
    """
    k = min(MAX_RANGES, len(ids), lines // MIN_LINES)
    if k < 2:
        return [0] * len(ids)
    starts = np.cumsum([0, *counts[:-1]])
    group = [min(k - 1, int((s + c / 2) / lines * k)) for s, c in zip(starts, counts,
                                                                       strict=True)]
    while True:
        names = sorted(set(group))
        sizes = [sum(c for g, c in zip(group, counts, strict=True) if g == n) for n in names]
        small = [i for i, s in enumerate(sizes) if s < MIN_LINES]
        if not small or len(names) < 2:
            return [names.index(g) for g in group]
        i = small[0]
        j = i + 1 if i == 0 else i - 1 if i == len(names) - 1 else (
            i - 1 if sizes[i - 1] <= sizes[i + 1] else i + 1)
        group = [names[j] if g == names[i] else g for g in group]


def range_label(lo: Any, hi: Any, edges: list[int] | None) -> str | None:
    """Token lengths of buckets ``lo..hi`` (bucket ``k``: ``edges[k-1] < length <= edges[k]``).

    >>> range_label(1, 2, [10, 20, 40]), range_label(0, 0, [10, 20, 40]), range_label(0, 3, None)
    ('11-40', 'up to 10', None)
    """
    if not edges or not all(isinstance(v, int) and 0 <= v < len(edges) for v in (lo, hi)):
        return None
    return f"{edges[lo - 1] + 1}-{edges[hi]}" if lo > 0 else f"up to {edges[hi]}"


def alternation(group: np.ndarray) -> float:
    """How often consecutive lines change range, as a share of what random order gives,
    ``(n - 1)(1 - sum w^2)``.

    >>> alternation(np.tile([0, 1], 20)) > 1.5, alternation(np.repeat([0, 1], 20)) < 0.1
    (True, True)
    """
    w = np.bincount(group) / group.size
    expected = (group.size - 1) * (1.0 - float(np.sum(w**2)))
    return int(np.count_nonzero(np.diff(group))) / expected if expected > 0 else 0.0


#: the levels of a per-micro-batch log none of whose lines logs its bucket
NO_BUCKET_FIELD = BucketLevels(note="not tested: no line logs its length bucket (a `bucket` or "
                               "`buckets` field)")
#: invalid bucket values shown in the note
SHOWN_INVALID = 3


def _one_bucket(b: Any) -> Any:
    """The line's bucket: an id, or a list of one id (None: none, or several)."""
    if isinstance(b, list | tuple):
        return b[0] if len(b) == 1 else None
    return b


def is_bucket_index(b: Any, buckets: int | None) -> bool:
    """Whether ``b`` is a bucket index of a plan of ``buckets`` buckets (None: unknown count).

    >>> [is_bucket_index(b, 4) for b in (0, 3, 4, -1, "2", 1.0, 1.5, True)]
    [True, True, False, False, False, True, False, False]
    """
    if isinstance(b, bool) or not isinstance(b, int | float | np.integer | np.floating):
        return False
    if not (math.isfinite(b) and b == int(b)):
        return False
    return 0 <= b and (buckets is None or b < buckets)


def _invalid_note(values: list[Any], buckets: int | None) -> str:
    """``2 line(s) left out, their bucket not ...: 999, 'x'``: what the buckets should be.

    >>> _invalid_note([999, "x", 999], 54)
    "3 line(s) left out, their bucket not one of the plan's 54 bucket indices (0-53): 999, 'x'"
    """
    shown = list(dict.fromkeys(repr(v) for v in values))
    more = ", ..." if len(shown) > SHOWN_INVALID else ""
    want = (f"one of the plan's {buckets} bucket indices (0-{buckets - 1})" if buckets
            else "a bucket index (a whole number from 0)")
    return (f"{len(values)} line(s) left out, their bucket not {want}: "
            f"{', '.join(shown[:SHOWN_INVALID])}{more}")


def _eta_squared(y: np.ndarray, onehot: np.ndarray, n: np.ndarray | None = None) -> np.ndarray:
    """Between-range share of the variance of each row of ``y`` (ranges: ``onehot`` columns,
    of ``n`` lines each, summed from ``onehot`` unless given)."""
    n = onehot.sum(axis=0) if n is None else n
    centred = y - y.mean(axis=-1, keepdims=True)
    sst = (centred**2).sum(axis=-1)
    ssb = ((centred @ onehot) ** 2 / n).sum(axis=-1)
    return np.where(sst > 0, ssb / np.where(sst > 0, sst, 1.0), 0.0)


def block_shuffles(n: int, rng: np.random.Generator, count: int = PERMUTATIONS) -> np.ndarray:
    """``count`` permutations of ``range(n)`` that move each index only within its window of
    ``BLOCK`` consecutive indices.

    >>> p = block_shuffles(25, np.random.default_rng(0), 3)
    >>> bool(np.all(p // BLOCK == np.arange(25) // BLOCK))
    True
    """
    return _block_shuffles(np.arange(n) // BLOCK, rng, count)


def _block_shuffles(windows: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
    """:func:`block_shuffles` of the lines whose windows are ``windows`` (index // BLOCK)."""
    return np.argsort(windows + rng.random((count, windows.size)), axis=1)


def shuffled_shares(
    y: np.ndarray, onehot: np.ndarray, rng: np.random.Generator, count: int = PERMUTATIONS,
) -> np.ndarray:
    """eta^2 of ``count`` block shuffles of ``y`` (:func:`block_shuffles`), drawn and scored
    at most ``CHUNK_LINES`` shuffled lines at a time.

    The generator fills the shuffles' keys row after row, so the chunks draw the same numbers
    in the same order as one call of :func:`block_shuffles` would: the same shuffles, scored
    the same way, in memory that does not grow with ``count``.

    >>> y, onehot = np.arange(40.0) % 3, np.eye(2)[np.arange(40) % 2]
    >>> whole = _eta_squared(y[block_shuffles(40, np.random.default_rng(1), 9)], onehot)
    >>> bool(np.allclose(shuffled_shares(y, onehot, np.random.default_rng(1), 9), whole))
    True
    """
    rows = max(1, CHUNK_LINES // max(y.size, 1))
    out = np.empty(count, dtype=np.float64)
    windows, sizes = np.arange(y.size) // BLOCK, onehot.sum(axis=0)  # the same for every chunk
    for start in range(0, count, rows):
        stop = min(count, start + rows)
        out[start:stop] = _eta_squared(y[_block_shuffles(windows, rng, stop - start)], onehot,
                                       sizes)
    return out


def bucket_levels(
    resid: np.ndarray,
    loss: np.ndarray,
    buckets: list[Any],
    *,
    edges: list[int] | None = None,
    rng: np.random.Generator | None = None,
) -> BucketLevels:
    """Test whether the lines' length ranges sit at different levels (see the module docstring).

    ``resid`` is the detrended loss of the lines in time order, ``loss`` their loss,
    ``buckets`` the bucket of each line (one id; lines without one are left out) and
    ``edges`` the plan's bucket edges, which name each range's token lengths.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    count = len(edges) if edges else None
    one = [_one_bucket(b) for b in buckets]
    ok = np.array([b is not None and is_bucket_index(b, count) for b in one], dtype=bool)
    bad = [b for b, k in zip(one, ok.tolist(), strict=True) if b is not None and not k]
    labels = [int(b) for b, k in zip(one, ok.tolist(), strict=True) if k]
    y, v = np.asarray(resid, dtype=np.float64)[ok], np.asarray(loss, dtype=np.float64)[ok]
    ids = sorted(set(labels))
    result = _levels(y, v, labels, ids, edges, rng)
    if not bad:
        return result
    left_out = _invalid_note(bad, count)
    return replace(result, invalid=len(bad),
                   note=f"{result.note}; {left_out}" if result.note else left_out)


def _levels(
    y: np.ndarray, v: np.ndarray, labels: list[int], ids: list[int], edges: list[int] | None,
    rng: np.random.Generator,
) -> BucketLevels:
    """The test on the lines with a valid bucket: detrended loss ``y``, loss ``v``, buckets."""
    if len(ids) < 2 or y.size < 2 * MIN_LINES:
        return BucketLevels(lines=int(y.size), note=f"not tested: {y.size} lines with one "
                            f"bucket each, {len(ids)} bucket(s) (need {2 * MIN_LINES} lines, "
                            "2 buckets)")
    pos = {b: i for i, b in enumerate(ids)}
    codes = np.array([pos[b] for b in labels])
    counts = np.bincount(codes, minlength=len(ids))
    group = np.asarray(length_ranges(ids, counts.tolist(), int(y.size)))[codes]
    k = int(group.max()) + 1
    if k < 2:
        return BucketLevels(lines=int(y.size), note="not tested: too few lines for two "
                            f"length ranges of {MIN_LINES}")
    switches = alternation(group)
    if switches < MIN_ALTERNATION:
        return BucketLevels(lines=int(y.size), note=(
            f"not tested: the length ranges come in runs (they alternate {switches:.0%} as often "
            f"as in random order; need {MIN_ALTERNATION:.0%}), so levels cannot be told from "
            "the loss's drift"))
    onehot = np.eye(k)[group]
    share = float(_eta_squared(y, onehot))
    shuffled = shuffled_shares(y, onehot, rng)
    p = (1 + int((shuffled >= share - 1e-12).sum())) / (1 + PERMUTATIONS)
    ranges = []
    for j in range(k):
        sel = group == j
        members = sorted({labels[i] for i in np.flatnonzero(sel)}, key=ids.index)
        ranges.append({"buckets": [members[0], members[-1]],
                       "lengths": range_label(members[0], members[-1], edges),
                       "lines": int(sel.sum()), "mean_loss": round(float(v[sel].mean()), 6),
                       "mean_offset": round(float(y[sel].mean()), 6)})
    return BucketLevels(lines=int(y.size), ranges=ranges, share=share,
                        chance=float(shuffled.mean()), p_value=p)
