"""Fast paths of the planner and its figures agree exactly with the direct computations."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.planning.batching import greedy_batches, row_limit, sorted_padded_tokens
from lengthwise.planning.cost import CostModel, round_up
from lengthwise.planning.edges import Histogram

RULES = st.sampled_from([
    dict(batch_size=1), dict(batch_size=3), dict(batch_size=8), dict(max_tokens=64),
    dict(max_tokens=100, pad_multiple=8), dict(max_tokens=257),
    dict(max_cost=900.0, cost=CostModel(a=1.0, b=0.05, c=7.0)),
    dict(max_cost=350.0, cost=CostModel(a=0.7, b=0.0, c=3.0), pad_multiple=4),
])


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=300), rule=RULES)
def test_sorted_padded_tokens_equals_greedy_batches_along_the_sort(lengths, rule):
    lens = np.asarray(lengths, dtype=np.int64)
    limit = row_limit(**rule)
    if limit.max_length() is not None:
        lens = np.minimum(lens, limit.max_length())
    order = np.argsort(lens, kind="stable")
    idx, off = greedy_batches(order, lens, limit)
    longest = np.maximum.reduceat(lens[idx], off[:-1])
    expected = int(np.sum(np.diff(off) * round_up(longest, limit.pad_multiple)))
    hist = Histogram.of(lens)
    assert sorted_padded_tokens(hist.values, hist.counts, limit) == expected
