"""A windowed sampler checks what a whole-epoch sampler checks, with the same messages."""

import numpy as np
import pytest

from lengthwise.planning.config import PlanConfig
from lengthwise.planning.errors import LengthError
from lengthwise.planning.state_checks import StateError
from lengthwise.planning.window_cursor import WindowCursor
from lengthwise.planning.windowed import WindowedPlan
from lengthwise.pytorch import BucketBatchSampler, ResumeError

LENS = np.random.default_rng(0).integers(1, 900, 1200)


def _sampler(**kw):
    return BucketBatchSampler(LENS, PlanConfig(max_tokens=4096), num_replicas=2,
                              **{"window": 400, **kw})


def _saved_mid_epoch():
    sampler = _sampler()
    batches = iter(sampler)
    for _ in range(5):
        next(batches)
    return sampler.state_dict()


@pytest.mark.parametrize("change, match", [
    ({"window_resumed": [[2, 1, -3]]}, r"window_resumed\[0\] yielded must be >= 0, got -3"),
    ({"window_resumed": [[0, 1, 3]]}, r"window_resumed\[0\] world_size must be >= 1, got 0"),
    ({"window_resumed": [[2, 0, 3]]}, r"window_resumed\[0\] grad_accum must be >= 1, got 0"),
    ({"window_resumed": "x"}, "window_resumed must be a list of"),
    ({"window_yielded": 2.5}, "window_yielded must be a whole number, got 2.5"),
    ({"window_yielded": True}, "window_yielded must be a whole number, got True"),
    ({"window_yielded": 99}, "window_yielded=99 is more than the epoch's yielded=5"),
    ({"window_index": -1}, "window_index must be >= 0, got -1"),
    ({"window_index": 99}, "window_index=99, but epoch 0 has 3 windows"),
    ({"world_size": 0}, "world_size must be >= 1, got 0"),
    ({"grad_accum": 0}, "grad_accum must be >= 1, got 0"),
])
def test_windowed_state_is_checked_like_the_whole_epoch_state(change, match):
    state = {**_saved_mid_epoch(), **change}
    sampler = _sampler()
    with pytest.raises(ResumeError, match=match):
        sampler.load_state_dict(state)
    assert sampler.remaining() == len(sampler)  # left as it was


def test_a_windowed_state_without_its_window_keys_is_refused():
    state = _saved_mid_epoch()
    del state["window_index"]
    with pytest.raises(ResumeError, match=r"missing \['window_index'\]"):
        _sampler().load_state_dict(state)


def test_a_cursor_refuses_ranks_or_accumulation_below_one():
    plan = WindowedPlan(LENS, PlanConfig(max_tokens=4096, world_size=2), window=400)
    state = WindowCursor(plan).state()
    for name in ("world_size", "grad_accum"):
        with pytest.raises(StateError, match=f"{name} must be >= 1, got 0"):
            WindowCursor(plan).load(state, **{"world_size": 2, "grad_accum": 1, name: 0})
    with pytest.raises(ValueError, match="world_size must be a positive whole number"):
        plan.plan_window(0, world_size=0)


@pytest.mark.parametrize("window", [None, 300])
def test_split_pieces_are_refused_by_every_sampler(window):
    lens = LENS.copy()
    lens[5] = 9000
    with pytest.raises(ValueError, match="on_overflow='split' cuts long samples into pieces"):
        BucketBatchSampler(lens, PlanConfig(max_tokens=4096, layout="pack", on_overflow="split"),
                           window=window)


@pytest.mark.parametrize("layout", ["pad", "pack"])
def test_on_overflow_error_names_the_sample_at_construction_in_both_plans(layout):
    lens = LENS.copy()
    lens[[1000, 1100]] = 5000
    messages = set()
    for window in (None, 300):
        with pytest.raises(LengthError) as err:
            BucketBatchSampler(lens,
                               PlanConfig(max_tokens=4096, layout=layout, on_overflow="error"),
                               window=window)
        messages.add(str(err.value))
    assert messages == {"sample 1000 has 5000 tokens, but one row holds at most 4096 under "
                        "max_tokens=4096 (2 samples are longer); raise the budget, or use "
                        "on_overflow='truncate' or 'drop'"}


@pytest.mark.parametrize("bad, match", [
    (-3, r"row 1111: -3(\.0)? is negative"), (np.nan, "row 1111: nan is not a finite length"),
    (2.5, "row 1111: 2.5 is not a whole number of tokens"),
    (np.inf, "row 1111: inf is too large for a length"),
    (None, "row 1111: None is not a number of tokens"),
])
def test_bad_lengths_read_the_same_whole_or_windowed(bad, match):
    lens = LENS.astype(object if bad is None else float)
    lens[1111] = bad
    for window in (None, 300):
        with pytest.raises(LengthError, match=match):
            list(BucketBatchSampler(lens, PlanConfig(max_tokens=4096), window=window))


def test_rows_per_batch_needs_the_packed_layout():
    with pytest.raises(ValueError, match="rows_per_batch=2 sets the packed rows of a "
                                         "micro-batch: it needs layout='pack'"):
        BucketBatchSampler(LENS, PlanConfig(max_tokens=4096, rows_per_batch=2))


def test_windowed_errors_name_the_mapped_file_as_whole_epoch_ones(tmp_path):
    path = tmp_path / "lens.npy"
    lens = LENS.astype(float)
    lens[1111] = np.nan
    np.save(path, lens)
    messages = set()
    for window in (None, 300):
        with pytest.raises(LengthError) as err:
            list(BucketBatchSampler(str(path), PlanConfig(max_tokens=4096), window=window))
        messages.add(str(err.value))
    assert messages == {f"lengths from {path}, row 1111: nan is not a finite length"}
    np.save(path, np.array(["2020-01-01"] * 10, dtype="datetime64[D]"))
    for window in (None, 3):
        with pytest.raises(LengthError, match=r"must be numbers of tokens, got dtype datetime64"):
            BucketBatchSampler(str(path), PlanConfig(batch_size=2), window=window)
