"""The collators check what they are given and what they hand on, in both layouts."""

import pytest
import torch
from transformers import BatchEncoding

from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch import BucketBatchSampler
from lengthwise.pytorch.collate import BudgetError, HeldCollator, PackCollator, PadCollator


@pytest.mark.parametrize("layout", ["pad", "pack"])
@pytest.mark.parametrize("value, exc, match", [
    (-1, ValueError, "pad_token_id must be >= 0, got -1"),
    (1.0, TypeError, "pad_token_id must be an integer, got 1.0"),
    (True, TypeError, "pad_token_id must be an integer, got True"),
])
def test_pad_token_id_is_a_token_id(layout, value, exc, match):
    sampler = BucketBatchSampler([5, 3, 8, 2], PlanConfig(max_tokens=16, layout=layout))
    with pytest.raises(exc, match=match):
        sampler.collator(pad_token_id=value)


@pytest.mark.parametrize("make", [
    lambda **kw: PadCollator(0, **kw), lambda **kw: PackCollator(**kw)])
def test_label_pad_id_is_an_integer_in_both_layouts(make):
    with pytest.raises(TypeError, match="label_pad_id must be an integer, got 0.5"):
        make(label_pad_id=0.5)
    assert make(label_pad_id=-100).label_pad_id == -100


def test_packed_options_are_checked():
    with pytest.raises(ValueError, match="position_ids_start must be >= 0, got -2"):
        PackCollator(position_ids_start=-2)
    with pytest.raises(TypeError, match="mask_dtype must be torch.bool or a floating dtype"):
        PackCollator(mask_dtype="float")


def _padded(samples):
    n = max(len(s["input_ids"]) for s in samples)
    return torch.tensor([s["input_ids"] + [0] * (n - len(s["input_ids"])) for s in samples])


@pytest.mark.parametrize("layout, result, match", [
    ("pad", lambda s: (_padded(s),), "returned a tuple; it must return a mapping"),
    ("pad", lambda s: {"ids": _padded(s)}, r"returned a mapping with keys \['ids'\]"),
    ("pad", lambda s: {"input_ids": _padded(s).tolist()}, "input_ids is a list"),
    ("pad", lambda s: {"input_ids": _padded(s).flatten()}, r"input_ids has shape \(\d+,\)"),
    ("pack", lambda s: [_padded(s)], "returned a list"),
    ("pack", lambda s: {"input_ids": _padded(s)[None]}, r"input_ids has shape \(1, \d+, \d+\)"),
])
def test_held_collator_refuses_what_it_cannot_check(layout, result, match):
    held = HeldCollator(result, PlanConfig(max_tokens=8, layout=layout))
    with pytest.raises(TypeError, match="HeldCollator: micro-batch 0: .*" + match):
        held([{"input_ids": [1, 2, 3]}])


def test_held_collator_checks_mappings_and_flat_packed_rows():
    held = HeldCollator(lambda s: BatchEncoding({"input_ids": _padded(s)}),
                        PlanConfig(max_tokens=8))
    assert held([{"input_ids": [1] * 20}])["input_ids"].shape == (1, 8)  # truncated to the plan
    with pytest.raises(BudgetError, match="micro-batch 1 is over the plan's budget"):
        held([{"input_ids": [1] * 5}, {"input_ids": [1] * 5}])
    flat = HeldCollator(lambda s: {"input_ids": torch.ones(sum(len(x["input_ids"]) for x in s))},
                        PlanConfig(max_tokens=8, layout="pack"))
    assert flat([{"input_ids": [1] * 3}, {"input_ids": [1] * 5}])["input_ids"].numel() == 8
    with pytest.raises(BudgetError, match="9 tokens > 1 rows x 8 tokens"):
        flat([{"input_ids": [1] * 4}, {"input_ids": [1] * 5}])


def test_held_collator_needs_the_plan_config():
    with pytest.raises(TypeError, match=r"config must be the plan's PlanConfig \(sampler.config\)"):
        HeldCollator(_padded, {"max_tokens": 8})


def test_held_collator_cuts_labels_shifted_ahead_of_time_with_their_offset():
    import torch

    from lengthwise.planning.config import PlanConfig
    from lengthwise.pytorch.collate import HeldCollator

    def inner(samples):  # pads each field to its own longest, as DataCollatorForSeq2Seq does
        out = {}
        for key in ("input_ids", "labels"):
            n = max(len(s[key]) for s in samples)
            out[key] = torch.tensor([s[key] + [-100] * (n - len(s[key])) for s in samples])
        return out

    ids = list(range(1, 21))
    batch = HeldCollator(inner, PlanConfig(max_tokens=8))(
        [{"input_ids": ids, "labels": ids[1:]}])
    assert batch["input_ids"].tolist() == [ids[:8]]
    assert batch["labels"].tolist() == [ids[1:8]]  # still the next token of each position
