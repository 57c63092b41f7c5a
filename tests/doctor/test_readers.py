"""Readers: JSONL (plain, gzip), JSON documents, CSV, TensorBoard, and bad input."""

from __future__ import annotations

import gzip
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.cli import main
from lengthwise.doctor import (
    EmptyLogError,
    LogError,
    LogNotFoundError,
    UnreadableLogError,
    diagnose,
    read_log,
    read_records,
)
from lengthwise.doctor.runlog import InputSummary, resolve_restarts


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def rows(n: int, start: int = 1, loss0: float = 3.0) -> list[str]:
    return [json.dumps({"step": s, "loss": loss0 - 0.001 * s, "lr": 1e-4})
            for s in range(start, start + n)]


def test_jsonl_reads_steps_losses_and_columns(tmp_path: Path) -> None:
    log = read_log(write_lines(tmp_path / "a.jsonl", rows(100)))
    assert log.step.tolist() == list(range(1, 101))
    assert np.allclose(log.loss, 3.0 - 0.001 * np.arange(1, 101))
    assert np.allclose(log.columns["lr"], 1e-4)
    assert log.input.malformed == 0 and log.input.restart_count == 0
    assert log.input.format == "jsonl"


def test_event_lines_carrying_a_loss_are_not_step_records(tmp_path: Path) -> None:
    lines = rows(100)
    lines.insert(50, json.dumps({"event": "spike_skip", "step": 50, "loss": 9.0}))
    lines.insert(20, json.dumps({"event": "checkpoint_end", "step": 20, "seconds": 0.1}))
    log = read_log(write_lines(tmp_path / "a.jsonl", lines))
    assert log.step.tolist() == list(range(1, 101))
    assert log.input.restart_count == 0 and float(np.max(log.loss)) < 3.0


def test_gzip_is_detected_by_content(tmp_path: Path) -> None:
    path = tmp_path / "log.bin"
    path.write_bytes(gzip.compress("".join(r + "\n" for r in rows(50)).encode()))
    log = read_log(path)
    assert log.num_steps == 50 and log.step[-1] == 50


def test_malformed_lines_are_skipped_and_counted_with_line_numbers(tmp_path: Path) -> None:
    lines = rows(30)
    lines[4] = '{"step": 5, "loss": '  # truncated
    lines[9] = "garbage"
    lines[14] = "[1, 2, 3]"  # JSON but not an object
    lines[19] = '{"step": 20, "loss": "abc"}'  # not a number
    lines.append('{"step": 31, "lo')  # truncated last line, no newline
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    log = read_log(path)
    assert log.input.malformed == 5
    assert log.input.malformed_lines == [5, 10, 15, 20, 31]
    assert log.num_steps == 26
    assert 5 not in log.step.tolist() and 20 not in log.step.tolist()


def test_nan_inf_and_null_losses_are_kept_as_non_finite(tmp_path: Path) -> None:
    lines = rows(20)
    lines[3] = '{"step": 4, "loss": NaN}'
    lines[6] = '{"step": 7, "loss": Infinity}'
    lines[8] = '{"step": 9, "loss": null}'
    lines[10] = '{"step": 11, "loss": "nan"}'
    log = read_log(write_lines(tmp_path / "nan.jsonl", lines))
    assert log.input.malformed == 0
    bad = log.step[~np.isfinite(log.loss)].tolist()
    assert bad == [4, 7, 9, 11]


def test_restart_keeps_latest_segment_and_reports_restart_points(tmp_path: Path) -> None:
    first = rows(60, loss0=3.0)  # steps 1..60
    second = rows(50, start=41, loss0=2.0)  # resumed from step 40: steps 41..90
    log = read_log(write_lines(tmp_path / "resumed.jsonl", first + second))
    assert log.step.tolist() == list(range(1, 91))
    assert log.input.restart_count == 1
    point = log.input.restarts[0]
    assert (point.line, point.step_before, point.step_after) == (61, 60, 41)
    assert log.input.superseded_rows == 20
    # steps 41..60 come from the resumed run (loss0 = 2.0)
    assert np.isclose(log.loss[log.step == 50][0], 2.0 - 0.05)
    assert np.isclose(log.loss[log.step == 30][0], 3.0 - 0.03)


def test_repeated_step_keeps_last_value(tmp_path: Path) -> None:
    lines = rows(10) + [json.dumps({"step": 10, "loss": 9.0})] + rows(5, start=11)
    log = read_log(write_lines(tmp_path / "rep.jsonl", lines))
    assert log.loss[log.step == 10].tolist() == [9.0]
    # one step logged again, then steps that go on: a resumed run, not a second writer
    assert log.input.restart_count == 1 and log.input.duplicate_rows == 0
    assert log.input.restarts[0].rolled_back == 0


def test_duplicate_writer_is_told_from_a_restart(tmp_path: Path) -> None:
    """Every step written twice (two writers) plus one real resume from 240 back to 10."""
    steps = list(range(1, 25)) + list(range(10, 40))
    lines = []
    for s in steps:
        lines += [json.dumps({"step": s, "loss": 2.0 + 0.001 * s}),
                  json.dumps({"step": s, "loss": 2.0 + 0.001 * s + 0.01})]
    log = read_log(write_lines(tmp_path / "twice.jsonl", lines))
    assert log.input.duplicate_rows == len(steps)
    assert log.input.restart_count == 1
    assert log.input.restarts[0].step_before == 24 and log.input.restarts[0].step_after == 10
    assert log.step.tolist() == list(range(1, 40))
    names = [c.name for c in diagnose(log).verdict.causes]
    assert "duplicate_writer" in names and "restarts" in names


def test_writers_interleaving_in_blocks_are_duplicates_not_restarts(tmp_path: Path) -> None:
    steps = []
    for a in range(10, 400, 20):  # writer A logs two steps, then writer B the same two
        steps += [a, a + 10, a, a + 10]
    steps += list(range(200, 260, 10))  # and one real resume from step 200
    lines = [json.dumps({"step": s, "loss": 2.0 + 0.0001 * i}) for i, s in enumerate(steps)]
    log = read_log(write_lines(tmp_path / "blocks.jsonl", lines))
    assert log.input.restart_count == 1 and log.input.restarts[0].step_after == 200
    assert log.input.duplicate_rows == 40
    assert log.step.tolist() == list(range(10, 260, 10))


def test_json_true_loss_is_malformed_not_one(tmp_path: Path) -> None:
    lines = rows(5) + [json.dumps({"step": 6, "loss": True})] + rows(5, start=7)
    log = read_log(write_lines(tmp_path / "bool.jsonl", lines))
    assert 6 not in log.step.tolist() and log.input.malformed == 1
    assert not np.any(log.loss == 1.0)


@pytest.mark.parametrize("huge", ["1.5e200", "-3e101", "1" + "0" * 400],
                         ids=["1.5e200", "-3e101", "a 401-digit int"])
def test_a_loss_too_large_to_analyse_is_malformed_and_the_rest_is_read(tmp_path: Path,
                                                                        huge: str) -> None:
    lines = rows(50) + [f'{{"step": 51, "loss": {huge}}}'] + rows(50, start=52)
    log = read_log(write_lines(tmp_path / "huge.jsonl", lines))
    assert 51 not in log.step.tolist() and log.input.malformed == 1
    assert log.input.malformed_lines == [51] and np.all(np.abs(log.loss) < 10)


def test_losses_too_large_to_analyse_are_one_clear_error_without_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loss = 1e308 * (1 + 0.1 * np.random.default_rng(0).random(1000))
    path = write_lines(tmp_path / "e308.jsonl", [json.dumps({"step": i + 1, "loss": float(v)})
                                                  for i, v in enumerate(loss)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning on the way
        assert main(["doctor", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lengthwise doctor: error: ")
    assert "1000 malformed; line 1: 'loss' is 1.06" in err
    assert "beyond 1e+100: too large a loss to analyse" in err


def test_csv_without_a_loss_column_says_so_and_suggests_loss_key(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,accuracy\n1,0.5\n2,0.6\n")
    with pytest.raises(EmptyLogError, match="no loss column.*--loss-key"):
        read_log(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=60))
def test_restart_resolution_properties(steps: list[int]) -> None:
    arr = np.asarray(steps, dtype=float)
    keep = resolve_restarts(arr, np.arange(1, arr.size + 1), InputSummary())
    kept = arr[keep]
    assert keep[-1]  # the last row always survives
    assert np.all(np.diff(kept) > 0)  # strictly increasing
    for i in np.flatnonzero(keep):  # no later row rewrites or precedes a kept step
        assert np.all(arr[i + 1 :] > arr[i])
    for i in np.flatnonzero(~keep):  # every dropped row is superseded by a later one
        assert np.any(arr[i + 1 :] <= arr[i])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=80))
def test_malformed_count_matches_garbage_lines(tmp_path_factory: pytest.TempPathFactory,
                                               good: list[bool]) -> None:
    lines = [json.dumps({"step": i, "loss": 1.0}) if ok else f"oops {i} {{"
             for i, ok in enumerate(good)]
    if not any(good):
        lines.append(json.dumps({"step": len(good), "loss": 1.0}))
    path = tmp_path_factory.mktemp("h") / "x.jsonl"
    log = read_log(write_lines(path, lines))
    assert log.input.malformed == good.count(False)
    assert log.input.malformed_lines == [i + 1 for i, ok in enumerate(good) if not ok][:5]


def test_checkpoint_events_and_other_rows(tmp_path: Path) -> None:
    lines = rows(30)
    lines.insert(10, json.dumps({"event": "checkpoint_begin", "step": 10}))
    lines.insert(11, json.dumps({"event": "checkpoint_end", "step": 10, "seconds": 3.5}))
    lines.insert(25, json.dumps({"event": "checkpoint", "step": 24}))
    lines.insert(26, json.dumps({"step": 24, "eval_loss": 1.0}))
    log = read_log(write_lines(tmp_path / "ck.jsonl", lines))
    assert log.checkpoints.tolist() == [10.0, 24.0]
    assert log.checkpoint_seconds.tolist() == [3.5]
    assert log.input.other_rows == 4
    assert log.num_steps == 30


def test_step_logger_fields(tmp_path: Path) -> None:
    recs = [{"step": s, "epoch": 0, "loss": 2.0, "lr": 1e-3, "grad_norm": 0.5,
             "real_tokens": 900 + s, "padded_tokens": 1024, "tokens_per_second": 5000.0,
             "samples": 4, "buckets": [s % 3], "bucket_loss": {"0": 2.1, "1": 1.9},
             "corrected_loss": 2.0} for s in range(1, 21)]
    log = read_records(recs)
    assert log.buckets == [(s % 3,) for s in range(1, 21)]
    assert np.allclose(log.columns["real_tokens"], 900 + np.arange(1, 21))
    assert {"lr", "grad_norm", "samples", "tokens_per_second", "corrected_loss"} <= set(
        log.columns)
    assert log.bucket_loss == {"0": 2.1, "1": 1.9}


def test_aliases_and_missing_step(tmp_path: Path) -> None:
    log = read_records([{"global_step": s, "train/loss": 1.0 + s} for s in (5, 6, 7)])
    assert log.step.tolist() == [5, 6, 7] and log.input.loss_key == "train/loss"
    log = read_records([{"loss": 1.0}, {"loss": 2.0}])
    assert log.step.tolist() == [1, 2] and log.input.step_key == "row index"


def test_explicit_keys(tmp_path: Path) -> None:
    recs = [{"it": s, "loss": 9.0, "my_loss": float(s)} for s in range(1, 11)]
    log = read_records(recs, step_key="it", loss_key="my_loss")
    assert log.loss.tolist() == [float(s) for s in range(1, 11)]
    with pytest.raises(EmptyLogError, match="'nope'"):
        read_records(recs, loss_key="nope")
    with pytest.raises(EmptyLogError, match="'iteration' step field"):
        read_records(recs, step_key="iteration")


def test_empty_missing_and_lossless_inputs_raise_clear_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(EmptyLogError, match="is empty"):
        read_log(empty)
    blank = write_lines(tmp_path / "blank.jsonl", ["", "   "])
    with pytest.raises(EmptyLogError):
        read_log(blank)
    with pytest.raises(LogNotFoundError, match="no such file"):
        read_log(tmp_path / "missing.jsonl")
    with pytest.raises(EmptyLogError, match="fields seen: acc, step"):
        read_log(write_lines(tmp_path / "noloss.jsonl", ['{"step": 1, "acc": 0.5}']))
    all_bad = write_lines(tmp_path / "bad.jsonl", ["nope", "{"])
    with pytest.raises(EmptyLogError, match="2 malformed"):
        read_log(all_bad)
    with pytest.raises(LogNotFoundError, match="no TensorBoard event file"):
        read_log(tmp_path)
    assert issubclass(EmptyLogError, ValueError) and issubclass(LogNotFoundError,
                                                               FileNotFoundError)


def test_corrupt_gzip_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(LogError):
        read_log(path)


def test_truncated_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    data = gzip.compress("".join(r + "\n" for r in rows(3000)).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    log = read_log(path)
    assert log.input.truncated and 0 < log.num_steps < 3000


def test_trainer_state_document(tmp_path: Path) -> None:
    history = [{"step": s, "loss": 2.0 - 0.01 * s, "learning_rate": 1e-4, "epoch": s / 10}
               for s in range(1, 31)]
    history.insert(5, {"step": 5, "eval_loss": 1.5})
    history.append({"step": 30, "train_loss": 1.8, "train_runtime": 100.0})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 30, "log_history": history}, indent=2))
    log = read_log(path)
    assert log.input.format == "trainer_state"
    assert log.num_steps == 30 and np.allclose(log.columns["lr"], 1e-4)


def test_csv_wandb_export(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    lines = ['"Step","run-1 - train/loss","run-1 - train/loss__MIN","run-1 - train/loss__MAX",'
             '"run-1 - train/learning_rate"']
    for s in range(1, 41):
        loss = "" if s == 7 else f"{2.0 - 0.01 * s:.4f}"
        lines.append(f"{s},{loss},{loss},{loss},0.0001")
    lines.insert(12, "12,1.5,1.5")  # wrong number of cells
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.input.format == "csv"
    assert log.input.loss_key == "run-1 - train/loss"
    assert log.input.malformed == 1 and log.input.malformed_lines == [13]
    assert log.input.other_rows == 1  # the empty loss cell at step 7
    assert log.num_steps == 39 and 7 not in log.step.tolist()
    assert np.allclose(log.columns["lr"], 1e-4)
    assert math.isclose(float(log.loss[0]), 1.99)


def test_csv_without_loss_column(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("step,acc\n1,0.5\n")
    with pytest.raises(EmptyLogError, match="no a loss column|no 'loss'|loss column"):
        read_log(path)


def _tensorboard_run(logdir: Path, steps: int = 60, start: int = 0) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(logdir)) as writer:
        for s in range(start, start + steps):
            writer.add_scalar("train/loss", 3.0 - 0.01 * s, s)
            writer.add_scalar("train/learning_rate", 1e-4, s)
            if s % 20 == 0:
                writer.add_scalar("eval/loss", 9.0, s)


def test_tensorboard_directory_and_file(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    _tensorboard_run(tmp_path / "run")
    log = read_log(tmp_path / "run")
    assert log.input.format == "tensorboard"
    assert log.input.loss_key == "train/loss"
    assert log.step.tolist() == list(range(60))
    assert np.allclose(log.loss, 3.0 - 0.01 * np.arange(60), atol=1e-6)
    assert np.allclose(log.columns["lr"], 1e-4)
    (event,) = list((tmp_path / "run").glob("*tfevents*"))
    assert read_log(event).num_steps == 60


def test_tensorboard_eval_loss_is_the_held_out_loss(tmp_path: Path) -> None:
    """Hugging Face's TensorBoard names: `train/loss` for training, `eval/loss` held out."""
    pytest.importorskip("torch.utils.tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(0)
    with SummaryWriter(log_dir=str(tmp_path / "run")) as writer:
        for s in range(1, 1201):
            writer.add_scalar("train/loss", 3.0 * np.exp(-s / 300) + 0.5
                              + 0.02 * rng.standard_normal(), s)
            if s % 100 == 0:  # the held-out loss falls, then rises: over-fitting
                writer.add_scalar("eval/loss", 3.0 * np.exp(-s / 300) + 0.7
                                  + 0.3 * max(0.0, s - 600) / 600, s)
    log = read_log(tmp_path / "run")
    assert log.input.loss_key == "train/loss" and log.step.size == 1200
    assert log.evals[:, 0].tolist() == list(range(100, 1201, 100))
    assert abs(log.evals[0, 1] - (3.0 * np.exp(-1 / 3) + 0.7)) < 1e-5
    r = diagnose(log)
    assert r.eval_gap.evals == 12 and r.eval_gap.eval_rising
    assert "eval_overfitting" in {c.name for c in r.verdict.causes}
    # rows with those names (W&B's history of the same callbacks) read alike
    rows = [{"train/global_step": s, "train/loss": 2.0} for s in range(1, 101)]
    rows += [{"train/global_step": s, "eval/loss": 2.5} for s in (50, 100)]
    assert read_records(rows).evals.tolist() == [[50.0, 2.5], [100.0, 2.5]]


def test_tensorboard_truncated_file(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    _tensorboard_run(tmp_path / "run", steps=40)
    (event,) = list((tmp_path / "run").glob("*tfevents*"))
    data = event.read_bytes()
    cut = tmp_path / "cut" / event.name
    cut.parent.mkdir()
    cut.write_bytes(data[:-7])
    log = read_log(cut)
    assert log.input.truncated and log.input.malformed == 1
    # the cut record was the last one written (the learning rate of step 39)
    assert log.step.tolist() == list(range(40))
    assert np.isnan(log.columns["lr"][-1]) and np.isfinite(log.columns["lr"][:-1]).all()


def test_tensorboard_without_loss_tag(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path / "r")) as writer:
        writer.add_scalar("accuracy", 0.5, 1)
    with pytest.raises(UnreadableLogError, match="tags: accuracy"):
        read_log(tmp_path / "r")


def test_records_with_non_dicts_are_malformed() -> None:
    log = read_records([{"step": 1, "loss": 1.0}, 5, "x", {"step": 2, "loss": 0.5}])
    assert log.input.malformed == 2 and log.num_steps == 2


def _tb_folder(logdir: Path, steps: list[int], wall: float) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(logdir)) as writer:
        for i, s in enumerate(steps):
            writer.add_scalar("train/loss", 4.77 + 0.001 * (i % 3), s, walltime=wall + i)


def test_tensorboard_run_folders_that_start_again_are_restarts(tmp_path: Path) -> None:
    """Two aborted starts in their own run folders, then the whole run: 2 restarts, no writer."""
    pytest.importorskip("torch.utils.tensorboard")
    _tb_folder(tmp_path / "runs" / "a", [10], wall=1000.0)
    _tb_folder(tmp_path / "runs" / "b", [10, 20], wall=2000.0)
    _tb_folder(tmp_path / "runs" / "c", list(range(10, 410, 10)), wall=3000.0)
    log = read_log(tmp_path / "runs")
    assert log.input.restart_count == 2 and log.input.duplicate_rows == 0
    assert [r.step_after for r in log.input.restarts] == [10.0, 10.0]
    assert log.step.tolist() == list(range(10, 410, 10))
    assert log.input.place(log.input.restarts[0].line).startswith("event file 2")


def test_tensorboard_files_whose_steps_interleave_are_not_restarts(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    _tb_folder(tmp_path / "runs" / "a", list(range(10, 400, 20)), wall=1000.0)
    _tb_folder(tmp_path / "runs" / "b", list(range(20, 410, 20)), wall=2000.0)
    log = read_log(tmp_path / "runs")
    assert log.input.restart_count == 0 and log.input.duplicate_rows == 0
    assert log.step.tolist() == list(range(10, 410, 10))


def test_a_logged_resume_event_makes_a_restart_an_exact_resume() -> None:
    from lengthwise.doctor import diagnose

    rows = [{"step": s, "loss": 3.0 - 0.01 * s} for s in range(1, 60)]
    resumed = [{"step": s, "loss": 3.0 - 0.01 * s} for s in range(41, 100)]
    marked = diagnose([*rows, {"event": "resume", "step": 40, "path": "ckpt/step_40"}, *resumed])
    plain = diagnose([*rows, *resumed])
    assert marked.input.restart_count == plain.input.restart_count == 1
    assert marked.input.logged_resumes == 1 and plain.input.logged_resumes == 0
    assert "restarts" not in {c.name for c in marked.verdict.causes}
    assert "restarts" in {c.name for c in plain.verdict.causes}
    assert marked.series.step.tolist() == plain.series.step.tolist() == list(range(1, 100))
    assert json.loads(marked.to_json())["input"]["logged_resumes"] == 1
