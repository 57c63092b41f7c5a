"""Misuse gets a clear error naming the parameter, or a counted and reported policy."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
import warnings

import numpy as np
import pytest

import lengthwise
from lengthwise import load_lengths, plan_epoch
from lengthwise.planning.config import PlanConfig


def test_a_huge_length_does_not_size_the_planning_memory():
    lens = np.array([5, 2**40, 7, 9, 3, 2**35])
    tracemalloc.start()
    try:
        plan = plan_epoch(lens, PlanConfig(batch_size=2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.lengths.max() == 2**40 and peak < 50 * 2**20
    assert sorted(plan.indices.tolist()) == list(range(6))


@pytest.mark.parametrize("buckets, exc, match", [
    ([512.9, 1024], TypeError, "bucket edges must be whole numbers of tokens, got 512.9"),
    ([0, 1024], ValueError, "bucket edges must be >= 1, got 0"),
    ([-5, 1024], ValueError, "bucket edges must be >= 1, got -5"),
    ([True, 1024], TypeError, "got True"),
    ([], ValueError, "empty list"),
    ([512, 512], ValueError, "must differ"),
    ("many", ValueError, "buckets must be a count, 'auto' or a list of edges"),
    (2.5, TypeError, "buckets must be a count"),
    (True, TypeError, "buckets must be a count"),
    (0, ValueError, "buckets must be a positive whole number"),
])
def test_bucket_values_are_never_converted_quietly(buckets, exc, match):
    with pytest.raises(exc, match=match):
        plan_epoch(np.arange(1, 1000), PlanConfig(batch_size=4, buckets=buckets))


def test_numpy_counts_and_edges_are_whole_numbers():
    lens = np.arange(1, 1000)
    assert len(plan_epoch(lens, PlanConfig(batch_size=4, buckets=np.int64(3))).edges) == 3
    edges = plan_epoch(lens, PlanConfig(batch_size=4, buckets=np.array([500, 999]))).edges
    assert edges == [500, 999]
    s = lengthwise.BucketBatchSampler(lens, PlanConfig(batch_size=np.int64(4), buckets=np.int64(3)))
    assert len(s) > 0


@pytest.mark.parametrize("name, value, exc", [
    ("world_size", 2.0, TypeError), ("grad_accum", 0, ValueError), ("max_run", True, TypeError),
    ("max_len", 100.5, TypeError), ("rows_per_batch", 1.5, TypeError),
    ("pad_multiple", 0, ValueError), ("on_overflow", "wrap", ValueError),
    ("epoch", 2.9, TypeError), ("seed", -1, ValueError),
])
def test_plan_options_name_the_parameter(name, value, exc):
    with pytest.raises(exc, match=name):
        if name in ("epoch", "seed"):
            plan_epoch(np.arange(1, 100), PlanConfig(batch_size=4), **{name: value})
        else:
            plan_epoch(np.arange(1, 100), PlanConfig(batch_size=4, **{name: value}))


def test_a_boolean_mask_as_indices_is_refused_clearly():
    lens = np.arange(1, 100)
    with pytest.raises(TypeError, match=r"got a boolean mask; pass np.flatnonzero\(mask\)"):
        plan_epoch(lens, PlanConfig(batch_size=4), indices=lens > 50)
    with pytest.raises(TypeError, match="whole numbers"):
        plan_epoch(lens, PlanConfig(batch_size=4), indices=np.array([1.0, 2.0]))
    plan = plan_epoch(lens, PlanConfig(batch_size=4), indices=np.flatnonzero(lens > 50))
    assert sorted(plan.indices.tolist()) == list(range(50, 99))


def test_cutting_over_one_percent_of_the_tokens_warns_with_the_share():
    raw = load_lengths("coqa")
    with pytest.warns(UserWarning, match=r"of the tokens are cut: 700 samples truncated to 8 "
                                         r"tokens \(max_tokens=8\)"):
        plan = plan_epoch(raw, PlanConfig(max_tokens=8))
    assert plan.stats["truncated"] == 700
    assert plan.stats["truncated_share"] == pytest.approx(1 - 8 * 700 / raw.sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # under 1%: no warning
        plan_epoch(raw, PlanConfig(max_tokens=8192, max_len=int(np.sort(raw)[-2])))


def test_what_load_lengths_cut_is_counted_in_the_plan():
    raw = load_lengths("coqa")
    clipped = load_lengths("coqa", max_len=700)
    n = int((raw > 700).sum())
    with pytest.warns(UserWarning, match=r"truncated to 700 tokens \(the max_len given to "
                                         r"load_lengths\)") as caught:
        plan = plan_epoch(clipped, PlanConfig(max_tokens=16384))
    # the budget cut nothing here, so the message does not name it
    assert not any("max_tokens" in str(w.message) for w in caught)
    assert plan.stats["truncated"] == n > 0
    assert plan.stats["truncated_tokens"] == int((raw - 700).clip(0).sum())
    # through the sampler as well, and a plan cut further counts each sample once
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = lengthwise.BucketBatchSampler(clipped, PlanConfig(max_tokens=16384, max_len=600))
        assert s.plan.stats["truncated"] == int((raw > 600).sum())
        assert s.plan.stats["truncated_tokens"] == int((raw - 600).clip(0).sum())


def test_csv_without_a_loss_column_suggests_the_option(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("step,acc\n1,0.5\n2,0.6\n")
    proc = subprocess.run([sys.executable, "-m", "lengthwise", "doctor", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no loss column found among the CSV columns: step, acc; name the one that holds " \
           "the loss with --loss-key COLUMN" in proc.stderr


def test_a_cost_model_that_is_not_one_is_named():
    with pytest.raises(TypeError, match="cost must be a lengthwise.CostModel"):
        plan_epoch(np.arange(1, 100), PlanConfig(max_tokens=1024, cost=(1.0, 0.0, 0.0)))


def test_planning_memory_stays_within_32_bytes_a_sample_beyond_the_lengths():
    # the figure benchmarks/planner_targets.py reports at 10,000,000 samples, here at 400,000:
    # index arrays kept int32 where ids fit, the shuffle's positions included
    n = 400_000
    rng = np.random.default_rng(1)
    lens = np.clip(rng.lognormal(np.log(1050), 0.5, n), 16, 8192).astype(np.int64)
    # edges solved and kept, as in the benchmark
    plan_epoch(lens, PlanConfig(max_tokens=16384, world_size=8))
    tracemalloc.start()
    try:
        plan = plan_epoch(lens, PlanConfig(max_tokens=16384, world_size=8))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.indices.size == n
    assert peak / n <= 32, f"{peak / n:.1f} bytes a sample"
