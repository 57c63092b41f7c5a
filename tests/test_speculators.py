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


def _draft():
    """A tiny EAGLE-3 draft of speculators on the CPU, and its training call's options."""
    transformers = pytest.importorskip("transformers")
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer = transformers.LlamaConfig(vocab_size=64, hidden_size=HIDDEN * 8, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=256)
    layer._attn_implementation = "eager"
    spec = SpeculatorsConfig(algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig()],
                             default_proposal_method="greedy",
                             verifier=VerifierConfig.from_config(layer, name_or_path=None))
    torch.manual_seed(0)
    model = Eagle3DraftModel(Eagle3SpeculatorConfig(transformer_layer_config=layer,
                                                    draft_vocab_size=64,
                                                    speculators_config=spec))
    with torch.no_grad():  # the embeddings and heads a real run loads from the verifier
        for name in ("embed_tokens", "lm_head", "verifier_lm_head"):
            getattr(model, name).weight.normal_(0, 0.02)
    kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=2, ttt_step_loss_decay=1.0)
    return model, kwargs


class DraftSamples(Samples):
    """Samples a draft model of hidden size ``8 * HIDDEN`` can train on."""

    def __getitem__(self, i):
        n = min(self.approx_lengths[i], SEQ)
        g = torch.Generator().manual_seed(int(i))
        return {"hidden_states": torch.randn(n, 24 * HIDDEN, generator=g),
                "input_ids": torch.randint(0, 64, (n,), generator=g),
                "verifier_last_hidden_states": torch.randn(n, 8 * HIDDEN, generator=g),
                "loss_mask": torch.ones(n, dtype=torch.bool), "lengths": torch.tensor([n]),
                "position_ids": torch.arange(n)}


def _train(model, kwargs, loader, steps, state=None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    losses = []
    for batch in loader:
        batch = {k: v for k, v in batch.items() if k != "error_records"}
        _, loss, _ = model(**batch, **kwargs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
        if len(losses) == steps:
            break
    return losses, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


@pytest.mark.slow
def test_a_tiny_eagle3_draft_trains_on_cpu_and_resumes_bit_identically(patched):
    lengths = LENGTHS[:40]
    data = DraftSamples(lengths)
    patched.setattr(loaders, "get_dp_size", lambda: 1)
    patched.setattr(loaders, "get_dp_rank", lambda: 0)

    def loader():
        out = loaders._setup_dataloader(data, SEQ, 8 * HIDDEN, num_workers=0, seed=5)
        out.batch_sampler.set_epoch(0)
        return out

    model, kwargs = _draft()
    whole, end = _train(model, kwargs, loader(), steps=-1)
    assert len(whole) == len(loader()) and all(np.isfinite(whole))
    model, kwargs = _draft()
    first, middle = _train(model, kwargs, loader(), steps=4)
    resumed = loader()
    owner = SimpleNamespace(train_loader=resumed, current_epoch=0, _resume_local_step=4,
                            global_step=4)
    Trainer._prepare_resume_skip(owner, 0)  # speculators' own mid-epoch resume
    model, kwargs = _draft()
    rest, after = _train(model, kwargs, resumed, steps=-1, state=middle)
    assert first + rest == whole
    for name, value in end["model"].items():
        assert torch.equal(after["model"][name], value), name
