"""lengthwise as the batch sampler of vLLM's ``speculators`` trainer (its real loader code)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("speculators.train.dataloader")

import speculators.train.dataloader as loaders  # noqa: E402
from speculators.train.trainer import Trainer  # noqa: E402

from lengthwise.pytorch.collate.budget import BudgetError  # noqa: E402
from lengthwise.speculators import SpeculatorsBatchSampler, use_in_speculators  # noqa: E402

HIDDEN, SEQ = 4, 128
LENGTHS = np.random.default_rng(2).integers(3, 60, 150)


class Samples(torch.utils.data.Dataset):
    """Samples in ``speculators``' format; token ids are the sample's index + 1."""

    def __init__(self, lengths, extra=0):
        self.approx_lengths = list(map(int, lengths))
        self.extra = extra  # tokens the samples have beyond approx_lengths
        self.hidden_states_dtype = torch.float32

    def __len__(self):
        return len(self.approx_lengths)

    def __getitem__(self, i):
        n = min(self.approx_lengths[i] + self.extra, SEQ)  # speculators truncates to max_len
        return {"hidden_states": torch.full((n, 3 * HIDDEN), float(i)),
                "input_ids": torch.full((n,), i + 1, dtype=torch.long),
                "verifier_last_hidden_states": torch.zeros(n, HIDDEN),
                "loss_mask": torch.ones(n, dtype=torch.bool),
                "lengths": torch.tensor([n]), "position_ids": torch.arange(n)}


@pytest.fixture
def patched(monkeypatch):
    monkeypatch.setattr(loaders, "MultipackDistributedBatchSamplerV2",
                        loaders.MultipackDistributedBatchSamplerV2)
    monkeypatch.setattr(loaders, "CollateFn", loaders.CollateFn)
    use_in_speculators()
    return monkeypatch


def _loader(monkeypatch, dataset, rank, world=2):
    monkeypatch.setattr(loaders, "get_dp_size", lambda: world)
    monkeypatch.setattr(loaders, "get_dp_rank", lambda: rank)
    return loaders._setup_dataloader(dataset, SEQ, HIDDEN, num_workers=0, seed=5)


def _samples(batch):
    """The samples of a collated row, from its token ids, checking none was cut."""
    ids = batch["input_ids"][0]
    docs = batch["document_ids"][0]
    found = []
    for d in range(int(docs.max()) + 1):
        tokens = ids[docs == d]
        i = int(tokens[0]) - 1
        assert (tokens == i + 1).all() and tokens.numel() == min(int(LENGTHS[i]), SEQ)
        found.append(i)
    return found


def test_every_sample_once_per_epoch_in_speculators_format(patched):
    data = Samples(LENGTHS)
    per_epoch = []
    for epoch in range(2):
        seen, counts = [], []
        for rank in range(2):
            loader = _loader(patched, data, rank)
            assert isinstance(loader.batch_sampler, SpeculatorsBatchSampler)
            loader.batch_sampler.set_epoch(epoch)  # as the trainer's train_epoch does
            rows = [_samples(b) for b in loader]
            for b in loader:
                assert b["input_ids"].shape == (1, SEQ) and b["hidden_states"].shape == (
                    1, SEQ, 3 * HIDDEN)
            counts.append(len(rows))
            seen += [i for row in rows for i in row]
        assert counts[0] == counts[1]  # no rank waits for another
        assert sorted(seen) == list(range(LENGTHS.size))
        per_epoch.append(seen)
    assert per_epoch[0] != per_epoch[1]


def test_the_trainer_fast_skip_resumes_at_the_next_micro_batch(patched):
    loader = _loader(patched, Samples(LENGTHS), rank=1)
    sampler = loader.batch_sampler
    sampler.set_epoch(1)
    full = [_samples(b) for b in loader]
    fresh = _loader(patched, Samples(LENGTHS), rank=1)
    fresh.batch_sampler.set_epoch(1)
    owner = SimpleNamespace(train_loader=fresh, current_epoch=1, _resume_local_step=3,
                            global_step=40)
    assert Trainer._prepare_resume_skip(owner, 1) == 3  # speculators' own resume code
    assert len(fresh) == len(full) - 3
    assert [_samples(b) for b in fresh] == full[3:]
    fresh.batch_sampler.set_epoch(2)
    assert len(fresh) == len(list(fresh.batch_sampler))  # the next epoch is whole


def test_a_row_over_the_budget_is_refused(patched):
    loader = _loader(patched, Samples(LENGTHS, extra=40), rank=0, world=1)
    with pytest.raises(BudgetError, match="total_seq_len=128"):
        for _ in loader:
            pass


def test_options_and_refusals():
    make = functools.partial(SpeculatorsBatchSampler, order="bucket-random")
    assert make(SEQ, LENGTHS, 1, 0).config.order == "bucket-random"
    with pytest.raises(ValueError, match="max_batches=4 would cut the epoch"):
        SpeculatorsBatchSampler(SEQ, LENGTHS, 1, 0, max_batches=4)
    dropped = SpeculatorsBatchSampler(32, LENGTHS, 1, 0, truncate_long_samples=False)
    assert dropped.plan.stats["dropped_overflow"] == int((LENGTHS > 32).sum())
