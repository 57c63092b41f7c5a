"""What the batch composition explains: attribution, per-bucket levels, the noise budget.

``bucket_r2`` regresses the detrended loss on each step's bucket shares and ``length_r2`` is
eta^2 over length deciles, each with a permutation p-value and the share beyond chance. A
per-micro-batch log is tested for one level per length range. The noise budget splits the
step-to-step variance into sampling, composition, schedule and the rest. The methods are in
docs/doctor.md (Attribution, Noise budget).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> b = rng.integers(0, 3, 900)
    >>> resid = np.array([-0.2, 0.0, 0.2])[b] + 0.02 * rng.standard_normal(900)
    >>> a = attribute(resid, loss=resid + 2, buckets=b.tolist())
    >>> round(a.bucket_r2, 2), a.bucket_p_value < 0.01
    (0.99, True)
    >>> rng = np.random.default_rng(0)
    >>> b = rng.integers(0, 3, 120)
    >>> y = 5.0 + np.array([-0.1, 0.0, 0.1])[b] + 0.05 * rng.standard_normal(120)
    >>> lv = bucket_levels(y - 5.0, y, b.tolist(), edges=[20, 60, 256])
    >>> lv.found, [r["lengths"] for r in lv.ranges]
    (True, ['up to 20', '21-60', '61-256'])
    >>> rng = np.random.default_rng(0)
    >>> resid = rng.standard_normal(2000) * 0.1
    >>> nb = noise_budget(resid, loss_sample_std=np.full(2000, 0.8), samples=np.full(2000, 64.0))
    >>> round(nb.excess, 1), round(nb.shares["sampling"], 1)
    (1.0, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lengthwise.doctor.numeric import (
    ROUGHNESS_WINDOW,
    JsonForm,
    digits,
    fixed,
    num,
    rolling_mean,
)

PERMUTATIONS = 199
#: permutation tests use a random subset of at most this many steps
MAX_PERMUTED = 20_000
LENGTH_BINS = 10
#: mean share of a step's main bucket from which its steps read as single-bucket steps
MOSTLY_SINGLE = 0.9
#: R-squared at or above which composition counts as a cause
STRONG_R2 = 0.2
ALPHA = 0.01
#: a permutation p-value below this is reported in the verdict (as a weak cause when small)
REPORT_ALPHA = 0.05
TO_LOG = [
    "bucket: the length-bucket id of each step's batch (buckets: the ids of all its micro-batches)",
    "real_tokens and samples per step (or seq_len), to relate the loss to sequence length",
    "bucket_loss: a running loss per bucket",
]


@dataclass(frozen=True)
class Attribution(JsonForm):
    """How well bucket or length explains the detrended per-step loss."""

    bucket_field: str | None = None
    bucket_r2: float | None = None
    bucket_p_value: float | None = None
    bucket_r2_chance: float | None = None
    single_bucket: bool | None = None  # every step holds one bucket (90 % of it on average)
    per_bucket: list[dict[str, Any]] = field(default_factory=list)
    length_field: str | None = None
    length_r2: float | None = None
    length_p_value: float | None = None
    bucket_groups: int = 0
    length_groups: int = 0
    logged_bucket_loss: dict[str, float] | None = None
    likely_cause: str | None = None
    to_log: list[str] = field(default_factory=list)
    note: str = ""
    #: the level of each length range, in a log whose lines each hold one micro-batch
    levels: BucketLevels | None = None

    @property
    def bucket_r2_adjusted(self) -> float | None:
        """The share the bucket explains beyond chance: ``(R^2 - chance) / (1 - chance)``, >= 0.

            >>> Attribution(bucket_r2=0.625, bucket_r2_chance=0.25).bucket_r2_adjusted
            0.5
        """
        if self.bucket_r2 is None:
            return None
        chance = self.bucket_r2_chance or 0.0
        if chance >= 1.0:
            return 0.0
        return max(0.0, (self.bucket_r2 - chance) / (1.0 - chance))

    @property
    def bucket_explains(self) -> bool:
        """True when the bucket explains a significant share of at least ``STRONG_R2`` beyond
        chance."""
        adjusted = self.bucket_r2_adjusted
        return (adjusted is not None and self.bucket_p_value is not None
                and adjusted >= STRONG_R2 and self.bucket_p_value < ALPHA)

    @property
    def explains(self) -> bool:
        """True when the bucket (or length) explains a significant, sizeable share."""
        for r2, p in ((self.bucket_r2_adjusted, self.bucket_p_value),
                      (self.length_r2, self.length_p_value)):
            if r2 is not None and p is not None and r2 >= STRONG_R2 and p < ALPHA:
                return True
        return False

    JSON = {"bucket_field": None, **{k: fixed(4) for k in (
                "bucket_r2", "bucket_p_value", "bucket_r2_chance", "bucket_r2_adjusted")},
            "single_bucket": None, "per_bucket": None, "length_field": None,
            "length_r2": fixed(4), "length_p_value": fixed(4), "logged_bucket_loss": None,
            "likely_cause": None, "to_log": None, "note": None, "levels": None}


def composition(buckets: list[Any]) -> tuple[np.ndarray, list[Any], np.ndarray]:
    """Share matrix (steps x buckets), the bucket ids, and a mask of steps with a label."""
    ids: dict[Any, int] = {}
    rows = [() if b is None else tuple(b) if isinstance(b, tuple | list) else (b,)
            for b in buckets]
    for row in rows:
        for b in row:
            ids.setdefault(b, len(ids))
    shares = np.zeros((len(rows), max(len(ids), 1)))
    for i, row in enumerate(rows):
        for b in row:
            shares[i, ids[b]] += 1.0 / len(row)
    has = np.array([bool(row) for row in rows], dtype=bool)
    order = sorted(ids, key=_sort_key)
    cols = [ids[b] for b in order]
    return shares[:, cols] if ids else shares, order, has


def row_codes(buckets: list[Any]) -> tuple[np.ndarray, list[Any], bool]:
    """Each row's bucket as an index into the sorted bucket ids (-1: none, or several
    different ones), the ids, and whether some row holds several: the composition of
    single-bucket rows without its rows x buckets matrix.

    >>> codes, ids, mixed = row_codes([3, (1,), None, (1, 3), [3, 3]])
    >>> codes.tolist(), ids, mixed
    ([1, 0, -1, -1, 1], [1, 3], True)
    """
    ids: dict[Any, int] = {}
    raw = np.full(len(buckets), -1, dtype=np.int64)
    mixed = False
    for i, b in enumerate(buckets):
        if type(b) is tuple or type(b) is list:
            labels = set(b)
            for label in labels:
                ids.setdefault(label, len(ids))
            if len(labels) != 1:
                mixed = mixed or len(labels) > 1
                continue
            (b,) = labels
        if b is not None:
            raw[i] = ids.setdefault(b, len(ids))
    order = sorted(ids, key=_sort_key)
    remap = np.empty(len(ids) + 1, dtype=np.int64)
    remap[-1] = -1
    for new, b in enumerate(order):
        remap[ids[b]] = new
    return remap[raw], order, mixed


def _sort_key(x: Any) -> tuple[int, Any]:
    return (0, x) if isinstance(x, int | float) else (1, str(x))


def r_squared(y: np.ndarray, shares: np.ndarray) -> float:
    """R-squared of ``y`` on the share columns (with intercept; one column dropped)."""
    sst = float(((y - y.mean()) ** 2).sum())
    if sst <= 0 or shares.shape[1] < 2:
        return 0.0
    a = np.column_stack([np.ones(y.size), shares[:, :-1]])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    ssr = float(((y - a @ coef) ** 2).sum())
    return max(0.0, 1.0 - ssr / sst)


def eta_squared(y: np.ndarray, groups: np.ndarray) -> float:
    """Between-group share of the variance of ``y`` (groups: int codes)."""
    sst = float(((y - y.mean()) ** 2).sum())
    if sst <= 0:
        return 0.0
    counts = np.bincount(groups)
    sums = np.bincount(groups, weights=y)
    ok = counts > 0
    means = sums[ok] / counts[ok]
    ssb = float((counts[ok] * (means - y.mean()) ** 2).sum())
    return ssb / sst


def _permuted(stat: float, y: np.ndarray, fn: Any, rng: np.random.Generator,
              ) -> tuple[float, float]:
    """Permutation p-value of ``fn(y) = stat`` (199 shuffles) and the shuffles' mean value."""
    values = np.array([fn(rng.permutation(y)) for _ in range(PERMUTATIONS)])
    return (1 + int((values >= stat).sum())) / (1 + PERMUTATIONS), float(values.mean())


def _subsample(n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of at most ``MAX_PERMUTED`` steps for the permutation tests (all when fewer)."""
    if n <= MAX_PERMUTED:
        return np.arange(n)
    return np.sort(rng.choice(n, MAX_PERMUTED, replace=False))


def attribute(resid: np.ndarray, *, loss: np.ndarray, buckets: list[Any] | None = None,
              length: np.ndarray | None = None, length_field: str | None = None,
              rng: np.random.Generator | None = None, structure_found: bool = False,
              logged_bucket_loss: dict[str, float] | None = None) -> Attribution:
    """Explain detrended per-step losses ``resid`` by bucket shares and/or length (with
    ``structure_found`` and neither logged: batch composition as the likely cause)."""
    rng = np.random.default_rng(0) if rng is None else rng
    fields: dict[str, Any] = {"logged_bucket_loss": logged_bucket_loss}
    if buckets is not None:
        fields.update(_bucket_fields(resid, loss, buckets, rng))
    if length is not None:
        fields.update(_length_fields(resid, length, length_field, rng))
    if structure_found and "bucket_r2" not in fields and "length_r2" not in fields:
        fields.update(likely_cause=("batch composition: which length bucket each step's batch "
                                    "came from, or how long its sequences were"),
                      to_log=list(TO_LOG))
    return Attribution(**fields)


def _bucket_fields(resid: np.ndarray, loss: np.ndarray, buckets: list[Any],
                   rng: np.random.Generator) -> dict[str, Any]:
    """The bucket part of an attribution: R^2 of the bucket shares, its p-value, per bucket."""
    row, ids, mixed = row_codes(buckets)
    # single-bucket steps need no rows x buckets share matrix (a million lines of 54 buckets
    # would take 432 MiB)
    shares, ids, has = composition(buckets) if mixed else (None, ids, row >= 0)
    if has.sum() >= 10 and len(ids) >= 2:
        y = resid[has]
        sub = _subsample(y.size, rng)
        ys = y[sub]
        # each step's bucket code, or (several buckets in some step) its bucket shares
        stat, x = (eta_squared, row[has]) if shares is None else (r_squared, shares[has])
        xs = x[sub]
        p, chance = _permuted(stat(ys, xs), ys, lambda v: stat(v, xs), rng)
        codes = x if shares is None else np.argmax(x, axis=1)
        # steps that (almost) all hold one bucket, e.g. sorted steps that straddle an edge
        # now and then, are single-bucket steps to a reader
        mostly_single = shares is None or float(x.max(axis=1).mean()) >= MOSTLY_SINGLE
        return dict(bucket_field="bucket", bucket_r2=stat(y, x), bucket_p_value=p,
                    bucket_r2_chance=chance, single_bucket=bool(mostly_single),
                    bucket_groups=len(ids), per_bucket=_per_bucket(ids, codes, y, loss[has]))
    if has.sum():
        return dict(bucket_field="bucket",
                    note="every step holds the same bucket: nothing to attribute")
    return {}


def _length_fields(
    resid: np.ndarray, length: np.ndarray, length_field: str | None, rng: np.random.Generator
) -> dict[str, Any]:
    """The length part of an attribution: eta^2 of length deciles and its p-value."""
    ok = np.isfinite(length) & (length > 0)
    if ok.sum() < 20 or np.unique(length[ok]).size < 2:
        return {}
    y, v = resid[ok], length[ok]
    edges = np.unique(np.quantile(v, np.linspace(0, 1, LENGTH_BINS + 1)[1:-1]))
    codes = np.searchsorted(edges, v, side="right")
    sub = _subsample(y.size, rng)
    ys, cs = y[sub], codes[sub]
    return dict(length_field=length_field, length_r2=eta_squared(y, codes),
                length_groups=int(edges.size + 1),
                length_p_value=_permuted(eta_squared(ys, cs), ys,
                                         lambda w: eta_squared(w, cs), rng)[0])


def _per_bucket(
    ids: list[Any], dominant: np.ndarray, resid: np.ndarray, loss: np.ndarray
) -> list[dict[str, Any]]:
    """Steps, mean loss and mean detrended offset per dominant bucket (its index in ``ids``)."""
    rows = []
    for j, b in enumerate(ids):
        sel = dominant == j
        if not sel.any():
            continue
        rows.append(
            {"bucket": b if isinstance(b, int | float | str) else str(b), "steps": int(sel.sum()),
             "mean_loss": round(float(loss[sel].mean()), 6),
             "mean_offset": round(float(resid[sel].mean()), 6)}
        )
    return rows


#: at most this many length ranges
MAX_RANGES = 6
#: every range holds at least this many lines
MIN_LINES = 10
#: lines are shuffled within windows of this many consecutive lines
BLOCK = 10
#: the ranges must alternate at least this share as often as in random order
MIN_ALTERNATION = 0.5
LEVEL_SHUFFLES = 999
#: the shuffles are drawn and scored at most this many shuffled lines at a time
CHUNK_LINES = 1 << 20


@dataclass(frozen=True)
class BucketLevels(JsonForm):
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

    TEST = (f"eta^2 of length ranges, {LEVEL_SHUFFLES} shuffles within windows of {BLOCK} "
            f"lines, alpha={ALPHA}")
    JSON = {"lines": None, "ranges": None, "share": fixed(4), "chance": fixed(4),
            "beyond_chance": fixed(4), "p_value": fixed(4), "found": None,
            "invalid_bucket_lines": "invalid", "test": "TEST", "note": None}


def length_ranges(ids: list[Any], counts: list[int], lines: int) -> list[int]:
    """The range of each bucket (``ids`` in length order, ``counts`` lines each): adjacent
    buckets merged into at most ``MAX_RANGES`` ranges of about equal lines, each of at least
    ``MIN_LINES`` (a range short of them joins its smaller neighbour).

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


def block_shuffles(n: int, rng: np.random.Generator, count: int = LEVEL_SHUFFLES) -> np.ndarray:
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
    y: np.ndarray, onehot: np.ndarray, rng: np.random.Generator, count: int = LEVEL_SHUFFLES,
) -> np.ndarray:
    """eta^2 of ``count`` block shuffles of ``y`` (:func:`block_shuffles`), drawn and scored
    at most ``CHUNK_LINES`` shuffled lines at a time: the same shuffles as one call.

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


def bucket_levels(resid: np.ndarray, loss: np.ndarray, buckets: list[Any], *,
                  edges: list[int] | None = None,
                  rng: np.random.Generator | None = None) -> BucketLevels:
    """Test whether the lines' length ranges sit at different levels: ``resid`` the lines'
    detrended loss in time order, ``buckets`` each line's bucket (one id, else left out),
    ``edges`` the plan's bucket edges (the ranges' token lengths)."""
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
    p = (1 + int((shuffled >= share - 1e-12).sum())) / (1 + LEVEL_SHUFFLES)
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


#: fewest stable-region points with a logged sample std for a budget
MIN_POINTS = 20


@dataclass(frozen=True)
class Noise(JsonForm):
    """The sampling floor of the per-step loss and the shares of its variance."""

    sampling_floor: float | None
    excess: float | None
    shares: dict[str, float] | None
    summary: str
    samples_per_step: float | None = None
    composition_source: str | None = None
    points: int = 0

    JSON = {"sampling_floor": digits(6), "excess": digits(4),
            "shares": lambda s: None if s is None else {k: num(v, 4) for k, v in s.items()},
            "samples_per_step": digits(2), "composition_source": None, "points": None,
            "summary": None}


def _adjusted(r2: float | None, groups: int, n: int) -> float | None:
    """R^2 less its expectation under no effect, ``(groups - 1) / (n - 1)``, at least 0."""
    if r2 is None:
        return None
    return max(0.0, (r2 - (groups - 1) / max(n - 1, 1)) / (1 - (groups - 1) / max(n - 1, 1)))


def length_r2(resid: np.ndarray, length: np.ndarray | None) -> float | None:
    """Adjusted R^2 of ``resid`` on a cubic in ``log(length)`` (a smooth length effect).

    >>> x = np.linspace(1, 3, 200)
    >>> round(length_r2(-0.3 * x, np.exp(x)), 3)
    1.0
    """
    if length is None:
        return None
    ok = np.isfinite(length) & (length > 0) & np.isfinite(resid)
    if ok.sum() < MIN_POINTS or np.unique(length[ok]).size < 4:
        return None
    x = np.log(length[ok])
    x = (x - x.mean()) / (x.std() or 1.0)
    a = np.column_stack([np.ones(x.size), x, x * x, x * x * x])
    y = resid[ok]
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    sst = float(((y - y.mean()) ** 2).sum())
    if sst <= 0:
        return 0.0
    r2 = max(0.0, 1.0 - float(((y - a @ coef) ** 2).sum()) / sst)
    return _adjusted(r2, 4, int(ok.sum()))


def schedule_r2(resid: np.ndarray, lr: np.ndarray | None) -> float | None:
    """Adjusted R^2 of ``resid`` on the learning rate's deviation from its running mean."""
    if lr is None:
        return None
    ok = np.isfinite(lr) & np.isfinite(resid)
    if ok.sum() < MIN_POINTS:
        return None
    x = lr[ok] - rolling_mean(lr[ok], ROUGHNESS_WINDOW)
    y = resid[ok] - resid[ok].mean()
    sxx = float((x - x.mean()) @ (x - x.mean()))
    syy = float(y @ y)
    if sxx <= 0 or syy <= 0:
        return 0.0
    r2 = float(((x - x.mean()) @ y) ** 2 / (sxx * syy))
    return _adjusted(r2, 2, int(ok.sum()))


def noise_budget(resid: np.ndarray, *, loss_sample_std: np.ndarray | None = None,
                 samples: np.ndarray | None = None, composition_r2: float | None = None,
                 composition_source: str | None = None,
                 length: np.ndarray | None = None, length_source: str | None = None,
                 lr: np.ndarray | None = None) -> Noise | None:
    """Noise budget of the detrended stable-region loss ``resid`` (None: too few points)."""
    resid = np.asarray(resid, dtype=np.float64)
    n = int(np.isfinite(resid).sum())
    if n < MIN_POINTS:
        return None
    var = float(np.nanvar(resid))
    floor2, spp = _sampling_floor2(loss_sample_std, samples)
    comp = None if composition_r2 is None else max(0.0, composition_r2)
    if comp is None:
        comp = length_r2(resid, length)
        if comp is not None:
            composition_source = length_source
    sched = schedule_r2(resid, lr)
    rough = float(np.sqrt(var))
    if floor2 is None:
        what = ("loss_sample_std not logged: the sampling noise cannot be separated from the "
                "rest (pass sample_losses= to StepLogger.record_micro)")
        return Noise(sampling_floor=None, excess=None, shares=None, summary=what,
                     composition_source=composition_source, points=n)
    floor = float(np.sqrt(floor2))
    shares = _shares(floor2, var, comp, sched)
    summary = _sentence(shares, spp, comp is not None, sched is not None, composition_source)
    return Noise(sampling_floor=floor, excess=rough / floor if floor > 0 else None, shares=shares,
                 summary=summary, samples_per_step=spp, composition_source=composition_source,
                 points=n)


def _sampling_floor2(
    loss_sample_std: np.ndarray | None, samples: np.ndarray | None
) -> tuple[float | None, float | None]:
    """The sampling variance of the detrended loss and the median samples per step."""
    if loss_sample_std is None or samples is None:
        return None, None
    ok = np.isfinite(loss_sample_std) & np.isfinite(samples) & (samples > 0)
    if ok.sum() < MIN_POINTS:
        return None, None
    f2 = loss_sample_std[ok] ** 2 / samples[ok]
    return float(np.mean(f2)) * (1.0 - 1.0 / ROUGHNESS_WINDOW), float(np.median(samples[ok]))


def _shares(
    floor2: float, var: float, comp: float | None, sched: float | None
) -> dict[str, float]:
    """Variance shares of sampling, composition and schedule (scaled to fit), and the rest."""
    parts = {"sampling": min(1.0, floor2 / var) if var > 0 else 1.0, "composition": comp or 0.0,
             "schedule": sched or 0.0}
    total = sum(parts.values())
    if total > 1.0:
        parts = {k: v / total for k, v in parts.items()}
        total = 1.0
    return {**parts, "unexplained": 1.0 - total}


def _sentence(shares: dict[str, float], spp: float | None, comp_known: bool, sched_known: bool,
              comp_source: str | None) -> str:
    size = f"{spp:.0f}" if spp >= 10 else f"{spp:.2g}"  # a median over steps: no false digits
    parts = [f"{shares['sampling']:.0%} of the step-to-step variance is the sampling noise of "
             f"{size} samples per step"]
    if comp_known:
        parts.append(f"{shares['composition']:.0%} follows the {comp_source or 'length bucket'}")
    if sched_known and shares["schedule"] >= 0.005:
        parts.append(f"{shares['schedule']:.0%} follows the learning rate")
    parts.append(f"{shares['unexplained']:.0%} unexplained")
    text = ", ".join(parts)
    missing = [w for w, known in (("the batch composition (log `bucket`)", comp_known),
                                  ("the schedule (log `lr`)", sched_known)) if not known]
    if missing:
        text += f" (not separable: {' and '.join(missing)})"
    return text
