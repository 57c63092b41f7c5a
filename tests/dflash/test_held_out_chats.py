"""``experiments.held_out_chats``: the chats the draft benchmarks hold out and measure alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_the_split_seed_holds_out_the_chats_dflash_train_holds_out(tiny_prepared):
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import _split
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    from experiments.held_out_chats import held_out_chats

    target, prepared = tiny_prepared
    data = open_prepared(prepared)
    for split_seed in (0, 3):
        held = [held_out_chats(data, DFlashTrainConfig(seed=seed), 6, split_seed=split_seed)
                for seed in (0, 1, 7)]
        for chats, seed in zip(held, (0, 1, 7), strict=True):  # whatever the run's seed
            trained = _split(data, DFlashTrainConfig(seed=seed), RunSettings(
                target=str(target), data=str(prepared), eval_samples=6, split_seed=split_seed))
            assert chats.ids.tolist() == trained.held_idx.tolist()
            assert chats.train.tolist() == trained.train_idx.tolist()
            assert chats.ids.tolist() == held[0].ids.tolist()
    other = held_out_chats(data, DFlashTrainConfig(), 6, split_seed=1)
    assert other.ids.tolist() != held[0].ids.tolist()


def test_each_chat_is_measured_alone_cut_to_max_len(tiny_prepared, tmp_path):
    from lengthwise.dflash.features import CachedRows, FeaturesConfig, open_features, write_features
    from lengthwise.dflash.mask_token import ensure_mask_token
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import new_draft
    from lengthwise.dflash.target import Target, load_target, load_tokenizer
    from lengthwise.dflash.teacher_forced import evaluate_blocks, held_out_batches
    from lengthwise.dflash.train_config import DFlashTrainConfig

    from experiments.held_out_chats import held_out_chats

    target_dir, prepared = tiny_prepared
    write_features(prepared, target_dir, tmp_path / "features",
                   FeaturesConfig(num_features=2, dtype="float32", progress=False))
    cache = open_features(tmp_path / "features", verify=False)
    model = load_target(target_dir)
    mask = ensure_mask_token(load_tokenizer(target_dir), model)
    target = Target(model, layers=cache.layers)
    cfg = DFlashTrainConfig(block_size=4, draft_layers=2, num_features=2, max_len=64)
    draft = new_draft(target, cfg, mask_token_id=mask.id)
    data = open_prepared(prepared)
    chats = held_out_chats(data, cfg, 3, split_seed=0)
    per = chats.figures(draft, target, cache, ("loss", "accuracy"), num_anchors=4, seed=0)
    assert per["chat"] == chats.ids.tolist() and data.lengths[chats.ids].max() > 64
    for i, j in enumerate(chats.ids):
        ((batch, _),) = chats.batches(int(j))
        assert batch["input_ids"].shape == (1, min(64, int(data.lengths[j])))
        one = held_out_batches([{k: v[:64] for k, v in data.sample(int(j)).items()}])
        ev = evaluate_blocks(draft, target, one, num_anchors=4, seed=0,
                             features=CachedRows(cache, cache.layers, lambda sid, j=j: int(j)))
        assert ev.count > 0 and per["loss"][i] == ev.loss and per["accuracy"][i] == ev.accuracy
