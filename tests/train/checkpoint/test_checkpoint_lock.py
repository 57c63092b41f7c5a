"""One writer per checkpoint folder; an unsavable ``extra`` fails at the call."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from _ports import free_port

from lengthwise.errors import ConfigError
from lengthwise.train import (
    Checkpointer,
    CheckpointError,
    CheckpointLockedError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from lengthwise.train.checkpoint import lock as lock_module
from lengthwise.train.checkpoint.lock import LOCK_FILE, WriterLock

WORKER = Path(__file__).with_name("_lock_worker.py")


def _worker(mode, root, **env):
    return subprocess.Popen([sys.executable, str(WORKER), mode, str(root)],
                            env=dict(os.environ, OMP_NUM_THREADS="1", **env),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _verified_latest_step(root):
    """The step of the latest checkpoint, loaded and checked against its weights."""
    path = latest_checkpoint(root)
    assert path is not None
    model = torch.nn.Linear(64, 64)
    loaded = load_checkpoint(path, model=model, restore_rng=False)
    assert torch.all(model.weight == loaded["step"])  # the weights of that very save
    return loaded["step"]


def test_a_second_checkpointer_is_told_the_folder_and_the_holder(tmp_path):
    model = torch.nn.Linear(2, 2)
    first = Checkpointer(tmp_path)
    first.save(1, model=model).wait()
    second = Checkpointer(tmp_path)
    with pytest.raises(CheckpointLockedError,
                       match=rf"{tmp_path} is being written by another checkpointer "
                             rf"\(this process, pid {os.getpid()} on host "
                             rf"{socket.gethostname()}, since "):
        second.save(2, model=model)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1"]  # nothing written
    first.close()
    assert not (tmp_path / LOCK_FILE).exists()  # released and removed on close
    with second:
        second.save(2, model=model)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1", "step_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2"]


@pytest.mark.slow
def test_two_processes_one_holds_the_folder_and_the_other_is_told(tmp_path):
    holder = _worker("hold", tmp_path)
    line = holder.stdout.readline().split()
    assert line[0] == "HOLDING", line + [holder.stdout.read()]
    other = _worker("race", tmp_path)
    out = other.communicate(timeout=120)[0]
    assert other.returncode == 0, out
    assert out.startswith(f"LOCKED checkpoint folder {tmp_path} is being written by another "
                          f"checkpointer (pid {line[1]} on host {socket.gethostname()}"), out
    assert _verified_latest_step(tmp_path) == 3  # the other process changed nothing
    rest = holder.communicate("go\n", timeout=120)[0]
    assert holder.returncode == 0 and rest.strip() == "DONE", rest
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_3", "step_4"]
    assert _verified_latest_step(tmp_path) == 4
    again = _worker("race", tmp_path)  # the folder is free again once the holder closed
    assert again.communicate(timeout=120)[0].strip() == "DONE"
    assert _verified_latest_step(tmp_path) == 6


def test_two_processes_racing_one_wins_and_the_latest_checkpoint_verifies(tmp_path):
    procs = [_worker("race", tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    firsts = sorted(out.split()[0] for out in outs)
    # both finish only when one was done before the other started; never a silent clash
    assert firsts in (["DONE", "DONE"], ["DONE", "LOCKED"]), outs
    assert _verified_latest_step(tmp_path) == 6
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_4", "step_5", "step_6"]


def test_a_killed_holder_does_not_block_the_next_run(tmp_path):
    holder = _worker("hold", tmp_path)
    assert holder.stdout.readline().startswith("HOLDING")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=60)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid  # left behind
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(7, model=torch.nn.Linear(64, 64))
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2", "step_3", "step_7"]


def test_without_file_locks_the_holder_record_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "_try_flock", lambda handle: None)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = {"pid": gone.pid, "host": socket.gethostname(), "start": None, "since": 0}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    lock = WriterLock(tmp_path)
    lock.acquire()  # the holder's process is gone: a stale lock is taken over
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for host, pid in ((socket.gethostname(), alive.pid), ("node-7", gone.pid)):
            record = {"pid": pid, "host": host, "start": None, "since": 0}
            (tmp_path / LOCK_FILE).write_text(json.dumps(record))
            with pytest.raises(CheckpointLockedError,
                               match=rf"pid {pid} on host {host}.*delete .*{LOCK_FILE}"):
                WriterLock(tmp_path).acquire()
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("use_dcp", [False, True])
def test_an_extra_that_is_not_plain_data_fails_at_the_call_naming_the_part(tmp_path, use_dcp):
    model = torch.nn.Linear(2, 2)
    with Checkpointer(tmp_path, use_dcp=use_dcp) as ckpt:
        with pytest.raises(ConfigError, match=r"extra\['hooks'\]\[1\] cannot be saved in a "
                                            r"checkpoint: a lock is not plain data"):
            ckpt.save(1, model=model, extra={"note": "x", "hooks": [1, threading.Lock()]})
        assert list_checkpoints(tmp_path) == []
        assert ckpt.save(2, model=model, extra={"note": "x"}).wait().name == "step_2"
    assert load_checkpoint(tmp_path, model=model)["extra"] == {"note": "x"}


@pytest.mark.slow
def test_under_torch_distributed_every_rank_is_told_the_folder_is_taken(tmp_path):
    held = WriterLock(tmp_path)
    held.acquire()
    port = str(free_port())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    try:
        procs = [_worker("dist", tmp_path, RANK=str(r), **env) for r in range(2)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        held.release()
    for out in outs:  # rank 1 raises too instead of waiting in the save's collectives
        assert out.startswith(f"LOCKED checkpoint folder {tmp_path} is being written"), outs
    assert list_checkpoints(tmp_path) == []


def test_a_checkpoint_folder_that_is_a_file_is_named(tmp_path):
    path = tmp_path / "ckpt"
    path.write_text("not a folder")
    with pytest.raises(CheckpointError, match=f"checkpoint folder {path} is a file"):
        Checkpointer(path).save(1, model=torch.nn.Linear(1, 1))
