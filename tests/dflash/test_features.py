"""The feature cache: one pass of the target, read back by training; every bad cache refused."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess

import numpy as np
import pytest
from _chat_tiny import conversations, save_target, write_jsonl
from _cli import launcher

from lengthwise.dflash.features import (
    FeaturesConfig,
    _to_stored,
    open_features,
    plan_pass,
    write_features,
)
from lengthwise.errors import ConfigError, DataError, DiskFullError

torch = pytest.importorskip("torch")

SMALL = dict(num_features=2, shard_mib=1, progress=False)


@pytest.fixture(scope="module")
def made(tiny_prepared, tmp_path_factory):
    """``(target, prepared, float32 cache)``: the tiny target's features of every sample."""
    target, prepared = tiny_prepared
    cache = tmp_path_factory.mktemp("features") / "cache"
    write_features(prepared, target, cache, FeaturesConfig(dtype="float32", **SMALL))
    return target, prepared, cache


def _copy(cache, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(cache, dst)
    return dst


def test_cache_holds_the_targets_features_of_each_sample(made):
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.target import Target, load_target

    target, prepared, cache = made
    data = open_prepared(prepared)
    c = open_features(cache)
    assert len(c) == len(data) and c.layers == [1, 2]
    tgt = Target(load_target(target), layers=[1, 2])
    for i in (0, 7, len(data) - 1):
        ids = torch.from_numpy(data.sample(i)["input_ids"]).unsqueeze(0)
        feats, last = tgt.features_and_output(ids)
        torch.testing.assert_close(c.features(i, [1, 2]), feats[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.features(i, [2]), feats[0, :, 32:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.last(i), last[0], rtol=1e-5, atol=1e-5)


def _train(target, prepared, out, features=None, steps=1):
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    cfg = DFlashTrainConfig(steps=steps, max_tokens=256, max_len=200, block_size=4,
                            num_anchors=4, draft_layers=2, lr=1e-3, progress=False, threads=1,
                            checkpoint_every=0)
    run = RunSettings(target=str(target), data=str(prepared), out=str(out), eval_samples=4,
                      eval_every=steps, features=None if features is None else str(features))
    summary = train_draft(cfg, run, progress=False)
    return [json.loads(line) for line in open(summary["log"]) if '"loss"' in line]


def test_first_step_from_a_float32_cache_equals_the_online_step(made, tmp_path):
    target, prepared, cache = made
    online = _train(target, prepared, tmp_path / "online", steps=2)
    cached = _train(target, prepared, tmp_path / "cached", cache, steps=2)
    assert abs(cached[0]["loss"] - online[0]["loss"]) <= 1e-6
    assert cached[0]["accuracy"] == online[0]["accuracy"]
    # the held-out evaluation reads the cache too (its last hidden states): the same figures
    for key in ("eval_loss", "eval_expected_acceptance"):
        assert abs(cached[-1][key] - online[-1][key]) <= 1e-5


def test_float16_cache_trains_within_rounding_of_float32(made, tmp_path):
    target, prepared, _ = made
    cache = tmp_path / "f16"
    write_features(prepared, target, cache, FeaturesConfig(**SMALL))
    assert open_features(cache).dtype == "float16"
    online = _train(target, prepared, tmp_path / "online")
    cached = _train(target, prepared, tmp_path / "cached", cache)
    assert abs(cached[0]["loss"] - online[0]["loss"]) <= 1e-3 * online[0]["loss"]


def test_a_finished_cache_is_kept_and_another_refused(made, tmp_path, capsys):
    target, prepared, cache = made
    copy = _copy(cache, tmp_path)
    before = (copy / "features.json").read_text()
    write_features(prepared, target, copy, FeaturesConfig(dtype="float32", **SMALL))
    assert (copy / "features.json").read_text() == before
    assert "nothing to do" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="other settings.*--overwrite"):
        write_features(prepared, target, copy, FeaturesConfig(**SMALL))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a feature cache"):
        write_features(prepared, target, tmp_path / "other", FeaturesConfig(**SMALL))


def test_interrupted_pass_keeps_finished_shards_and_resumes(made, tmp_path, monkeypatch):
    import lengthwise.dflash.features as features

    target, prepared, cache = made
    cfg = FeaturesConfig(dtype="float32", num_features=2, shard_mib=1, max_tokens=64,
                         progress=False)
    out = tmp_path / "cache"
    real_close, closed = features._ShardWriter.close, []

    def close_then_stop(self):
        got = real_close(self)
        closed.append(self.names[0])
        if len(closed) == 2:
            raise KeyboardInterrupt
        return got

    monkeypatch.setattr(features._ShardWriter, "close", close_then_stop)
    # shards of a few rows: 1 MiB holds 2,730 tokens of 3 x 32 float32 values, so shrink it
    monkeypatch.setattr(features, "cache_bytes",
                        lambda tokens, *a, **k: int(tokens) * 2**17)
    with pytest.raises(KeyboardInterrupt):
        write_features(prepared, target, out, cfg)
    assert (out / "pass.json").is_file()
    # the second shard's files were renamed, its mark never written: it is not done
    assert sorted(p.name for p in out.glob("done_*.json")) == ["done_00000.json"]
    assert not (out / "features.json").exists()
    assert not list(out.glob(".*"))  # no half-written file is left
    with pytest.raises(DataError, match="did not finish"):
        open_features(out)
    monkeypatch.setattr(features._ShardWriter, "close", real_close)
    closed.clear()
    written = []
    monkeypatch.setattr(features._ShardWriter, "close",
                        lambda self: written.append(self.names[0]) or real_close(self))
    write_features(prepared, target, out, cfg)
    assert "features_00000.npy" not in written and len(written) >= 1
    c = open_features(out)
    ref = open_features(cache)
    for i in range(len(c)):
        torch.testing.assert_close(c.features(i, [1, 2]), ref.features(i, [1, 2]),
                                   rtol=1e-5, atol=1e-5)


def test_a_full_disk_is_refused_before_any_work(made, tmp_path, monkeypatch):
    import lengthwise.dflash.features as features

    target, prepared, _ = made
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(ConfigError, match=r"needs .* more and the disk there has 1000 bytes"):
        write_features(prepared, target, tmp_path / "c", FeaturesConfig(**SMALL))
    assert not list((tmp_path / "c").glob("*.npy"))
    monkeypatch.undo()

    def no_room(self, *args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(features._ShardWriter, "put", no_room)
    with pytest.raises(DiskFullError, match="writing shard 0 into .* the disk is full"):
        write_features(prepared, target, tmp_path / "c", FeaturesConfig(**SMALL))
    assert not list((tmp_path / "c").glob("features_*")) and not list(
        (tmp_path / "c").glob(".*"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_a_damaged_shard_is_refused(made, tmp_path, damage):
    copy = _copy(made[2], tmp_path)
    shard = copy / "features_00000.npy"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(bytes(data[:-100]))
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()
    with pytest.raises(DataError, match="features_00000.npy is (damaged|missing)"):
        open_features(copy)


def test_not_a_cache(tmp_path):
    with pytest.raises(DataError, match="not a feature cache"):
        open_features(tmp_path)
    (tmp_path / "features.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="not a feature cache's record"):
        open_features(tmp_path)


def test_a_cache_of_another_target_layers_or_data_is_refused(made, tmp_path):
    target, prepared, cache = made
    c = open_features(cache)
    with pytest.raises(DataError, match="holds target layers \\[1, 2\\], not \\[3\\]"):
        c.check(weights=c.record["target"]["weights"], layers=[1, 3], fingerprint="",
                tokenizer={}, max_len=1, data="d")
    other = save_target(tmp_path / "other_target", seed=5)
    with pytest.raises(DataError, match="another target's weights"):
        _train(other, prepared, tmp_path / "b", cache)
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(30, seed=9))
    prepare_chats(chats, target, tmp_path / "prepared",
                  PrepareConfig(min_supervised=16, progress=False))
    with pytest.raises(DataError, match="other samples than --data"):
        _train(target, tmp_path / "prepared", tmp_path / "c", cache)
    cut = tmp_path / "cut"
    write_features(prepared, target, cut, FeaturesConfig(max_len=10, **SMALL))
    with pytest.raises(DataError, match="stores 10 tokens per sample"):
        _train(target, prepared, tmp_path / "d", cut)


def test_float16_out_of_range_is_refused():
    with pytest.raises(DataError, match="beyond float16's range.*bfloat16"):
        _to_stored(torch.tensor([1.0, 7e4]), "float16", "sample 3")
    bits = _to_stored(torch.tensor([1.0, 7e4]), "bfloat16", "sample 3")
    assert bits.dtype == np.uint16


def test_plan_covers_every_token_once():
    lengths = np.random.default_rng(0).integers(1, 300, 200)
    p = plan_pass(lengths, max_tokens=512, shard_tokens=2000)
    assert sorted(p.order.tolist()) == list(range(200))
    assert (p.index[:, 2] == lengths).all()
    for s in range(p.shards.size - 1):
        rows = p.index[p.index[:, 0] == s]
        ends = np.sort(rows[:, 1] + rows[:, 2])
        starts = np.sort(rows[:, 1])
        assert starts[0] == 0 and (starts[1:] == ends[:-1]).all()  # no gap, no overlap
    batches = np.split(p.order, p.batches[1:-1])
    assert all(len(b) * lengths[b].max() <= 512 or len(b) == 1 for b in batches)


def test_cli_one_line_errors_and_help(tmp_path):
    launch, env = launcher()
    proc = subprocess.run([*launch, "-m", "lengthwise", "dflash", "features", str(tmp_path),
                           "--target", str(tmp_path), "--out", str(tmp_path / "c")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    helped = subprocess.run([*launch, "-m", "lengthwise", "dflash", "features", "--help"],
                            env=env, capture_output=True, text=True, timeout=300).stdout
    assert "(default: float16)" in helped and "--no-last-hidden" in helped


def test_two_ranks_write_the_cache_one_process_writes(made, tmp_path):
    """Under torchrun (gloo, 2 processes) the ranks share the shards; the same bytes."""
    from _cli import lengthwise

    target, prepared, cache = made
    out = tmp_path / "two"
    lengthwise("dflash", "features", str(prepared), "--target", str(target), "--out", str(out),
               "--num-features", "2", "--shard-mib", "1", "--dtype", "float32",
               "--max-tokens", "64", "--no-progress", nproc=2)
    one = tmp_path / "one"
    write_features(prepared, target, one, FeaturesConfig(
        dtype="float32", num_features=2, shard_mib=1, max_tokens=64, progress=False))
    a = json.loads((out / "features.json").read_text())
    b = json.loads((one / "features.json").read_text())
    assert len(a["shards"]) == len(b["shards"]) >= 1
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
    assert not list(out.glob("done_*")) and not (out / "pass.json").exists()
