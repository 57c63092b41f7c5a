"""``lengthwise doctor --watch``: a live writer appends while the doctor follows the log."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lengthwise.cli import main
from lengthwise.doctor.report import Finding, Verdict
from lengthwise.doctor.watch import Watcher

from simulated_logs.runs import simulate_run

#: appends the lines of a source file to a log in chunks, cutting a line in two at times
WRITER = r"""
import sys, time
src, dst = sys.argv[1], sys.argv[2]
first, chunk, pause = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
lines = open(src).readlines()
with open(dst, "a") as out:
    out.writelines(lines[:first]); out.flush()
    i = first
    while i < len(lines):
        time.sleep(pause)
        block = lines[i:i + chunk]
        i += len(block)
        text = "".join(block)
        if i < len(lines):  # the last line of the block arrives in two writes
            out.write(text[:-10]); out.flush(); time.sleep(pause / 3); out.write(text[-10:])
        else:
            out.write(text)
        out.flush()
"""


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1"}


def _source(tmp_path: Path) -> Path:
    run = simulate_run("bucketed", steps=1500, seed=1, random_spikes=3, spike_height=1.2)
    return run.write(tmp_path / "source.jsonl")


def _start_watch(log: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "lengthwise", "doctor", "--watch", str(log),
                             "--interval", "0.2", *extra], stdout=out.open("wb"),
                            stderr=subprocess.STDOUT, env=_env(),
                            # a Ctrl-C reaches it even where this run ignores SIGINT (a
                            # background job of a shell without job control)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _start_writer(src: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(src), str(log), "40", "200",
                             "0.15"], env=_env())


def _wait_for(path: Path, text: str, seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen = path.read_text() if path.exists() else ""
        if text in seen:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not printed within {seconds} s: {seen!r}")


def test_watch_follows_a_live_writer_and_prints_each_finding_once(tmp_path: Path) -> None:
    src, log, out = _source(tmp_path), tmp_path / "train_log.jsonl", tmp_path / "watch.txt"
    watcher = _start_watch(log, out, "--max-seconds", "60")
    try:
        _wait_for(out, "waiting:", 30)  # the log does not exist yet
        writer = _start_writer(src, log)
        assert writer.wait(timeout=60) == 0
        _wait_for(out, "3 loss bands", 30)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 130
    finally:
        watcher.kill()
    lines = out.read_text().splitlines()
    findings = [x for x in lines if x.startswith("[step ")]
    titles = [x.split("] ", 1)[1].split(" -> ")[0] for x in findings]
    assert any("loss bands" in t for t in titles)
    assert sum("loss bands" in t for t in titles) == 1  # printed once, however often it shows
    assert len([x for x in lines if x.startswith("waiting:")]) >= 1
    assert not any("clean so far" in x for x in lines)
    assert lines[-1].startswith(f"summary: {log}: ") and "at step 1500: " in lines[-1]
    assert "Traceback" not in out.read_text()


def test_watch_stops_after_max_seconds_with_exit_0(tmp_path: Path) -> None:
    log, out = tmp_path / "train_log.jsonl", tmp_path / "watch.txt"
    log.write_text(_source(tmp_path).read_text())
    watcher = _start_watch(log, out, "--max-seconds", "1")
    assert watcher.wait(timeout=60) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("[step 1500] ") and lines[-1].startswith("summary: ")


def _stub(*names: str, clean: bool | None = False, step: float = 10.0) -> SimpleNamespace:
    causes = [Finding(name=n, claim=f"{n} found", score=0.5, fix=["fix it"])
              for n in names]
    verdict = Verdict(causes=causes, clean=clean if causes else clean,
                      summary="; ".join(names) or "clean: no bands")
    return SimpleNamespace(verdict=verdict, series=SimpleNamespace(step=np.array([step])))


def test_a_finding_that_comes_back_is_printed_again_only_after_the_cooldown(
        tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    reports = iter([_stub("a"), _stub(), _stub("a"), _stub(), _stub("a", "b")])
    out = io.StringIO()
    w = Watcher(log, cooldown=100.0, out=out, diagnose=lambda path, **kw: next(reports))
    for i, now in enumerate([0.0, 10.0, 20.0, 30.0, 200.0]):
        log.write_text("x" * (i + 1))
        assert w.poll(now=now)
    shown = out.getvalue().splitlines()
    assert shown == ["[step 10] a found -> fix it", "[step 10] a found -> fix it",
                     "[step 10] b found -> fix it"]


def test_clean_so_far_only_when_the_verdict_is_tested_clean(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    reports = iter([_stub(clean=None), _stub(clean=True), _stub(clean=True)])
    out = io.StringIO()
    w = Watcher(log, out=out, diagnose=lambda path, **kw: next(reports))
    for i in range(3):
        log.write_text("x" * (i + 1))
        w.poll(now=float(i))
    assert out.getvalue().splitlines() == ["[step 10] clean so far: clean: no bands"]


def test_watch_follows_a_trainer_state_file_rewritten_whole(tmp_path: Path) -> None:
    rows = [r for r in simulate_run("bucketed", steps=1500, seed=1).records if "event" not in r]
    state = tmp_path / "trainer_state.json"
    out = io.StringIO()
    w = Watcher(state, out=out)
    assert w.poll(now=0.0) and out.getvalue().startswith("waiting: ")
    for n in (100, 1500):
        state.write_text(json.dumps({"log_history": rows[:n], "global_step": n}))
        os.utime(state, ns=(n, n))
        assert w.poll(now=float(n))
    assert "[step 1500] 3 loss bands" in out.getvalue()


@pytest.mark.parametrize("extra, message", [
    (["--interval", "1"], "--interval, --max-seconds and --cooldown go with --watch"),
    (["--watch", "--interval", "0"], "--interval must be positive, got 0"),
    (["--watch", "--json"], "--watch prints text lines; drop --json and --plot"),
])
def test_watch_options_are_checked(tmp_path: Path, capsys, extra, message) -> None:
    assert main(["doctor", str(tmp_path / "log.jsonl"), *extra]) == 2
    assert capsys.readouterr().err.strip() == f"lengthwise doctor: error: {message}"


@pytest.mark.parametrize("flag, value", [
    ("--interval", "inf"), ("--interval", "1e300"), ("--max-seconds", "nan"),
    ("--cooldown", "-inf"),
])
def test_watch_durations_must_be_finite_seconds(tmp_path: Path, capsys, flag, value) -> None:
    """A wait the clock cannot hold is refused when the command line is read, before any look."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(1, 50)))
    with pytest.raises(SystemExit) as exit_:
        main(["doctor", str(log), "--watch", f"{flag}={value}"])
    err = capsys.readouterr()
    assert exit_.value.code == 2 and err.out == ""
    assert f"argument {flag}: must be a finite number of seconds" in err.err
    assert err.err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--from", "--to", "--steps-per-epoch", "--eval-every", "--clip"])
def test_the_doctors_other_number_flags_refuse_inf_and_nan(tmp_path: Path, capsys,
                                                            flag: str) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(1, 50)))
    for value in ("inf", "nan"):
        with pytest.raises(SystemExit) as exit_:
            main(["doctor", str(log), f"{flag}={value}"])
        assert exit_.value.code == 2
        assert f"argument {flag}: must be a finite number, got '{value}'" in \
            capsys.readouterr().err


def test_a_diagnosis_cut_short_by_ctrl_c_is_redone_on_the_next_look(tmp_path: Path) -> None:
    """Ctrl-C during a diagnosis: the summary's look reads the log again, not the one before."""
    log = tmp_path / "log.jsonl"
    log.write_text("x")
    calls = []

    def diagnose(path, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return _stub(step=float(len(calls)))

    w = Watcher(log, out=io.StringIO(), diagnose=diagnose)
    assert w.poll(now=0.0)
    log.write_text("xx")
    with pytest.raises(KeyboardInterrupt):
        w.poll(now=1.0)
    assert w.poll(now=2.0) and len(calls) == 3  # the same file, diagnosed again
    assert "at step 3: " in w.summary()
