"""Per-bucket loss levels in a per-micro-batch log: simulated logs with known levels and without,
and the demo's own logs."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.demo.report import common_region
from lengthwise.doctor import attribution as levels_module
from lengthwise.doctor import diagnose
from lengthwise.doctor.attribution import (
    BLOCK,
    LEVEL_SHUFFLES,
    MAX_RANGES,
    MIN_LINES,
    block_shuffles,
    bucket_levels,
    length_ranges,
)
from lengthwise.doctor.report import render_text

from simulated_logs.micro import simulate_micro_log

DEMO_LOGS = Path(__file__).resolve().parents[1] / "data" / "demo_logs"
ORDERS = ("bucket-random", "stratified", "interleave")


def _micro_cause(report):
    return next((c for c in report.verdict.causes if c.name == "micro_batch_bands"), None)


@pytest.mark.parametrize("seed", range(3))
def test_known_levels_are_found_one_per_length_range_with_their_means(seed):
    rows = simulate_micro_log(150, effect=0.5, seed=seed)
    report = diagnose(rows, seed=seed)
    levels = report.attribution.levels
    assert levels is not None and levels.found
    assert len(levels.ranges) == MAX_RANGES
    offsets = [r["mean_offset"] for r in levels.ranges]
    assert offsets[0] < 0 < offsets[-1]  # the levels rise with the length, as simulated
    assert sum(r["lines"] for r in levels.ranges) == levels.lines
    cause = _micro_cause(report)
    assert cause is not None and cause is report.verdict.causes[0]
    assert "composition of the logged micro-batch, not of the optimizer step" in cause.claim
    for r in levels.ranges:  # each level: its length range, mean loss and line count
        assert any(f"lengths {r['lengths']} tokens" in e and f"{r['lines']} micro-batches" in e
                   and f"mean loss {r['mean_loss']:.4g}" in e for e in cause.evidence)
    assert cause.fix[0].startswith("log the optimizer step's loss instead")
    assert "token-weighted mean over every micro-batch of the step" in cause.fix[0]


@pytest.mark.parametrize("case", [dict(), dict(ar=0.5), dict(buckets=6, lines=300)])
def test_levels_are_claimed_at_the_tests_rate_where_none_were_simulated(case):
    # the test's level is 0.01: of 30 logs without levels, 3 or more found has probability 0.003
    kwargs = {"lines": 120, **case}
    claimed = 0
    for seed in range(30):
        report = diagnose(simulate_micro_log(seed=seed, **kwargs), seed=seed)
        assert report.attribution.levels.p_value is not None
        assert (_micro_cause(report) is not None) == report.attribution.levels.found
        claimed += report.attribution.levels.found
    assert claimed <= 2, case


def test_buckets_in_sorted_runs_are_not_tested_for_levels():
    # a drifting loss and buckets in runs: levels cannot be told from drift
    report = diagnose(simulate_micro_log(300, order="sorted", ar=0.7, effect=0.5, seed=0))
    levels = report.attribution.levels
    assert levels.p_value is None and "come in runs" in levels.note
    assert _micro_cause(report) is None
    # a log whose levels could not be tested is never called clean
    assert report.verdict.clean is not True
    assert "not tested: per-bucket levels, the length ranges come in runs" in (
        report.verdict.summary)


def test_a_micro_log_of_packed_rows_gets_no_levels():
    rows = simulate_micro_log(150, effect=0.5)
    rows = [rows[0], *({**r, "buckets": []} for r in rows[1:])]
    report = diagnose(rows)
    assert report.attribution.levels is None and report.verdict.clean is True


def test_a_micro_log_without_bucket_fields_is_not_tested_and_never_clean():
    rows = [{k: v for k, v in r.items() if k != "buckets"} for r in simulate_micro_log(300)]
    report = diagnose(rows)
    levels = report.attribution.levels
    assert levels is not None and levels.p_value is None
    assert "no line logs its length bucket" in levels.note
    assert report.verdict.clean is None
    assert "not tested: per-bucket levels, no line logs its length bucket" in (
        report.verdict.summary)
    assert "levels       not tested: no line logs its length bucket" in render_text(report)


@pytest.mark.parametrize("bad", [[999], [54], ["x"], [-4], [2.5], [True], "7"])
def test_bucket_ids_that_are_not_the_plans_are_left_out_and_counted(bad):
    rows = simulate_micro_log(300, effect=0.5)
    clean = diagnose(rows).attribution.levels
    for i in (200, 250, 290):  # lines of the stable region
        rows[i] = {**rows[i], "buckets": bad}
    levels = diagnose(rows).attribution.levels
    assert levels.invalid == 3 and levels.lines == clean.lines - 3
    assert levels.note == ("3 line(s) left out, their bucket not one of the plan's 54 bucket "
                           f"indices (0-53): {bad[0]!r}")
    assert all(0 <= r["buckets"][0] <= r["buckets"][1] <= 53 for r in levels.ranges)
    assert all(r["lengths"] is not None for r in levels.ranges)
    assert levels.to_dict()["invalid_bucket_lines"] == 3
    assert levels.note in render_text(diagnose(rows))


def test_a_micro_log_whose_buckets_are_all_invalid_is_not_tested():
    rows = [{**r, "buckets": ["short"]} if "event" not in r else r
            for r in simulate_micro_log(300, effect=0.5)]
    report = diagnose(rows)
    levels = report.attribution.levels
    assert levels is not None and levels.p_value is None and levels.lines == 0
    assert levels.invalid == report.phases.points  # every line of the stable region
    assert levels.note.endswith(f"; {levels.invalid} line(s) left out, their bucket not one of "
                                "the plan's 54 bucket indices (0-53): 'short'")
    assert report.verdict.clean is None


def test_without_edges_a_bucket_index_is_any_whole_number_from_zero():
    lv = bucket_levels(np.zeros(40), np.zeros(40), [0, 1, 1000, -1] * 10)
    assert lv.invalid == 10
    assert "10 line(s) left out, their bucket not a bucket index (a whole number from 0): -1" in (
        lv.note)
    assert lv.lines == 30


def test_a_step_log_gets_no_levels():
    rows = [r for r in simulate_micro_log(150, effect=0.5) if "event" not in r]
    report = diagnose(rows)
    assert report.attribution.levels is None and _micro_cause(report) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60))
def test_length_ranges_are_runs_of_adjacent_buckets_with_enough_lines(counts):
    lines = sum(counts)
    group = length_ranges(list(range(len(counts))), counts, lines)
    assert group == sorted(group) and group[0] == 0  # adjacent buckets, in length order
    k = group[-1] + 1
    assert set(group) == set(range(k)) and k <= MAX_RANGES
    if k > 1:
        sizes = np.bincount(group, weights=counts)
        assert sizes.min() >= MIN_LINES


def test_shuffles_move_lines_only_within_their_window():
    perms = block_shuffles(57, np.random.default_rng(0), 50)
    assert all(sorted(p) == list(range(57)) for p in perms.tolist())
    assert np.all(perms // BLOCK == np.arange(57) // BLOCK)


def _random_lines(n: int, seed: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    buckets = rng.integers(0, 54, n)
    return 0.02 * buckets + 0.12 * rng.standard_normal(n), buckets.tolist()


@settings(max_examples=25, deadline=None)
@given(st.integers(40, 400), st.integers(1, 5000), st.integers(0, 2**32 - 1))
def test_shuffles_drawn_in_chunks_give_the_p_value_of_drawing_them_all_at_once(n, chunk, seed):
    y, buckets = _random_lines(n, seed)

    def run(lines_at_once: int):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(levels_module, "CHUNK_LINES", lines_at_once)
            return bucket_levels(y, y, buckets, rng=np.random.default_rng(seed))

    at_once, chunked = run(LEVEL_SHUFFLES * n), run(chunk)  # one draw of every shuffle, or chunks
    assert chunked.p_value == at_once.p_value and chunked.share == at_once.share
    assert chunked.chance == pytest.approx(at_once.chance, rel=1e-12, abs=1e-15)
    assert chunked.to_dict() == at_once.to_dict()


@pytest.mark.parametrize(("n", "seed", "p", "chance"), [(3000, 1, 0.174, 0.001640969581118696),
                                                        (30000, 2, 0.4, 0.0001670178315361578)])
def test_the_p_value_is_the_one_of_drawing_every_shuffle_at_once(monkeypatch, n, seed, p, chance):
    # p and chance as the test gave them when it drew all 999 shuffles in one array
    monkeypatch.setattr(levels_module, "CHUNK_LINES", 1000)
    rng = np.random.default_rng(seed)
    buckets, y = rng.integers(0, 54, n).tolist(), 0.12 * rng.standard_normal(n)
    lv = bucket_levels(y, y, buckets, rng=np.random.default_rng(seed))
    assert lv.p_value == p and lv.chance == pytest.approx(chance, rel=1e-12)


def _peak_bytes(n: int) -> int:
    y, buckets = _random_lines(n, 0)
    tracemalloc.start()
    try:
        lv = bucket_levels(y, y, buckets)
        assert lv.p_value is not None
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_levels_tests_memory_does_not_grow_with_the_lines():
    # 999 shuffles of every line at once took 16 KiB a line: 4x the lines, 4x the memory
    small, large = _peak_bytes(5_000), _peak_bytes(20_000)
    assert large < 1.5 * small, (small, large)


def test_too_few_lines_are_not_tested():
    lv = bucket_levels(np.zeros(12), np.zeros(12), [0, 1] * 6)
    assert lv.p_value is None and lv.note.startswith("not tested")


def _plan(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.loads(fh.readline())


def test_the_demos_bucket_random_micro_log_has_one_level_per_length_range():
    path = DEMO_LOGS / "bucket-random" / "micro_log.jsonl.gz"
    plan = _plan(path)
    assert plan["view"] == "micro-batch" and plan["world_size"] == 8
    report = diagnose(str(path))
    levels = report.attribution.levels
    assert levels.found and len(levels.ranges) >= 3
    cause = report.verdict.causes[0]
    assert cause.name == "micro_batch_bands"
    assert report.verdict.summary.startswith("one loss level per length bucket")
    for r in levels.ranges:
        assert r["lengths"] and any(f"lengths {r['lengths']} tokens" in e for e in cause.evidence)
    # the shortest and the longest range sit on different sides of the trend
    offsets = [r["mean_offset"] for r in levels.ranges]
    assert min(offsets) < 0 < max(offsets)
    # the text report shows the test beside the attribution, as the verdict reads it
    line = next(ln for ln in render_text(report).splitlines() if ln.startswith("  levels"))
    assert f"{len(levels.ranges)} length ranges" in line and "levels found" in line
    assert all(f"{r['lengths']}: " in line for r in levels.ranges)


@pytest.mark.parametrize("order", ["stratified", "interleave"])
def test_the_demos_step_logs_of_orders_that_mix_buckets_have_no_bands(order):
    path = DEMO_LOGS / order / "train_log.jsonl.gz"
    # over the stable region the demo reads the logs of its orders in (steps 24-100 here)
    start, end = common_region({o: DEMO_LOGS / o / "train_log.jsonl.gz" for o in ORDERS})
    for report in (diagnose(str(path), start=start, end=end), diagnose(str(path))):
        assert (report.bands.count or 0) <= 1
        assert report.attribution.levels is None  # a step log
        names = [c.name for c in report.verdict.causes]
        assert "micro_batch_bands" not in names and "single_bucket_batches" not in names
        # steps that each hold many buckets are never said to be driven by "the bucket of
        # each step"
        assert report.attribution.single_bucket is False
        assert "the length bucket of each step drives its loss" not in report.verdict.summary
        for cause in report.verdict.causes:  # a composition cause quotes what it explains
            if cause.name == "composition_noise":
                assert "% of" in cause.claim and "beyond chance" in cause.claim
                if order == "stratified":
                    assert "each step holds close to the data set's mix" in cause.claim
    assert diagnose(str(path), start=start, end=end).bands.count == 1  # tested: one band


@pytest.mark.parametrize("order", ["stratified", None])
def test_mixed_steps_whose_mix_moves_the_loss_are_told_so_with_the_share(order):
    # every step holds 8 micro-batches from 6 buckets, close to the data set's mix; what little
    # the mixes differ moves the loss: a figure, never "the bucket of each step drives its loss"
    rng = np.random.default_rng(0)
    rows = [{"event": "plan", "order": order, "layout": "pad"}] if order else []
    for step in range(1, 601):
        ids = np.sort(np.concatenate([np.arange(6), rng.integers(0, 6, 2)]))
        shift = 0.05 * float(np.mean(ids)) + 0.005 * rng.standard_normal()
        rows.append({"step": step, "loss": 3.0 + 2.0 * np.exp(-step / 80) + shift, "lr": 1e-3,
                     "buckets": ids.tolist()})
    report = diagnose(rows)
    assert report.attribution.single_bucket is False and report.attribution.bucket_explains
    title = report.verdict.causes[0].claim
    assert "drives its loss" not in title
    assert f"{report.attribution.bucket_r2_adjusted:.0%}" in title and "beyond chance" in title
    assert ("each step holds close to the data set's mix" in title) == (order == "stratified")
