"""Smoke test of the benchmark adapters: every installed method, on 2,000 lengths.

Methods whose package is missing are skipped (with the dev extra alone, the
lengthwise and transformers-based adapters run). Each adapter's micro-batches
must cover every sample exactly once, or repeat/drop exactly what its library
documents, and respect the batch rule it was given.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import competitors as comp  # noqa: E402

from lengthwise.planning.metrics import batch_stats  # noqa: E402

N = 2000
W = 8
ROWS = 4
TOKENS = 16384
CAPACITY = 8192
KWARGS = {"rows": {"batch_size": ROWS}, "tokens": {"max_tokens": TOKENS},
          "pack": {"capacity": CAPACITY}}


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.clip(np.rint(rng.lognormal(np.log(1050), 0.5, N)), 16, 8192).astype(np.int64)


CASES = [pytest.param(a, rule, id=f"{a.key}-{rule}") for a in comp.all_adapters()
         for rule in a.rules]


def _usable(adapter) -> None:
    reason = adapter.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize(("adapter", "rule"), CASES)
def test_adapter_covers_and_respects_its_rule(adapter, rule, lengths):
    _usable(adapter)
    run = adapter.make_batches(lengths, world_size=W, seed=3, **KWARGS[rule])
    cov = comp.coverage(run, N)
    sizes = np.diff(run.offsets)
    lens = lengths[run.indices]
    longest = np.maximum.reduceat(lens, run.offsets[:-1])
    totals = np.add.reduceat(lens, run.offsets[:-1])

    assert cov["out_of_range"] == 0
    assert (sizes > 0).all(), "empty micro-batches"
    assert run.plan_seconds >= 0
    # what each method documents about dropping and repeating samples
    if adapter.key == "hf_group_by_length":
        rounds = -(-N // (ROWS * W))
        assert cov["missing"] == 0
        assert cov["repeated"] == rounds * ROWS * W - N  # accelerate's even_batches fill
    elif adapter.key == "lhotse_dynamic_bucketing":
        assert cov["missing"] == 0
        assert cov["repeated"] < W  # duplicates only to give every rank a last batch
    elif adapter.key == "trl_pack_bfd":
        # packed rows go through accelerate's even_batches: the last round repeats the
        # epoch's first rows
        batches = [b.tolist() for b in run.batches()]
        unique_rows = len({tuple(b) for b in batches})
        short = len(batches) - unique_rows
        assert 0 <= short < W and cov["missing"] == 0
        assert batches[len(batches) - short:] == batches[:short]
        assert cov["repeated"] == sum(len(b) for b in batches[:short])
    else:
        assert cov["missing"] == 0 and cov["repeated"] == 0, cov
    # the batch rule
    if rule == "rows":
        if adapter.key == "hf_batch_rebalance":  # variable rows, fixed samples per step
            assert sizes.size % W == 0
            per_step = sizes.reshape(-1, W).sum(axis=1)
            assert (per_step[:-1] == ROWS * W).all() and per_step[-1] == N % (ROWS * W)
        else:
            assert sizes.max() <= ROWS
    elif rule == "tokens":
        if adapter.key == "lhotse_dynamic_bucketing":
            # lhotse stops adding once one more cut as long as the longest *so far* would
            # exceed the budget, so a later, longer cut can overshoot it by one row
            assert ((sizes - 1) * longest <= TOKENS).all()
        else:
            assert (sizes * longest <= TOKENS).all()
    else:
        assert run.capacity == CAPACITY
        assert (totals <= CAPACITY).all()
    # ranks: equal micro-batch counts, except where the library allows a short last round
    if adapter.key not in ("fairseq_style", "axolotl_multipack"):
        assert run.num_batches % W == 0
    stats = batch_stats(lengths, run.indices, run.offsets, world_size=W, capacity=run.capacity)
    assert 0 < stats["padding_efficiency"] <= 1.0
    assert stats["rank_imbalance_p99"] >= 1.0


@pytest.mark.parametrize("adapter", [a for a in comp.all_adapters() if "rows" in a.rules
                                     or "tokens" in a.rules], ids=lambda a: a.key)
def test_adapter_is_seeded_per_epoch(adapter, lengths):
    _usable(adapter)
    rule = "rows" if "rows" in adapter.rules else "tokens"
    a = adapter.make_batches(lengths, world_size=W, seed=5, epoch=0, **KWARGS[rule])
    b = adapter.make_batches(lengths, world_size=W, seed=5, epoch=0, **KWARGS[rule])
    c = adapter.make_batches(lengths, world_size=W, seed=5, epoch=1, **KWARGS[rule])
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)
    if adapter.key == "lengthwise_sorted":  # the one order with no randomness
        assert np.array_equal(a.indices, c.indices)
    else:
        assert not np.array_equal(a.indices, c.indices)


def test_batch_rebalance_all_ranks_equals_per_rank_samplers(lengths):
    adapter = comp.HFBatchRebalance()
    _usable(adapter)
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    lens = lengths[:203].tolist()  # a partial last step too
    world, accum, rows = 4, 2, 3
    kwargs = dict(lengths=lens, effective_batch_size=rows * world * accum, dp_size=world,
                  grad_accum=accum, seed=11, drop_last=False)
    mine = list(adapter.all_ranks_sampler(rank=0, **kwargs))
    per_rank = []
    for r in range(world):
        sampler = BatchRebalanceSampler(rank=r, **kwargs)
        per_rank.append(list(sampler))
    # schedule order: local position p (step-major, slot), then rank
    expected = [per_rank[r][p] for p in range(len(per_rank[0])) for r in range(world)]
    assert mine == expected


def test_group_by_length_sharding_follows_accelerate(lengths):
    adapter = comp.HFLengthGrouped()
    _usable(adapter)
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    run = adapter.make_batches(lengths, world_size=W, seed=2, batch_size=ROWS)
    order = list(LengthGroupedSampler(ROWS, lengths=lengths.tolist(),
                                      generator=torch.Generator().manual_seed(2)))
    glob = [order[i:i + ROWS] for i in range(0, N, ROWS)]
    got = [b.tolist() for b in run.batches()]
    assert got[:len(glob)] == glob  # batch i on rank i % W, in order
    assert len(got) % W == 0


def test_lhotse_all_ranks_equals_per_rank_samplers(lengths):
    adapter = comp.LhotseDynamicBucketing()
    _usable(adapter)
    import warnings

    from lhotse.dataset import DynamicBucketingSampler

    lens = lengths[:301]
    world = 3
    run = adapter.make_batches(lens, world_size=world, seed=4, max_tokens=TOKENS)
    cuts = adapter.cut_set(lens, 4)
    for rank in range(world):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = DynamicBucketingSampler(cuts, max_duration=float(TOKENS), num_buckets=10,
                                              shuffle=True, drop_last=False, seed=4,
                                              world_size=world, rank=rank)
            sampler.set_epoch(0)
            real = [[int(c.id.split("_")[0]) for c in b] for b in sampler]
        mine = [b.tolist() for b in run.batches()[rank::world]]
        assert mine == real


def test_fairseq_rule_rounds_to_multiples_of_eight():
    lens = np.full(100, 100, dtype=np.int64)
    spans = comp.FairseqStyle.batch_by_size(np.arange(100), lens, max_tokens=1250)
    sizes = [b - a for a, b in spans]
    assert sizes == [8] * 11 + [12]  # 12 rows fit, rounded down to 8; the last batch as is


def test_trl_recovers_ids_per_map_batch():
    adapter = comp.TRLPack()
    _usable(adapter)
    rng = np.random.default_rng(1)
    lens = rng.integers(1, 300, 2500)
    lens[[5, 1700]] = 0  # empty samples are dropped by pack_dataset, per map batch
    run = adapter.make_batches(lens, world_size=1, seed=0, capacity=512)
    cov = comp.coverage(run, lens.size)
    assert cov["missing"] == 2 and cov["repeated"] == 0
    assert sorted(set(range(lens.size)) - set(run.indices.tolist())) == [5, 1700]


def test_compare_tables_render(lengths):
    import compare

    s = compare.settings(quick=True, only=[])
    row = compare.measure_method(comp.LengthwisePlan("stratified"), lengths, "rows", s, 4, None)
    table = compare.quality_table([row])
    assert table[2].startswith("| lengthwise stratified") and table[2].count("|") == 13
    assert row["recomposition"] < 0.5


@pytest.mark.slow
def test_gpu_dflash_runs_at_a_tiny_shape_on_cpu(tmp_path):
    """The GPU script's code path on CPU: every figure of its table, per order."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

    import gpu_dflash

    out = tmp_path / "gpu_dflash"
    summary = gpu_dflash.main(["--device", "cpu", "--smoke", "--orders", "sorted,packed",
                               "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text())["max_slots"] == 256
    assert set(summary["strategies"]) == {"sorted", "packed"}
    for row in summary["strategies"].values():
        assert row["tokens_per_second"] > 0
        assert 0 < row["padding_efficiency"] <= 1
        assert 0 < row["slot_efficiency"] <= 1
        assert 0 < row["slots_per_micro_batch"] <= summary["max_slots"]
        assert row["peak_memory_gib"] is None  # measured on CUDA only
        assert row["lossless"] is True
    assert "slot_efficiency" in out.with_suffix(".md").read_text()
