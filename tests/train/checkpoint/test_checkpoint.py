"""Checkpoints: exact resume, atomicity under crashes and failures, retention, events."""

from __future__ import annotations

import errno
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _full_disk import zip_writer_full  # noqa: E402

from lengthwise.train import (  # noqa: E402
    Checkpointer,
    StepLogger,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from lengthwise.train.checkpoint import CheckpointError, CorruptCheckpointError  # noqa: E402
from lengthwise.train.checkpoint import torch_backend as ckpt_module  # noqa: E402
from lengthwise.train.checkpoint.checkpointer import SharedCheckpointers  # noqa: E402
from lengthwise.train.checkpoint.folder import file_digests  # noqa: E402

CRASH_WORKER = Path(__file__).with_name("_crash_worker.py")
BACKENDS = [pytest.param(False, id="torch-save"), pytest.param(True, id="dcp")]


class ToySampler:
    """Shuffles 0..n-1 each epoch from its seed; its state is a dict of ints."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.n)
            out.append(int(order[self.position]))
            self.position += 1
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]


DATA_X = torch.randn(40, 6, generator=torch.Generator().manual_seed(5))
DATA_Y = torch.randn(40, 1, generator=torch.Generator().manual_seed(6))


def make_run(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
    return model, optimizer, scheduler, ToySampler(len(DATA_X), seed=11)


def train(run, steps: int) -> list[float]:
    """Deterministic loop that draws on every RNG a checkpoint must restore."""
    model, optimizer, scheduler, sampler = run
    losses = []
    for _ in range(steps):
        idx = sampler.take(8)
        x = DATA_X[idx] + 0.05 * torch.randn(8, 6)  # torch RNG (and dropout)
        weight = 1.0 + float(np.random.rand()) + random.random()  # numpy and python RNGs
        loss = weight * torch.nn.functional.mse_loss(model(x), DATA_Y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def save_kwargs(run):
    model, optimizer, scheduler, sampler = run
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "sampler": sampler}


@pytest.mark.parametrize("use_dcp", BACKENDS)
@pytest.mark.parametrize("save_at", [0, 5])
def test_resumed_run_continues_exactly(tmp_path, use_dcp, save_at):
    run = make_run(seed=0)
    head = train(run, save_at)
    with Checkpointer(tmp_path, use_dcp=use_dcp) as ckpt:
        pending = ckpt.save(save_at, **save_kwargs(run), extra={"head": head})
        tail = train(run, 6)  # the loop goes on while the checkpoint is written
        assert pending.wait() == tmp_path / f"step_{save_at}"

    resumed = make_run(seed=1)  # different weights: all must come from the checkpoint
    info = load_checkpoint(tmp_path, **save_kwargs(resumed))
    assert info["step"] == save_at and info["extra"] == {"head": head}
    assert train(resumed, 6) == tail  # bit-identical losses

    other = make_run(seed=1)  # without the RNG states the continuation differs
    load_checkpoint(tmp_path, **save_kwargs(other), restore_rng=False)
    assert train(other, 6) != tail


def test_manifest_records_backend_and_contents(tmp_path):
    run = make_run(0)
    train(run, 1)
    for use_dcp, root in ((False, tmp_path / "a"), (True, tmp_path / "b")):
        path = Checkpointer(root, use_dcp=use_dcp).save(1, **save_kwargs(run)).wait()
        manifest = json.loads((path / "COMPLETE").read_text())
        assert manifest["backend"] == ("dcp" if use_dcp else "torch")
        assert manifest["step"] == 1
        assert set(manifest["contents"]) == {"model", "optimizer", "scheduler", "sampler"}


class _Gate:
    """Holds a writer until the test opens it."""

    def __init__(self, target):
        self.target = target
        self.open = threading.Event()

    def __call__(self, *args, **kwargs):
        assert self.open.wait(30)
        return self.target(*args, **kwargs)


@pytest.mark.parametrize("use_dcp", BACKENDS)
def test_save_returns_before_the_write_and_publishes_after(tmp_path, monkeypatch, use_dcp):
    if use_dcp:
        gate = _Gate(torch.distributed.checkpoint.FileSystemWriter.write_data)
        monkeypatch.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data",
                            lambda self, *a, **k: gate(self, *a, **k))
    else:
        gate = _Gate(ckpt_module._torch_save)
        monkeypatch.setattr(ckpt_module, "_torch_save", gate)
    run = make_run(0)
    ckpt = Checkpointer(tmp_path, use_dcp=use_dcp)
    pending = ckpt.save(3, **save_kwargs(run))
    assert not pending.done()  # save() came back while the disk write is still held
    assert latest_checkpoint(tmp_path) is None
    gate.open.set()
    assert pending.wait() == latest_checkpoint(tmp_path) == tmp_path / "step_3"
    assert not (tmp_path / "step_3.tmp").exists()
    ckpt.close()


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    run = make_run(0)
    log_path = tmp_path / "log.jsonl"
    logger = StepLogger(log_path)
    ckpt = Checkpointer(tmp_path / "ckpt", logger=logger)
    ckpt.save(1, **save_kwargs(run)).wait()
    expected = {k: v.clone() for k, v in run[0].state_dict().items()}
    train(run, 2)

    def failing_save(obj, path):
        path.write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_module, "_torch_save", failing_save)
    pending = ckpt.save(2, **save_kwargs(run))
    with pytest.raises(CheckpointError, match="disk full"):
        pending.wait()
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_1"
    assert not (tmp_path / "ckpt" / "step_2.tmp").exists()  # the half-written folder is removed
    fresh = make_run(3)
    assert load_checkpoint(tmp_path / "ckpt", **save_kwargs(fresh))["step"] == 1
    for key, value in fresh[0].state_dict().items():
        assert torch.equal(value, expected[key])

    monkeypatch.undo()
    ckpt.save(3, **save_kwargs(run)).wait()  # the error was seen: saving goes on
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["step_1", "step_3"]
    ckpt.close()
    logger.close()
    events = [json.loads(x)["event"] for x in log_path.read_text().splitlines()]
    assert "checkpoint_failed" in events


def test_a_full_disk_says_so_in_one_line_with_the_size_needed(tmp_path, monkeypatch):
    run = make_run(0)
    ckpt = Checkpointer(tmp_path / "ckpt", async_=False)
    ckpt.save(1, **save_kwargs(run))

    monkeypatch.setattr(ckpt_module, "_torch_save", lambda obj, path: zip_writer_full(path))
    with pytest.raises(CheckpointError) as info:
        ckpt.save(2, **save_kwargs(run))
    text = str(info.value)
    assert text.startswith(f"saving checkpoint step 2 into {tmp_path / 'ckpt'} failed: the "
                           "disk is full (no space left on the device); it needs about ")
    assert "enforce fail" not in text and "\n" not in text
    assert not (tmp_path / "ckpt" / "step_2.tmp").exists()
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_1"
    ckpt.close()


def test_a_full_disk_under_the_distributed_backend_says_so_too(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    import torch.distributed.checkpoint as dcp

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", full)
    ckpt = Checkpointer(tmp_path / "ckpt", use_dcp=True, async_=False)
    with pytest.raises(CheckpointError) as info:
        ckpt.save(1, **save_kwargs(make_run(0)))
    assert str(info.value).startswith(f"saving checkpoint step 1 into {tmp_path / 'ckpt'} "
                                      "failed: the disk is full (no space left on the device)")
    assert latest_checkpoint(tmp_path / "ckpt") is None
    ckpt.close()


def test_a_real_full_disk_during_a_save_keeps_the_previous_checkpoint(small_disk):
    model = torch.nn.Linear(60, 60)  # 14.6 KiB of weights
    ckpt = Checkpointer(small_disk, async_=False)
    ckpt.save(1, model=model)
    big = torch.nn.Linear(200, 200)  # 161 KiB: more than the disk holds
    with pytest.raises(CheckpointError, match=r"the disk is full .* it needs about 1\d\d\.\d KiB"):
        ckpt.save(2, model=big)
    assert [p.name for p in small_disk.iterdir() if p.name.startswith("step")] == ["step_1"]
    assert load_checkpoint(small_disk, model=torch.nn.Linear(60, 60))["step"] == 1
    ckpt.close()


def test_an_unseen_failure_is_raised_by_the_next_save(tmp_path, monkeypatch):
    run = make_run(0)
    monkeypatch.setattr(ckpt_module, "_torch_save",
                        lambda obj, path: (_ for _ in ()).throw(OSError("no space")))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, **save_kwargs(run))
    with pytest.raises(CheckpointError, match="no space"):
        ckpt.save(2, **save_kwargs(run))


@pytest.mark.parametrize("backend", ["torch", "dcp"])
def test_killed_in_the_middle_of_a_save_the_previous_checkpoint_loads(tmp_path, backend):
    proc = subprocess.Popen([sys.executable, str(CRASH_WORKER), str(tmp_path), backend],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "MIDSAVE":
                break
        assert lines and lines[-1].strip() == "MIDSAVE", "".join(lines)
    finally:
        proc.kill()
        proc.wait(30)
    assert (tmp_path / "step_2.tmp").exists() and not (tmp_path / "step_2").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1"
    model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    info = load_checkpoint(tmp_path, model=model, optimizer=optimizer)
    assert info["step"] == 1 and info["extra"] == {"tag": "good"}
    expected = torch.load(tmp_path / "expected.pt")
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_keeps_only_the_newest_checkpoints(tmp_path):
    model = torch.nn.Linear(2, 2)
    with Checkpointer(tmp_path, keep=2) as ckpt:
        for step in (10, 20, 30, 40, 50):
            ckpt.save(step, model=model)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_40", "step_50"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_40", "step_50"]


def test_saving_a_step_again_replaces_it(tmp_path):
    model = torch.nn.Linear(2, 2)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(3, model=model, extra="first")
        ckpt.save(3, model=model, extra="second")
    assert [p.name for p in tmp_path.iterdir()] == ["step_3"]
    assert load_checkpoint(tmp_path, model=model)["extra"] == "second"


def test_events_record_how_long_the_loop_was_held(tmp_path):
    log_path = tmp_path / "log.jsonl"
    run = make_run(0)
    with StepLogger(log_path) as logger, Checkpointer(tmp_path / "c", logger=logger) as ckpt:
        pending = ckpt.save(4, **save_kwargs(run))
        pending.wait()
    events = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "checkpoint_begin", "checkpoint_end", "checkpoint_written",
    ]
    assert all(e["step"] == 4 for e in events)
    end = events[1]
    assert end["blocking_seconds"] == pytest.approx(pending.blocking_seconds)
    assert end["backend"] == "torch" and end["async_"] is True
    assert events[2]["seconds"] >= end["blocking_seconds"]


def test_save_checkpoint_function_and_synchronous_mode(tmp_path):
    model = torch.nn.Linear(3, 1)
    first = save_checkpoint(tmp_path, 1, model=model, async_=False)
    assert first.done() and latest_checkpoint(tmp_path) == tmp_path / "step_1"
    second = save_checkpoint(tmp_path, 2, model=model, keep=1)
    assert second.wait() == tmp_path / "step_2"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2"]


def test_load_errors_are_specific(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(FileNotFoundError, match="complete checkpoint"):
        load_checkpoint(tmp_path, model=model)
    save_checkpoint(tmp_path, 1, model=model, async_=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(tmp_path, model=model, optimizer=optimizer)
    with pytest.raises(RuntimeError):  # shapes differ
        load_checkpoint(tmp_path, model=torch.nn.Linear(3, 2))


def test_bad_save_arguments(tmp_path):
    ckpt = Checkpointer(tmp_path)
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="step"):
        ckpt.save(-1, model=model)
    with pytest.raises(TypeError, match="nn.Module"):
        ckpt.save(1, model={"w": 1})
    with pytest.raises(TypeError, match="sampler"):
        ckpt.save(1, model=model, sampler=object())
    with pytest.raises(ValueError, match="keep"):
        Checkpointer(tmp_path, keep=0)


def test_incomplete_folders_are_never_listed(tmp_path):
    (tmp_path / "step_9").mkdir()  # no manifest
    (tmp_path / "step_8.tmp").mkdir()
    (tmp_path / "step_7").mkdir()
    (tmp_path / "step_7" / "COMPLETE").write_text("{not json")
    assert list_checkpoints(tmp_path) == []
    with pytest.warns(UserWarning, match=r"skipping a corrupt checkpoint: .*step_7.COMPLETE"):
        assert latest_checkpoint(tmp_path) is None


# ------------------------------------------------------------------ integrity


def _two_checkpoints(root, use_dcp):
    """Checkpoints of steps 1 and 2 with different weights; returns the models saved."""
    models = []
    with Checkpointer(root, keep=None, use_dcp=use_dcp) as ckpt:
        for step in (1, 2):
            torch.manual_seed(step)
            model = torch.nn.Linear(64, 64)
            ckpt.save(step, model=model).wait()
            models.append(model)
    return models


def _biggest_file(folder):
    return max((p for p in folder.rglob("*") if p.is_file() and p.name != "COMPLETE"),
               key=lambda p: p.stat().st_size)


def _flip(path, count=40):
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    for i in range(start, start + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("use_dcp", BACKENDS)
def test_flipped_bytes_fail_the_checksum_and_the_previous_step_is_named(tmp_path, use_dcp):
    models = _two_checkpoints(tmp_path, use_dcp)
    manifest = json.loads((tmp_path / "step_2" / "COMPLETE").read_text())
    bad = _biggest_file(tmp_path / "step_2")
    name = bad.relative_to(tmp_path / "step_2").as_posix()
    assert manifest["files"][name]["bytes"] == bad.stat().st_size
    assert len(manifest["files"][name]["sha256"]) == 64
    _flip(bad)
    model = torch.nn.Linear(64, 64)
    with pytest.raises(CorruptCheckpointError,
                       match=rf"{name} does not match its checksum.*previous good checkpoint "
                             r"is step 1"):
        load_checkpoint(tmp_path / "step_2", model=model)
    # the latest good one is found, with a warning naming the corrupt file
    with pytest.warns(UserWarning, match=rf"skipping a corrupt checkpoint: .*step_2.*{name}"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step_1"
    with pytest.warns(UserWarning, match="skipping a corrupt checkpoint"):
        assert load_checkpoint(tmp_path, model=model)["step"] == 1
    torch.testing.assert_close(model.weight, models[0].weight)


@pytest.mark.parametrize("use_dcp", BACKENDS)
@pytest.mark.parametrize("damage", ["truncate", "delete", "empty"])
def test_a_damaged_file_is_named(tmp_path, use_dcp, damage):
    _two_checkpoints(tmp_path, use_dcp)
    for folder in ("step_1", "step_2"):
        bad = _biggest_file(tmp_path / folder)
        if damage == "truncate":
            bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
        elif damage == "delete":
            bad.unlink()
        else:
            bad.write_bytes(b"")
    what = "is missing" if damage == "delete" else r"is \d+ bytes, the manifest says"
    with pytest.raises(CorruptCheckpointError,
                       match=rf"{bad.name} {what}.*no earlier checkpoint .* verifies"):
        load_checkpoint(tmp_path / "step_2", model=torch.nn.Linear(64, 64))
    with pytest.warns(UserWarning), pytest.raises(FileNotFoundError, match="verify"):
        load_checkpoint(tmp_path, model=torch.nn.Linear(64, 64))


@pytest.mark.parametrize("use_dcp", BACKENDS)
@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_unreadable_files_with_matching_checksums_name_the_path(tmp_path, use_dcp, damage):
    """A file damaged before it was hashed (its checksum matches): still a clear error."""
    _two_checkpoints(tmp_path, use_dcp)
    folder = tmp_path / "step_2"
    bad = _biggest_file(folder) if not use_dcp else folder / ".metadata"
    if damage == "flip":
        _flip(bad, count=min(40, bad.stat().st_size // 4))
    elif damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:20])
    else:
        bad.write_bytes(bytes(range(256)) * 4)
    manifest = json.loads((folder / "COMPLETE").read_text())
    manifest["files"] = file_digests(folder)
    (folder / "COMPLETE").write_text(json.dumps(manifest))
    model = torch.nn.Linear(64, 64)
    try:
        load_checkpoint(folder, model=model)
    except CorruptCheckpointError as exc:
        assert str(folder) in str(exc) and "previous good checkpoint is step 1" in str(exc)
    else:  # flipped bytes inside a tensor: exactly what checksums are for
        assert damage == "flip"


def test_a_damaged_manifest_is_named(tmp_path):
    _two_checkpoints(tmp_path, False)
    (tmp_path / "step_2" / "COMPLETE").write_bytes(b"\xff\xfe{garbage")
    with pytest.raises(CorruptCheckpointError,
                       match=r"step_2.COMPLETE is not a valid checkpoint manifest.*step 1"):
        load_checkpoint(tmp_path / "step_2", model=torch.nn.Linear(64, 64))
    with pytest.warns(UserWarning, match="step_2.COMPLETE is damaged"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step_1"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "step_5", model=torch.nn.Linear(64, 64))


# ------------------------------------------------------------ save_checkpoint's cache


def test_save_checkpoint_reuses_replaces_and_closes_its_checkpointers(tmp_path):
    shared = SharedCheckpointers(size=2)
    model = torch.nn.Linear(2, 2)
    first = shared.get(tmp_path / "a", keep=3, async_=True, logger=None)
    first.save(1, model=model)
    assert shared.get(tmp_path / "a", keep=3, async_=True, logger=None) is first
    # other settings: the old one is closed (its save finished), not changed under its save
    second = shared.get(tmp_path / "a", keep=1, async_=True, logger=None)
    assert second is not first and first.closed and first.keep == 3
    assert latest_checkpoint(tmp_path / "a") == tmp_path / "a" / "step_1"
    second.save(2, model=model)
    shared.get(tmp_path / "b", keep=1, async_=True, logger=None)
    shared.get(tmp_path / "c", keep=1, async_=True, logger=None)  # evicts "a"
    assert len(shared) == 2 and second.closed and second._executor is None
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == ["step_2"]
    survivors = [shared.get(tmp_path / d, keep=1, async_=True, logger=None) for d in "bc"]
    shared.close()
    assert len(shared) == 0 and all(c.closed for c in survivors)


def test_save_checkpoint_threads_stop_at_exit(tmp_path):
    code = (
        "import threading, torch\n"
        "from lengthwise.train import save_checkpoint\n"
        f"p = save_checkpoint({str(tmp_path)!r}, 1, model=torch.nn.Linear(300, 300))\n"
        "print(any(t.name.startswith('lengthwise-checkpoint') for t in threading.enumerate()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "True"  # the write was in flight at exit...
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1"  # ...and finished, verified


@pytest.mark.parametrize("use_dcp", BACKENDS)
def test_a_model_that_does_not_fit_is_not_called_corrupt(tmp_path, use_dcp):
    _two_checkpoints(tmp_path, use_dcp)
    with pytest.raises((CheckpointError, RuntimeError), match="size mismatch|could not be loaded"
                       ) as info:
        load_checkpoint(tmp_path / "step_2", model=torch.nn.Linear(3, 64))
    assert not isinstance(info.value, CorruptCheckpointError)


@pytest.mark.parametrize("use_dcp", BACKENDS)
def test_text_files_ride_with_a_checkpoint_under_its_checksums(tmp_path, use_dcp):
    model = torch.nn.Linear(2, 2)
    with Checkpointer(tmp_path, use_dcp=use_dcp) as ckpt:
        path = ckpt.save(1, model=model, files={"model_config.json": '{"width": 2}\n'}).wait()
    assert (path / "model_config.json").read_text() == '{"width": 2}\n'
    manifest = json.loads((path / "COMPLETE").read_text())
    assert manifest["files"]["model_config.json"]["bytes"] == len(b'{"width": 2}\n')
    (path / "model_config.json").write_text('{"width": 3}\n')  # changed after the save
    with pytest.raises(CorruptCheckpointError, match="model_config.json"):
        load_checkpoint(path, model=model)


@pytest.mark.parametrize("name", ["COMPLETE", "state.pt", "../x.json", "a/b.json", ".hidden", ""])
def test_file_names_that_are_not_plain_or_clash_are_refused(tmp_path, name):
    with Checkpointer(tmp_path) as ckpt, pytest.raises(ValueError, match="plain file name"):
        ckpt.save(1, model=torch.nn.Linear(1, 1), files={name: "x"})
