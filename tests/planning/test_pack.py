"""The packed layout: capacity, coverage, ranks, epochs, overflow, balance, a real model."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel
from lengthwise.planning.lengths import LengthError, load_lengths
from lengthwise.planning.metrics import batch_hashes, recomposition
from lengthwise.planning.packed import (
    PackedEpochPlan,
    pack_rows,
    plan_packed_epoch,
    schedule_groups,
)
from lengthwise.planning.plan import plan_epoch
from lengthwise.planning.schedule import EpochPlan


def _rows(plan):
    """Every packed row of the schedule as (sample ids, piece lengths)."""
    bounds = plan.row_offsets if plan.row_offsets is not None else plan.offsets
    pieces = plan.piece_lengths()
    return [(plan.indices[a:b], pieces[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _check_plan(plan, lengths, capacity):
    """Invariants every packed plan keeps; returns the covered token set per sample."""
    cfg = plan.config
    w, r = cfg.world_size, cfg.rows_per_batch
    assert isinstance(plan, EpochPlan)
    assert plan.total_batches % w == 0
    assert [len(plan.rank_batches(k)) for k in range(w)] == [plan.num_batches] * w
    for ids, pieces in _rows(plan):
        assert ids.size >= 1
        assert pieces.sum() <= capacity
    if r > 1:
        assert np.isin(plan.offsets, plan.row_offsets).all()
        assert (np.diff(np.searchsorted(plan.row_offsets, plan.offsets)) == r).all()
    else:
        assert plan.row_offsets is None
    # every rank's batches, put together, are the whole schedule
    seen = np.concatenate([b for k in range(w) for b in plan.rank_batches(k)])
    assert np.array_equal(np.sort(seen), np.sort(plan.indices))


# ------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 150), min_size=1, max_size=120),
       capacity=st.sampled_from([16, 50, 64, 100]),
       world=st.integers(1, 4), accum=st.integers(1, 3), rows=st.integers(1, 3),
       split=st.booleans(), seed=st.integers(0, 2**16))
def test_packed_plan_properties(lengths, capacity, world, accum, rows, split, seed):
    lens = np.array(lengths)
    cfg = PlanConfig(max_tokens=capacity, layout="pack", world_size=world, grad_accum=accum,
                     rows_per_batch=rows, on_overflow="split" if split else "truncate")
    try:
        plan = plan_packed_epoch(lens, cfg, seed=seed, epoch=1)
    except ValueError as exc:  # too few samples for every rank's rows: said clearly
        assert "cannot fill" in str(exc)
        assume(False)
    _check_plan(plan, lens, capacity)
    if split:
        # the pieces of every sample tile [0, L) exactly once
        spans = plan.token_spans
        for i, length in enumerate(lengths):
            mine = spans[plan.indices == i]
            mine = mine[np.argsort(mine[:, 0])]
            assert mine[:, 1].sum() == length
            assert np.array_equal(mine[:, 0], np.concatenate(([0], np.cumsum(mine[:, 1])[:-1])))
            assert (mine[:, 1] <= capacity).all()
        assert plan.counts["split_samples"] == int((lens > capacity).sum())
    else:
        assert plan.token_spans is None
        assert sorted(plan.indices.tolist()) == list(range(len(lengths)))
        assert np.array_equal(plan.lengths, np.minimum(lens, capacity))
        assert plan.counts["truncated"] == int((lens > capacity).sum())
    again = plan_packed_epoch(lens, cfg, seed=seed, epoch=1)
    assert np.array_equal(again.indices, plan.indices)
    assert np.array_equal(again.offsets, plan.offsets)


def _best_fit_decreasing_rows(lengths, capacity):
    """Rows that best fit decreasing over the sorted lengths uses (the reference)."""
    rooms, rows = [], 0  # rooms of the open rows, sorted
    for x in sorted(lengths.tolist(), reverse=True):
        p = bisect.bisect_left(rooms, x)
        if p == len(rooms):
            rows, room = rows + 1, capacity
        else:
            room = rooms.pop(p)
        if room > x:
            bisect.insort(rooms, room - x)
    return rows


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=400),
       capacity=st.integers(300, 2000), seed=st.integers(0, 1000))
def test_pack_rows_fits_and_covers(lengths, capacity, seed):
    lens = np.array(lengths)
    order, off = pack_rows(lens, capacity, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(lens.size))
    assert (np.diff(off) >= 1).all()
    assert np.add.reduceat(lens[order], off[:-1]).max() <= capacity
    # near best fit: within two rows of best fit decreasing over the sorted set
    assert off.size - 1 <= _best_fit_decreasing_rows(lens, capacity) + 2


def test_many_lanes_cover_and_fill():
    lens = np.random.default_rng(0).integers(1, 1500, 60_000)
    order, off = pack_rows(lens, 4096, np.random.default_rng(1), lanes=64)
    assert np.array_equal(np.sort(order), np.arange(lens.size))
    assert np.add.reduceat(lens[order], off[:-1]).max() <= 4096
    assert lens.sum() / ((off.size - 1) * 4096) > 0.995


def test_same_seed_same_plan_new_epoch_new_rows():
    lens = np.random.default_rng(3).integers(1, 2000, 4000)
    kw = PlanConfig(max_tokens=4096, layout="pack", world_size=2, grad_accum=2)
    p0, again, p1 = (plan_epoch(lens, kw, seed=5, epoch=e) for e in (0, 0, 1))
    assert np.array_equal(p0.indices, again.indices) and np.array_equal(p0.offsets, again.offsets)
    assert not np.array_equal(p0.indices, p1.indices)
    assert recomposition(p0, p1) < 0.02
    other_seed = plan_epoch(lens, kw, seed=6, epoch=0)
    assert recomposition(p0, other_seed) < 0.02


def test_rows_mix_lengths_anew_every_epoch():
    """Rows are not cut from a global sort: their length mixes change between epochs."""
    lens = load_lengths("sft_mix")
    kw = PlanConfig(max_tokens=8192, layout="pack", world_size=8, grad_accum=4)
    p0, p1 = plan_epoch(lens, kw, epoch=0), plan_epoch(lens, kw, epoch=1)

    def length_sets(plan):
        # hash rows by their multiset of lengths; rows of one sample say nothing
        sizes = np.diff(plan.offsets)
        hashes = batch_hashes(plan.lengths[plan.indices], plan.offsets)
        return hashes[sizes > 1]

    h0, h1 = length_sets(p0), length_sets(p1)
    assert np.isin(h1, h0).mean() < 0.02
    # every row of several samples holds a long and short ones: the median row
    # spans most of the length range
    spread = [np.ptp(plan_len) for plan_len in (p0.lengths[b] for b in
                                                 (p0.batch(k) for k in range(p0.total_batches)))
              if plan_len.size > 1]
    assert np.median(spread) > np.percentile(lens, 90)


def test_indices_restrict_the_plan():
    lens = np.random.default_rng(1).integers(1, 900, 3000)
    ids = np.arange(0, 3000, 3)
    plan = plan_epoch(lens, PlanConfig(max_tokens=2048, layout="pack", world_size=3), indices=ids)
    assert np.array_equal(np.sort(plan.indices), ids)
    _check_plan(plan, lens, 2048)
    # every id, in another order: rows still hold the right samples
    shuffled = np.random.default_rng(2).permutation(3000)
    plan = plan_epoch(lens, PlanConfig(max_tokens=2048, layout="pack"), indices=shuffled)
    assert np.array_equal(np.sort(plan.indices), np.arange(3000))
    assert max(lens[plan.batch(k)].sum() for k in range(plan.total_batches)) <= 2048


def test_rows_per_batch_groups_rows():
    lens = np.random.default_rng(2).integers(1, 700, 5000)
    plan = plan_epoch(lens,
                      PlanConfig(max_tokens=2048, layout="pack", world_size=2, grad_accum=2,
                                 rows_per_batch=4))
    _check_plan(plan, lens, 2048)
    k = plan.total_batches - 1
    rows = plan.batch_rows(k)
    assert len(rows) == 4 and np.array_equal(np.concatenate(rows), plan.batch(k))
    assert plan.stats["padding_efficiency"] > 0.99
    assert plan.stats["rows"] == 4 * plan.total_batches


# ------------------------------------------------------------ overflow


def test_split_cuts_consecutive_pieces():
    cfg = PlanConfig(max_tokens=16, layout="pack", on_overflow="split")
    plan = plan_packed_epoch([40, 9, 32, 3], cfg, seed=0, epoch=0)
    got = sorted(zip(plan.indices.tolist(), map(tuple, plan.token_spans.tolist()), strict=True))
    assert got == [(0, (0, 16)), (0, (16, 16)), (0, (32, 8)), (1, (0, 9)),
                   (2, (0, 16)), (2, (16, 16)), (3, (0, 3))]
    assert plan.lengths.tolist() == [40, 9, 32, 3]
    s = plan.stats
    assert (s["split_samples"], s["split_pieces"], s["truncated"]) == (2, 5, 0)
    assert s["real_tokens"] == 84 and s["pieces"] == 7 and s["repeated_in_schedule"] == 0
    for k in range(plan.total_batches):
        assert plan.batch_spans(k)[:, 1].sum() <= 16


def test_split_respects_max_len_first():
    cfg = PlanConfig(max_tokens=16, layout="pack", on_overflow="split", max_len=20)
    plan = plan_packed_epoch([40, 5], cfg, seed=0, epoch=0)
    assert sorted(map(tuple, plan.token_spans[plan.indices == 0].tolist())) == [(0, 16), (16, 4)]
    assert plan.counts["truncated"] == 1 and plan.counts["split_samples"] == 1


def test_truncate_drop_error():
    lens = [40, 9, 3, 17]
    plan = plan_epoch(lens, PlanConfig(max_tokens=16, layout="pack"))
    assert plan.lengths.tolist() == [16, 9, 3, 16] and plan.stats["truncated"] == 2
    dropped = plan_epoch(lens, PlanConfig(max_tokens=16, layout="pack", on_overflow="drop"))
    assert sorted(dropped.indices.tolist()) == [1, 2]
    assert dropped.stats["dropped_overflow"] == 2
    with pytest.raises(LengthError, match="row 0: length 40"):
        plan_epoch(lens, PlanConfig(max_tokens=16, layout="pack", on_overflow="error"))


@pytest.mark.parametrize("kw, match", [
    (dict(batch_size=4), "needs max_tokens"),
    (dict(max_tokens=64, order="interleave"), "supports order"),
    (dict(max_tokens=64, on_overflow="wrap"), "on_overflow must be one of"),
    (dict(max_tokens=64, rows_per_batch=0), "rows_per_batch must be a positive"),
    (dict(max_tokens=64, world_size=8), "cannot fill"),
])
def test_bad_configuration(kw, match):
    with pytest.raises(ValueError, match=match):
        plan_epoch([5, 9, 30], PlanConfig(layout="pack", **kw))


def test_even_out_repeat_and_drop_are_counted():
    lens = [5, 9, 30]
    rep = plan_epoch(lens,
                     PlanConfig(max_tokens=64, layout="pack", world_size=4, even_out="repeat"))
    assert rep.total_batches == 4 and rep.stats["repeated"] >= 1
    assert set(rep.indices.tolist()) == {0, 1, 2}
    lens = np.random.default_rng(0).integers(1, 60, 50)
    drop = plan_epoch(lens, PlanConfig(max_tokens=64, layout="pack", world_size=4, even_out="drop"))
    assert drop.total_batches % 4 == 0
    assert drop.stats["dropped_to_even_out"] == 50 - drop.indices.size


# ------------------------------------------------------------ balance and mix


def test_schedule_groups_balances_slots_and_spreads_weight():
    rng = np.random.default_rng(0)
    cost = np.concatenate((np.full(16, 10.0), rng.uniform(1, 2, 48)))
    weight = cost ** 2
    order = schedule_groups(cost, weight, 4, 2, rng)
    assert sorted(order.tolist()) == list(range(64))
    per_slot = cost[order].reshape(-1, 4)
    assert (per_slot.max(1) / per_slot.mean(1)).max() < 1.5
    # the four groups of costly rows land in four different steps
    heavy_steps = np.flatnonzero((cost[order] == 10.0).reshape(-1, 8).any(1))
    assert heavy_steps.size == 4


def test_bundled_sft_mix_targets():
    lens = load_lengths("sft_mix")
    cost = CostModel(a=1, b=1 / 4096)
    plan = plan_epoch(lens,
                      PlanConfig(max_tokens=8192, layout="pack", world_size=4, grad_accum=8,
                                 cost=cost))
    shuffled = plan_epoch(lens,
                          PlanConfig(max_tokens=8192, layout="pack", world_size=4, grad_accum=8,
                                     cost=cost, order="random"))
    s, r = plan.stats, shuffled.stats
    assert isinstance(plan, PackedEpochPlan)
    assert s["padding_efficiency"] >= 0.995 and s["fill"] == s["padding_efficiency"]
    assert s["rank_imbalance_p99"] <= 1.05 < r["rank_imbalance_p99"]
    assert s["step_cv_ratio"] <= 1.0
    assert s["unique_samples"] == lens.size and s["repeated_in_schedule"] == 0


# ------------------------------------------------------------ a real model


VOCAB = 61


def _tiny_llama(impl):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, attn_implementation=impl, use_cache=False,
                      initializer_range=0.2)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_micro_batch_loss_equals_samples_one_by_one(impl):
    torch = pytest.importorskip("torch")
    from lengthwise.pytorch.collate import PackCollator, model_inputs

    rng = np.random.default_rng(4)
    lengths = rng.integers(2, 40, 30)
    tokens = [rng.integers(1, VOCAB, n) for n in lengths]
    plan = plan_epoch(lengths, PlanConfig(max_tokens=64, layout="pack", rows_per_batch=2), seed=1)
    k = int(np.argmax([len(plan.batch(i)) for i in range(plan.total_batches)]))
    rows = [[{"input_ids": tokens[i]} for i in row.tolist()] for row in plan.batch_rows(k)]
    assert sum(len(r) for r in rows) >= 3
    model = _tiny_llama(impl)
    with torch.no_grad():
        total, count = 0.0, 0
        for i in plan.batch(k).tolist():
            ids = torch.as_tensor(tokens[i])[None]
            total += model(input_ids=ids, labels=ids).loss.item() * (lengths[i] - 1)
            count += int(lengths[i] - 1)
        alone = total / count
        batch = PackCollator(row_capacity=64)(rows)
        assert batch["real_tokens"] == int(lengths[plan.batch(k)].sum())
        packed = model(**model_inputs(batch)).loss.item()
        # without the boundaries (one causal sequence) attention crosses samples
        leaky = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss.item()
    assert packed == pytest.approx(alone, rel=1e-5)
    assert abs(leaky - alone) > 1e-3


def test_sampler_yields_the_plans_rows_to_the_collator():
    """Several rows per micro-batch reach PackCollator exactly as the plan packed them."""
    import torch
    from torch.utils.data import DataLoader

    from lengthwise import BucketBatchSampler, PackCollator, RowsDataset

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 300, 400)
    data = [{"input_ids": list(range(1, n + 1))} for n in lengths.tolist()]
    sampler = BucketBatchSampler(lengths,
                                 PlanConfig(max_tokens=512, layout="pack", rows_per_batch=3),
                                 yield_rows=True, num_replicas=2, rank=1, seed=3)
    loader = DataLoader(RowsDataset(data), batch_sampler=sampler,
                        collate_fn=PackCollator(row_capacity=512, pad_to_capacity=True,
                                                pad_token_id=0))
    plan = sampler.plan
    seen = []
    for pos, batch in enumerate(loader):
        rows = plan.batch_rows(1 + pos * 2)
        # padded to (rows, 512): every row of the plan starts at a multiple of 512
        pieces = []
        for row in rows:
            pieces += [int(lengths[i]) for i in row]
            if 512 - int(lengths[row].sum()):
                pieces.append(512 - int(lengths[row].sum()))
        assert batch["cu_seq_lens_q"].tolist() == np.cumsum([0] + pieces).tolist()
        assert batch["padded_tokens"] == len(rows) * 512
        assert batch["samples"] == sum(len(r) for r in rows)
        seen.extend(i for row in rows for i in row.tolist())
    assert len(seen) == len(set(seen)) and isinstance(batch["input_ids"], torch.Tensor)
    assert sorted(seen) == sorted(np.concatenate(plan.rank_batches(1)).tolist())
