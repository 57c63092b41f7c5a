"""LengthwiseTrainer without a collator collates with its sampler's: inside the budget."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import TrainingArguments  # noqa: E402
from transformers.modeling_outputs import CausalLMOutput  # noqa: E402

from lengthwise.hf.trainer import LengthwiseTrainer  # noqa: E402
from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.pytorch.collate import PackCollator, PadCollator  # noqa: E402

LENGTHS = np.random.default_rng(0).integers(1, 3000, 400)
LENGTHS[:5] = [9000, 20000, 5000, 4100, 12000]  # longer than the budget and max_len


class Samples(torch.utils.data.Dataset):
    """Row i holds LENGTHS[i] tokens, untruncated."""

    def __len__(self):
        return LENGTHS.size

    def __getitem__(self, i):
        return {"input_ids": np.full(int(LENGTHS[i]), 3, dtype=np.int64)}


class TinyLM(torch.nn.Module):
    def __init__(self, pad=None):
        super().__init__()
        self.head = torch.nn.Embedding(8, 8)
        if pad is not None:
            self.config = type("Config", (), {"pad_token_id": pad})()

    def forward(self, input_ids, labels=None, **kwargs):
        return CausalLMOutput(loss=self.head(input_ids).mean())


def _trainer(tmp_path, model=None, **kw):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                             dataloader_num_workers=0, remove_unused_columns=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LengthwiseTrainer(model=model or TinyLM(), args=args, train_dataset=Samples(),
                                 lengths=LENGTHS, **kw)


@pytest.mark.parametrize("layout", ["pad", "pack"])
def test_default_collator_is_the_samplers_and_keeps_the_budget(tmp_path, layout):
    trainer = _trainer(tmp_path, pad_token_id=0,
                       plan=PlanConfig(max_tokens=4096, max_len=3500, layout=layout))
    collate = trainer.data_collator
    assert isinstance(collate, PadCollator if layout == "pad" else PackCollator)
    assert collate.budget is not None and collate.metadata is False
    sizes = [b["input_ids"].numel() for b in trainer.get_train_dataloader()]
    assert len(sizes) == len(trainer.lengthwise_sampler) and max(sizes) <= 4096


def test_pad_id_from_the_model_config_or_a_clear_error(tmp_path):
    trainer = _trainer(tmp_path, model=TinyLM(pad=5), plan=PlanConfig(max_tokens=4096))
    assert trainer.data_collator.pad_token_id == 5
    with pytest.raises(ValueError, match="needs a pad token id"):
        _trainer(tmp_path, plan=PlanConfig(max_tokens=4096))


def _pad_to(multiple):
    """A collator of one's own: pads to the longest, rounded up, and never truncates."""
    def collate(samples):
        n = max(len(s["input_ids"]) for s in samples)
        n = -(-n // multiple) * multiple
        ids = torch.zeros((len(samples), n), dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, : len(s["input_ids"])] = torch.as_tensor(s["input_ids"])
        return {"input_ids": ids}
    return collate


def test_a_given_collator_is_held_to_the_plan(tmp_path):
    from lengthwise.pytorch.collate import BudgetError, HeldCollator

    mine = PadCollator(0, metadata=False)
    trainer = _trainer(tmp_path, data_collator=mine, plan=PlanConfig(max_tokens=4096))
    assert isinstance(trainer.data_collator, HeldCollator) and trainer.data_collator.inner is mine
    sizes = [b["input_ids"].numel() for b in trainer.get_train_dataloader()]
    assert max(sizes) <= 4096  # the long samples were cut as the plan counted them
    # a collator padding to a coarser multiple than the plan's is caught, not passed on
    coarse = _trainer(tmp_path, data_collator=_pad_to(1024), plan=PlanConfig(max_tokens=4096))
    with pytest.raises(BudgetError, match="over the plan's budget"):
        for _ in coarse.get_train_dataloader():
            pass


def test_use_lengthwise_holds_the_trainers_collator(tmp_path):
    from transformers import Trainer

    from lengthwise.hf.trainer import use_lengthwise

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                             dataloader_num_workers=0, remove_unused_columns=False)
    trainer = Trainer(model=TinyLM(), args=args, train_dataset=Samples(),
                      data_collator=_pad_to(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        use_lengthwise(trainer, LENGTHS, PlanConfig(max_tokens=4096, max_len=3000))
    sizes = [b["input_ids"].numel() for b in trainer.get_train_dataloader()]
    assert len(sizes) == len(trainer.lengthwise_sampler) and max(sizes) <= 4096
