"""StepLogger counts stay exact integers, and bucket ids cost memory by how many there are."""

from __future__ import annotations

import json
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.train import StepLogger


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**40)),
                min_size=1, max_size=6))
def test_token_and_sample_sums_are_exact_above_2_pow_53(micro):
    log = StepLogger(None)
    for real, extra, samples in micro:
        log.record_micro(loss=1.0, real_tokens=real, padded_tokens=real + extra, samples=samples)
    rec = log.step(0)
    assert rec["real_tokens"] == sum(m[0] for m in micro)
    assert rec["padded_tokens"] == sum(m[0] + m[1] for m in micro)
    assert rec["samples"] == sum(m[2] for m in micro)
    log.close()


def test_exact_counts_reach_the_log_file(tmp_path):
    path = tmp_path / "log.jsonl"
    log = StepLogger(path)
    log.record_micro(loss=2.0, real_tokens=2**53 + 1, padded_tokens=2**53 + 3, samples=3)
    log.step(0)
    log.close()
    rec = json.loads(path.read_text().splitlines()[0])
    assert (rec["real_tokens"], rec["padded_tokens"]) == (2**53 + 1, 2**53 + 3)


def test_a_huge_bucket_id_takes_one_row_not_an_array_up_to_it():
    log = StepLogger(None)
    tracemalloc.start()
    try:
        for step in range(3):
            log.record_micro(loss=1.0 + step, real_tokens=10, bucket=10**9)
            log.record_micro(loss=3.0, real_tokens=10, bucket=2)
            rec = log.step(step)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # an array up to the id would be 29.8 GiB
    assert rec["buckets"] == [2, 10**9]
    assert rec["bucket_loss"] == {"2": 3.0, str(10**9): 2.0}
    log.close()
