"""`dflash train` stopped by SIGTERM: it saves the steps done, exits 143, resumes from there."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from _cli import launcher, tiny_train_args

from lengthwise.train.stop import EXIT_STATUS, StopRequest

torch = pytest.importorskip("torch")


def _logged_steps(run) -> list[int]:
    log = run / "train_log.jsonl"
    if not log.exists():
        return []
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip().endswith("}")]
    return [r["step"] for r in rows if "loss" in r]


def test_sigterm_saves_a_checkpoint_of_the_steps_done_and_exits_143(tiny_prepared, tmp_path):
    target, data = tiny_prepared
    run = tmp_path / "run"
    launch, env = launcher()
    # no periodic checkpoint before the stop (the last of a repeated option counts)
    args = tiny_train_args(target, data, run, "--checkpoint-every", "100000")
    proc = subprocess.Popen([*launch, "-m", "lengthwise", *args, "--steps", "100000"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not _logged_steps(run) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_STATUS == 143, err[-2000:]
    last = max(_logged_steps(run))
    assert err.strip().splitlines()[-1] == (
        f"lengthwise dflash train: SIGTERM: stopped after step {last} of 100000; checkpoint "
        f"step_{last} saved: continue with --resume")
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [f"step_{last}"]
    assert not (run / "final").exists() and out == ""

    resumed = subprocess.run([*launch, "-m", "lengthwise", *args, "--steps", str(last + 1),
                              "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout)
    assert summary["resumed_from"] == str(run / "checkpoints" / f"step_{last}")
    assert summary["steps"] == last + 1


def test_outside_the_block_sigterm_keeps_its_own_action():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGTERM) != before
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested(None)
    assert signal.getsignal(signal.SIGTERM) == before
