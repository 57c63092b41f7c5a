"""Bad parameters and data are refused at construction, naming what is wrong."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _dflash_run import config  # noqa: E402
from _dflash_tiny import tiny_draft, tiny_target  # noqa: E402

from lengthwise.dflash.model import DFlashConfig, check_target  # noqa: E402
from lengthwise.dflash.speculative import acceptance, speculative_batch  # noqa: E402
from lengthwise.dflash.train import DFlashTask  # noqa: E402
from lengthwise.dflash.train_config import DFlashTrainConfig  # noqa: E402
from lengthwise.errors import ConfigError, DataError  # noqa: E402
from lengthwise.train.loop import TrainLoop  # noqa: E402

BASE = dict(hidden_size=32, num_heads=4, num_kv_heads=2, num_target_layers=4)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("block_size", 2.5, "block_size must be a positive integer, got 2.5"),
    ("block_size", 1, "block_size must be >= 2"),
    ("num_heads", 0, "num_heads must be a positive integer, got 0"),
    ("num_kv_heads", 0, "num_kv_heads must be a positive integer, got 0"),
    ("hidden_size", 0, "hidden_size must be a positive integer, got 0"),
    ("num_layers", -1, "num_layers must be a positive integer, got -1"),
    ("num_features", 0, "num_features must be a positive integer, got 0"),
    ("target_layers", [], "target_layers is empty"),
    ("target_layers", [1, 4], r"target_layers \[1, 4\]: \[4\] not in \[0, 4\)"),
    ("target_layers", [-1, 2], r"\[-1\] not in"),
    ("gamma", 0.0, "gamma must be a finite number > 0"),
    ("gamma", math.nan, "gamma must be a finite number > 0"),
    ("mask_token_id", -1, "mask_token_id must be a token id >= 0"),
    ("rope_theta", 0.0, "rope_theta must be a finite number > 0"),
])
def test_a_draft_config_that_cannot_work_is_refused_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        DFlashConfig(**{**BASE, field: value})


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(hidden_size=64), "draft hidden_size 64 differs from the target's 32"),
    (dict(num_target_layers=6, target_layers=[1, 2]), "built for a target of 6 layers"),
    (dict(target_layers=[0, 3]), r"reads target layers \[0, 3\] but the target gives layers"),
    (dict(num_features=3, target_layers=None, num_target_layers=None),
     "takes 3 target features but the target gives 2"),
    (dict(mask_token_id=40), "mask_token_id 40 is outside the target's vocabulary of 40"),
])
def test_a_draft_that_does_not_fit_its_target_is_refused(overrides, message):
    target = tiny_target()
    cfg = {**BASE, "target_layers": target.layers, "intermediate_size": 64, **overrides}
    with pytest.raises(ConfigError, match=message):
        check_target(DFlashConfig(**cfg), target)


def test_a_training_block_size_the_draft_was_not_built_for_is_refused(pair):
    target, draft = pair  # built for blocks of 4
    with pytest.raises(ConfigError, match="block_size=8 but the draft was built for blocks of 4"):
        DFlashTask(draft, target, config(block_size=8), order="stratified")
    with pytest.raises(ConfigError, match="draft_layers=2 but the draft has 1 layers"):
        DFlashTask(draft, target, config(draft_layers=2), order="stratified")
    with pytest.raises(ConfigError, match="num_features=3 but the draft reads 2"):
        DFlashTask(draft, target, config(num_features=3), order="stratified")


@pytest.mark.parametrize("gamma", [-1, 0, math.inf, math.nan, "7"])
def test_a_gamma_that_is_not_a_positive_number_is_refused(gamma):
    with pytest.raises(ConfigError, match="gamma must be a finite number > 0"):
        DFlashTrainConfig(gamma=gamma)


def test_the_training_gamma_weighs_the_slots(pair):
    from lengthwise.pytorch.collate import PadCollator

    target, draft = pair  # the draft's own default gamma for blocks of 4 is 1.8
    batch = PadCollator(pad_token_id=0)([{"input_ids": list(range(1, 13)),
                                          "labels": list(range(1, 13))}])
    for gamma in (3.0, None):
        task = DFlashTask(draft, target, config(gamma=gamma), order="stratified")
        w = task.prepare(batch, [[0]], 0).weights[0, 0].tolist()
        want = gamma or draft.config.gamma
        assert w == pytest.approx([0.0, 1.0, math.exp(-1 / want), math.exp(-2 / want)])


def _data(prompt_share: str):
    from lengthwise.demo.dflash_data import DFlashData

    rng = np.random.default_rng(3)
    lengths = rng.integers(6, 60, 48)
    ids = [rng.integers(1, 40, int(n)) for n in lengths]
    plens = lengths - 1 if prompt_share == "all but one" else rng.integers(1, 4, 48)
    return DFlashData(ids=ids, prompt_lens=plens, held=np.zeros(0, dtype=np.int64))


def _loop(pair, tmp_path, order, data, **kw):
    target, draft = pair
    cfg = config(steps=2, **kw)
    return TrainLoop(DFlashTask(draft, target, cfg, order=order), order, data.lengths,
                     data.sample, cfg, run_dir=tmp_path / order, device=torch.device("cpu"))


def test_data_with_no_two_consecutive_supervised_tokens_is_refused_before_training(pair,
                                                                                   tmp_path):
    with pytest.raises(DataError, match="none of the 48 samples has two consecutive supervised"):
        with pytest.warns(UserWarning, match="truncated"):
            _loop(pair, tmp_path, "stratified", _data("all but one"))


@pytest.mark.parametrize("order", ["stratified", "packed"])
def test_samples_longer_than_max_len_are_truncated_as_the_plan_counted(pair, tmp_path, order):
    data = _data("short prompts")
    assert data.lengths.max() > 24  # max_len of config()
    with pytest.warns(UserWarning, match="truncated to 24 tokens"):
        loop = _loop(pair, tmp_path, order, data)
    try:
        recs = [loop.step() for _ in range(2)]
    finally:
        loop.close()
    assert all(math.isfinite(r["loss"]) and r["slots"] > 0 for r in recs)
    assert all(0 < r["slot_efficiency"] <= 1 for r in recs)


@pytest.mark.parametrize(("prompt", "new", "message"), [
    ([], 4, "prompt is empty"),
    ([1, 2], 0, "max_new_tokens must be a positive integer, got 0"),
    ([1, 2], 2.5, "max_new_tokens must be a positive integer, got 2.5"),
    ([1, 40], 4, r"prompt token 40 is not a token id of the target's vocabulary \[0, 40\)"),
])
def test_decoding_parameters_that_cannot_work_are_refused(pair, prompt, new, message):
    target, draft = pair
    with pytest.raises(ConfigError, match=message):
        speculative_batch(draft, target, [prompt], max_new_tokens=new)
    with pytest.raises(ConfigError, match=message):
        acceptance(draft, target, [[1, 2], prompt], max_new_tokens=new)


def test_decoding_with_a_draft_of_another_target_is_refused(pair):
    target, _ = pair
    other = tiny_draft(tiny_target(layers=6))
    with pytest.raises(ConfigError, match="built for a target of 6 layers"):
        speculative_batch(other, target, [[1, 2]], max_new_tokens=4)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler")  # a skipped step 1
def test_a_step_with_nothing_supervised_makes_no_update(pair, tmp_path):
    """Only sample 0 can be trained on: every other step is skipped and leaves the draft as is."""
    from lengthwise.demo.dflash_data import DFlashData

    rng = np.random.default_rng(5)
    lengths = rng.integers(6, 20, 24)
    ids = [rng.integers(1, 40, int(n)) for n in lengths]
    plens = lengths - 1
    plens[0] = 1
    data = DFlashData(ids=ids, prompt_lens=plens, held=np.zeros(0, dtype=np.int64))
    target, draft = pair
    cfg = config(steps=6, grad_accum=1, max_tokens=24, spike_guard=False)
    loop = TrainLoop(DFlashTask(draft, target, cfg, order="random"), "random", data.lengths,
                     data.sample, cfg, run_dir=tmp_path, device=torch.device("cpu"))
    try:
        recs = []
        for _ in range(cfg.steps):
            before = [p.detach().clone() for p in draft.parameters()]
            rec = loop.step()
            same = all(torch.equal(a, b) for a, b in zip(before, draft.parameters(),
                                                         strict=True))
            recs.append((rec["skipped"], same, rec["slots"]))
    finally:
        loop.close()
    assert any(slots == 0 for _, _, slots in recs)
    for skipped, same, slots in recs:
        assert skipped == (slots == 0) and same == skipped
