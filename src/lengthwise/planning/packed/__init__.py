"""The packed layout: samples concatenated into rows of ``C`` tokens, no padding.

``plan_epoch(lengths, PlanConfig(max_tokens=C, layout="pack"))`` calls
:func:`plan_packed_epoch`. Every micro-batch is one row (or ``rows_per_batch``
rows) whose lengths sum to at most ``C``. Rows are not cut from a global sort:

1. **Stratified mix.** Samples sorted by length are cut into blocks of equal
   length rank; a fresh random permutation per block and epoch deals one sample of
   every block to every *cell* (a chunk of ~4 rows' worth of samples), so each
   chunk holds the data set's length mix and is re-drawn every epoch.
2. **Near best fit.** Many independent packers (*lanes*) run in lock-step, one
   NumPy operation serving all of them: each takes its chunks' samples longest
   first and puts each into the fullest of its ``pool`` open rows that still has
   room (best fit), keeping partly filled rows open from chunk to chunk; a row
   closes when nearly full, or when a new row needs its place. Rows under 98 %
   full, and the least full under 99.5 % within a budget of items, are repacked
   together by best fit in a jittered decreasing order. Fill comes out within a
   few rows of ``ceil(tokens / C)``, about what best fit decreasing over the
   whole sorted set reaches.
3. **Balance.** Rows are priced with the cost model (``a*tokens + b*sum(L^2) +
   c*samples``; default ``a=1``) and grouped ``world_size`` at a time within 2 %
   of each other's cost (the micro-batches that run side by side on the ranks in
   one accumulation slot; inside a cost class, mixed by ``sum(L^2)``). Groups are
   dealt to optimizer steps in a snake order of their ``sum(L^2)``, so every step
   gets light and heavy rows alike and no rank waits on another.

Samples longer than ``C`` follow ``on_overflow``: ``"split"`` cuts them into
consecutive pieces of at most ``C`` tokens (``plan.token_spans`` holds the
``(start, length)`` of every entry of ``plan.indices``), ``"truncate"``,
``"drop"`` or ``"error"`` as for the padded layout. With ``split``, ``max_len``
(if given) first truncates samples to that many tokens.

Modules: :mod:`~lengthwise.planning.packed.rows` (:func:`pack_rows`, steps 1 and 2, with
``_lanes`` and ``_best_fit``), :mod:`~lengthwise.planning.packed.balance` (step 3,
:func:`schedule_groups`), :mod:`~lengthwise.planning.packed.planner` (:func:`plan_packed_epoch`,
splitting long samples with ``_pieces``) and :mod:`~lengthwise.planning.packed.plan`
(:class:`PackedEpochPlan`).

Example::

    >>> import numpy as np
    >>> from lengthwise.planning.plan import PlanConfig, plan_epoch
    >>> lens = np.random.default_rng(0).integers(1, 3000, 5000)
    >>> plan = plan_epoch(lens, PlanConfig(max_tokens=8192, layout="pack", world_size=2))
    >>> bool(all(lens[plan.batch(k)].sum() <= 8192 for k in range(plan.total_batches)))
    True
    >>> plan.stats["padding_efficiency"] > 0.99
    True
"""

from __future__ import annotations

# ``X as X``: the tuning constants stay importable from here
from lengthwise.planning.packed._best_fit import JITTER as JITTER
from lengthwise.planning.packed.balance import COST_CLASS as COST_CLASS
from lengthwise.planning.packed.balance import schedule_groups
from lengthwise.planning.packed.plan import PackedEpochPlan
from lengthwise.planning.packed.planner import plan_packed_epoch
from lengthwise.planning.packed.rows import POOL as POOL
from lengthwise.planning.packed.rows import REPACK_BUDGET as REPACK_BUDGET
from lengthwise.planning.packed.rows import REPACK_TRY as REPACK_TRY
from lengthwise.planning.packed.rows import ROWS_PER_CHUNK as ROWS_PER_CHUNK
from lengthwise.planning.packed.rows import pack_rows
from lengthwise.planning.vocabulary import PACK_ORDERS as PACK_ORDERS
from lengthwise.planning.vocabulary import PACK_OVERFLOW_POLICIES as PACK_OVERFLOW_POLICIES

__all__ = ["PackedEpochPlan", "pack_rows", "plan_packed_epoch", "schedule_groups"]
