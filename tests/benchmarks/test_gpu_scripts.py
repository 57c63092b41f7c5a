"""The GPU benchmark scripts on CPU: results on disk after every order, a time budget, and a
held-out evaluation within the training budgets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_dflash  # noqa: E402
import gpu_throughput  # noqa: E402

THROUGHPUT = ["--device", "cpu", "--smoke", "--orders", "sorted,random,stratified"]
DFLASH = ["--device", "cpu", "--smoke", "--orders", "sorted,random,packed"]


class Crash(BaseException):
    """A crash the script cannot catch (a kill, a time-out, a dead process)."""


def _read(out: Path) -> dict:
    return json.loads(out.with_suffix(".json").read_text())


def _on_second_order(monkeypatch, module, name, out, action):
    """Wrap ``module.name`` (an order's training) so its second call checks the files, then
    does ``action`` (raise, or advance a clock)."""
    real = getattr(module, name)
    calls = []

    def wrapped(orders, *args, **kwargs):
        calls.append(list(orders))
        if len(calls) == 2:
            on_disk = _read(out)  # the first order is on disk before the second one starts
            assert list(on_disk["strategies"]) == calls[0]
            assert f"| {calls[0][0]} |" in out.with_suffix(".md").read_text()
            action()
        return real(orders, *args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def _raise(exc):
    def action():
        raise exc
    return action


@pytest.mark.slow
@pytest.mark.parametrize("script,module_name,func,argv", [
    (gpu_throughput, "lengthwise.demo.runner", "train_orders", THROUGHPUT),
    (gpu_dflash, "lengthwise.demo.runner", "run_lockstep", DFLASH),
], ids=["gpu_throughput", "gpu_dflash"])
def test_a_crash_in_the_second_order_keeps_the_first_orders_results(
        tmp_path, monkeypatch, script, module_name, func, argv):
    import importlib

    out = tmp_path / "bench"
    calls = _on_second_order(monkeypatch, importlib.import_module(module_name), func, out,
                             _raise(Crash()))
    with pytest.raises(Crash):
        script.main([*argv, "--out", str(out)])
    assert len(calls) == 2
    saved = _read(out)
    assert list(saved["strategies"]) == ["sorted"]
    assert saved["strategies"]["sorted"]["tokens_per_second"] > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_an_order_that_raises_is_recorded_as_failed_and_the_next_runs(tmp_path, monkeypatch):
    import lengthwise.demo.runner as runner

    out = tmp_path / "bench"
    _on_second_order(monkeypatch, runner, "train_orders", out,
                     _raise(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    summary = gpu_throughput.main([*THROUGHPUT, "--out", str(out)])
    assert list(summary["strategies"]) == ["sorted", "stratified"]
    assert summary["failed"]["random"].startswith("RuntimeError: CUDA out of memory")
    assert _read(out)["failed"] == summary["failed"]
    assert "- random: failed (RuntimeError: CUDA out of memory" in out.with_suffix(
        ".md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("script,func,argv", [
    (gpu_throughput, "train_orders", THROUGHPUT),
    (gpu_dflash, "run_lockstep", DFLASH),
], ids=["gpu_throughput", "gpu_dflash"])
def test_orders_past_the_time_budget_are_skipped_and_recorded(tmp_path, monkeypatch, script,
                                                              func, argv):
    """A clock that says each order takes 60 s: with 100 s, the second order would end at 120."""
    import lengthwise.demo.runner as runner

    now = [0.0]
    real = getattr(runner, func)

    def minute(orders, *args, **kwargs):
        result = real(orders, *args, **kwargs)
        now[0] += 60.0
        return result

    monkeypatch.setattr(runner, func, minute)
    out = tmp_path / "bench"
    summary = script.main([*argv, "--out", str(out), "--time-budget", "100"],
                          clock=lambda: now[0])
    assert list(summary["strategies"]) == ["sorted"]
    skipped = argv[argv.index("--orders") + 1].split(",")[1:]
    assert list(summary["skipped"]) == skipped
    for why in summary["skipped"].values():
        assert why == "time budget: 60 s spent, an order takes about 60 s, 40 s left of 100 s"
    saved = _read(out)
    assert saved["skipped"] == summary["skipped"] and saved["time_budget_seconds"] == 100
    md = out.with_suffix(".md").read_text()
    assert all(f"- {name}: skipped (time budget" in md for name in skipped)
    # with room for every order, none is skipped
    now[0] = 0.0
    summary = script.main([*argv, "--out", str(out), "--time-budget", "1000"],
                          clock=lambda: now[0])
    assert not summary["skipped"] and len(summary["strategies"]) == len(skipped) + 1


@pytest.mark.slow
def test_held_out_evaluation_stays_within_the_training_budgets(tmp_path, monkeypatch):
    """Every teacher-forced forward of the evaluation, the held-out samples' and the eval
    stage's, within max_tokens tokens and max_slots slots (before: the four held-out samples
    in one batch of 4 x 96 tokens and 4 x 16 anchors x 4 = 256 slots, and the eval stage's
    every anchor of both prompts' outputs in one draft forward, 56 slots)."""
    import lengthwise.dflash.teacher_forced as decode

    tokens, slots = [], []
    real_blocks, real_hidden = decode.make_blocks, decode.block_hidden

    def batch(batch, rows, **kwargs):  # the batch of a target forward
        blocks = real_blocks(batch, rows, **kwargs)
        tokens.append(int(blocks.input_ids.numel()))
        return blocks

    def draft_forward(draft, target, part, **kwargs):
        slots.append(int(part.labels.numel()))
        return real_hidden(draft, target, part, **kwargs)

    monkeypatch.setattr(decode, "make_blocks", batch)
    monkeypatch.setattr(decode, "block_hidden", draft_forward)
    max_tokens, max_slots = 192, 32
    summary = gpu_dflash.main(["--device", "cpu", "--smoke", "--orders", "stratified",
                               "--max-tokens", str(max_tokens), "--max-slots", str(max_slots),
                               "--num-anchors", "16", "--out", str(tmp_path / "b")])
    assert summary["max_tokens"] == max_tokens and summary["max_slots"] == max_slots
    assert summary["strategies"]["stratified"]["accuracy_final"] is not None
    assert len(tokens) >= 3  # the held-out samples needed more than one batch, then the stage
    assert max(tokens) <= max_tokens and max(slots) <= max_slots, (tokens, slots)
