"""Attribution: how much of the step-to-step loss variance the batch composition explains.

With a bucket field, each step is described by the share of its batches drawn
from each bucket (``bucket``: one id, a one-hot row; ``buckets``: the ids of the
step's micro-batches); ``bucket_r2`` is the R-squared of the detrended loss
regressed on those shares, which for single-bucket steps is exactly
eta-squared (between-bucket variance / total). With a length field
(``seq_len``, or ``real_tokens / samples``), ``length_r2`` is eta-squared over
ten quantile bins of the length. Both come with a permutation p-value (199
shuffles of the loss over steps). The shuffles also give what the bucket
"explains" by chance alone (``bucket_r2_chance``, their mean R-squared): with
many buckets and few steps, e.g. stratified steps that each hold a few of 50
buckets, chance alone reaches an R-squared near 1, so a cause is judged on
``bucket_r2_adjusted``, the share beyond chance.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> b = rng.integers(0, 3, 900)
    >>> resid = np.array([-0.2, 0.0, 0.2])[b] + 0.02 * rng.standard_normal(900)
    >>> a = attribute(resid, loss=resid + 2, buckets=b.tolist())
    >>> round(a.bucket_r2, 2), a.bucket_p_value < 0.01
    (0.99, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.levels import BucketLevels

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
class Attribution:
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

        Example::

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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``attribution`` key of the report)."""

        def r(v: float | None, d: int = 4) -> float | None:
            return None if v is None else round(float(v), d)

        return {
            "bucket_field": self.bucket_field,
            "bucket_r2": r(self.bucket_r2),
            "bucket_p_value": r(self.bucket_p_value),
            "bucket_r2_chance": r(self.bucket_r2_chance),
            "bucket_r2_adjusted": r(self.bucket_r2_adjusted),
            "single_bucket": self.single_bucket,
            "per_bucket": self.per_bucket,
            "length_field": self.length_field,
            "length_r2": r(self.length_r2),
            "length_p_value": r(self.length_p_value),
            "logged_bucket_loss": self.logged_bucket_loss,
            "likely_cause": self.likely_cause,
            "to_log": self.to_log,
            "note": self.note,
            "levels": None if self.levels is None else self.levels.to_dict(),
        }


def _labels(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, tuple | list):
        return tuple(value)
    return (value,)


def composition(buckets: list[Any]) -> tuple[np.ndarray, list[Any], np.ndarray]:
    """Share matrix (steps x buckets), the bucket ids, and a mask of steps with a label."""
    single = [b[0] if type(b) is tuple and len(b) == 1 else b for b in buckets]
    if not any(type(b) is tuple or type(b) is list for b in single):
        ids: dict[Any, int] = {}
        codes = np.array([-1 if b is None else ids.setdefault(b, len(ids)) for b in single],
                         dtype=np.int64)
        order = sorted(ids, key=_sort_key)
        remap = np.empty(max(len(ids), 1), dtype=np.int64)
        for new, b in enumerate(order):
            remap[ids[b]] = new
        has = codes >= 0
        shares = np.zeros((len(single), max(len(ids), 1)))
        shares[np.flatnonzero(has), remap[codes[has]]] = 1.0
        return shares, order, has
    ids = {}
    rows = [_labels(b) for b in buckets]
    for row in rows:
        for b in row:
            if b not in ids:
                ids[b] = len(ids)
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


def _perm_p(stat: float, y: np.ndarray, fn: Any, rng: np.random.Generator) -> float:
    """Permutation p-value of ``fn(y) = stat`` (199 shuffles)."""
    return _permuted(stat, y, fn, rng)[0]


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


def attribute(
    resid: np.ndarray,
    *,
    loss: np.ndarray,
    buckets: list[Any] | None = None,
    length: np.ndarray | None = None,
    bucket_field: str = "bucket",
    length_field: str | None = None,
    rng: np.random.Generator | None = None,
    structure_found: bool = False,
    logged_bucket_loss: dict[str, float] | None = None,
) -> Attribution:
    """Explain detrended per-step losses ``resid`` by bucket shares and/or length.

    ``structure_found`` (bands or a period) with neither field logged makes the
    attribution name batch composition as the likely cause and list what to log.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    fields: dict[str, Any] = {"logged_bucket_loss": logged_bucket_loss}
    if buckets is not None:
        fields.update(_bucket_fields(resid, loss, buckets, bucket_field, rng))
    if length is not None:
        fields.update(_length_fields(resid, length, length_field, rng))
    if structure_found and "bucket_r2" not in fields and "length_r2" not in fields:
        fields.update(likely_cause=("batch composition: which length bucket each step's batch "
                                    "came from, or how long its sequences were"),
                      to_log=list(TO_LOG))
    return Attribution(**fields)


def _bucket_fields(
    resid: np.ndarray, loss: np.ndarray, buckets: list[Any], bucket_field: str,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The bucket part of an attribution: R^2 of the bucket shares, its p-value, per bucket."""
    row, ids, mixed = row_codes(buckets)
    # single-bucket steps need no rows x buckets share matrix (a million lines of 54 buckets
    # would take 432 MiB)
    shares, ids, has = composition(buckets) if mixed else (None, ids, row >= 0)
    if has.sum() >= 10 and len(ids) >= 2:
        y = resid[has]
        sub = _subsample(y.size, rng)
        ys = y[sub]
        if shares is None:
            codes = row[has]
            r2 = eta_squared(y, codes)
            cs = codes[sub]
            p, chance = _permuted(eta_squared(ys, cs), ys, lambda v: eta_squared(v, cs), rng)
            mostly_single = True
        else:
            s = shares[has]
            codes = np.argmax(s, axis=1)
            ss = s[sub]
            r2 = r_squared(y, s)
            p, chance = _permuted(r_squared(ys, ss), ys, lambda v: r_squared(v, ss), rng)
            # steps that (almost) all hold one bucket, e.g. sorted steps that straddle an edge
            # now and then, are single-bucket steps to a reader
            mostly_single = float(s.max(axis=1).mean()) >= MOSTLY_SINGLE
        return dict(bucket_field=bucket_field, bucket_r2=r2, bucket_p_value=p,
                    bucket_r2_chance=chance, single_bucket=bool(mostly_single),
                    bucket_groups=len(ids), per_bucket=_per_bucket(ids, codes, y, loss[has]))
    if has.sum():
        return dict(bucket_field=bucket_field,
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
                length_p_value=_perm_p(eta_squared(ys, cs), ys,
                                       lambda w: eta_squared(w, cs), rng))


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
            {
                "bucket": b if isinstance(b, int | float | str) else str(b),
                "steps": int(sel.sum()),
                "mean_loss": round(float(loss[sel].mean()), 6),
                "mean_offset": round(float(resid[sel].mean()), 6),
            }
        )
    return rows
