"""Rows out of step order are read in step order; restarts are told apart; unreadable files
end in one line naming the file and the reason."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.cli import main
from lengthwise.doctor import read_log, read_records
from lengthwise.doctor.runlog import InputSummary, step_order


def loss_at(step: int, run: float = 0.0) -> float:
    return 3.0 - 0.001 * step + run


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_log_sorted_by_descending_step_is_read_in_step_order(tmp_path, capsys) -> None:
    rows = [{"step": s, "loss": loss_at(s)} for s in range(1000, 0, -1)]
    path = write_rows(tmp_path / "desc.jsonl", rows)
    log = read_log(path)
    assert log.step.tolist() == list(range(1, 1001))
    np.testing.assert_allclose(log.loss, [loss_at(s) for s in range(1, 1001)])
    i = log.input
    assert (i.restart_count, i.superseded_rows, i.out_of_order_points) == (0, 0, 999)
    assert i.reordered_rows == 1000 and i.loss_rows == 1000
    assert main(["doctor", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1,000 loss steps (1..1000); rows out of step order" in out
    assert "read in step order (1000 row(s) moved)" in out and "restart(s)" not in out
    assert main(["doctor", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["input"]["reordered_rows"] == 1000 and d["input"]["restarts"] == 0
    assert any(c["cause"] == "out_of_order" for c in d["verdict"]["causes"])


def test_rows_merged_from_files_in_the_wrong_order_are_all_kept(tmp_path) -> None:
    parts = [range(334, 667), range(667, 1001), range(1, 334)]  # shard 1, shard 2, shard 0
    rows = [{"step": s, "loss": loss_at(s), "lr": s * 1e-6} for part in parts for s in part]
    log = read_log(write_rows(tmp_path / "merged.jsonl", rows))
    assert log.step.tolist() == list(range(1, 1001))
    np.testing.assert_allclose(log.columns["lr"], np.arange(1, 1001) * 1e-6)  # columns follow
    assert log.input.restart_count == 0 and log.input.out_of_order_points == 1  # 1000 -> 1


def test_a_resume_is_still_a_restart_not_disorder(tmp_path) -> None:
    rows = ([{"step": s, "loss": loss_at(s)} for s in range(1, 701)]
            + [{"step": s, "loss": loss_at(s, run=1.0)} for s in range(400, 1001)])
    log = read_log(write_rows(tmp_path / "resumed.jsonl", rows))
    assert log.step.tolist() == list(range(1, 1001))
    np.testing.assert_allclose(log.loss[399:], [loss_at(s, 1.0) for s in range(400, 1001)])
    i = log.input
    assert (i.restart_count, i.superseded_rows, i.reordered_rows) == (1, 301, 0)


def test_shards_of_a_resumed_run_merged_out_of_order(tmp_path) -> None:
    first = [{"step": s, "loss": loss_at(s)} for s in range(1, 700)]  # run A, two shards
    resumed = [{"step": s, "loss": loss_at(s, run=1.0)} for s in range(400, 1001)]
    log = read_log(write_rows(tmp_path / "m.jsonl", first[500:] + first[:500] + resumed))
    assert log.step.tolist() == list(range(1, 1001))
    np.testing.assert_allclose(log.loss[:399], [loss_at(s) for s in range(1, 400)])
    np.testing.assert_allclose(log.loss[399:], [loss_at(s, 1.0) for s in range(400, 1001)])
    i = log.input
    assert (i.restart_count, i.out_of_order_points) == (1, 1)


@settings(max_examples=60, deadline=None)
@given(st.permutations(list(range(1, 41))))
def test_any_order_of_distinct_steps_reads_every_row_in_step_order(steps) -> None:
    log = read_records([{"step": s, "loss": loss_at(s)} for s in steps])
    assert log.step.tolist() == list(range(1, 41))
    np.testing.assert_allclose(log.loss, [loss_at(s) for s in range(1, 41)])
    assert log.input.restart_count == 0 and log.input.superseded_rows == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=6))
def test_runs_that_each_resume_at_a_logged_step_are_restarts(runs) -> None:
    steps: list[int] = []
    for back, length in runs:  # each run resumes at a step the log already holds
        start = steps[max(0, len(steps) - 1 - back)] if steps else 0
        steps.extend(range(start, start + length))
    assert step_order(np.asarray(steps, dtype=float), InputSummary()) is None


def _csv(rows: int, delimiter: str = ",") -> str:
    return f"step{delimiter}loss\n" + "".join(f"{s}{delimiter}{loss_at(s)}\n"
                                               for s in range(1, rows + 1))


@pytest.mark.parametrize("delimiter", [",", ";", "|", "\t", " ", "   "])
def test_csv_delimiters_read_the_same(tmp_path, delimiter) -> None:
    log = read_log(_write(tmp_path / "log.csv", _csv(300, delimiter)))
    assert log.step.tolist() == list(range(1, 301))
    np.testing.assert_allclose(log.loss, [loss_at(s) for s in range(1, 301)])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_cut_gzipped_csv_keeps_the_whole_rows_before_the_cut(tmp_path) -> None:
    data = gzip.compress(_csv(3000).encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[: len(data) // 2])
    log = read_log(path)
    n = log.num_steps
    assert 100 < n < 3000 and log.step.tolist() == list(range(1, n + 1))
    np.testing.assert_allclose(log.loss, [loss_at(s) for s in range(1, n + 1)])  # none cut short
    assert log.input.truncated and log.input.malformed_lines == [n + 2]  # the cut line
    assert log.input.lines == n + 2  # the header, the rows and the cut line, as for JSON lines


@pytest.mark.parametrize("name, content, reason", [
    ("object.json", json.dumps({"config": {"lr": 1}, "metrics": [1]}, indent=2),
     "one JSON object (keys: config, metrics) that is not a trainer_state.json"),
    ("state.json", json.dumps({"log_history": {"loss": 1}}, indent=2),
     "no 'log_history' list of rows"),
    ("list.jsonl", "".join(json.dumps({"step": s, "loss": [2.5]}) + "\n" for s in range(9)),
     "line 1: 'loss' is [2.5] (a list), not a number"),
    ("corrupt.csv.gz", None, "corrupt or unreadable: the gzip stream breaks off"),
    ("lengths.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<i8'}\n" + bytes(range(256)),
     "not a log the doctor reads: no line is a JSON object"),
    ("events.out.tfevents.1", bytes(range(7, 200)), "corrupt or not TensorBoard event files"),
    ("garbage.csv.gz", b"\x1f\x8b" + b"\x00" * 40, "corrupt or unreadable"),
])
def test_a_file_the_doctor_cannot_read_is_one_line_naming_it(tmp_path, capsys, name, content,
                                                             reason) -> None:
    path = tmp_path / name
    if content is None:
        data = gzip.compress(_csv(2000).encode())
        path.write_bytes(data[:20] + b"\x00" * 50 + data[70:])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert main(["doctor", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lengthwise doctor: error: {path}: ") and err.count("\n") == 1, err
    assert reason in err and "Traceback" not in err


def test_a_gzipped_log_with_junk_after_its_stream_keeps_its_rows(tmp_path) -> None:
    rows = "".join(json.dumps({"step": s, "loss": loss_at(s)}) + "\n" for s in range(1, 51))
    path = tmp_path / "log.jsonl.gz"
    path.write_bytes(gzip.compress(rows.encode()) + b"junk after the gzip stream")
    log = read_log(path)
    assert log.step.tolist() == list(range(1, 51)) and log.input.truncated


def test_integer_steps_above_2_pow_53_are_refused_not_merged(tmp_path, capsys) -> None:
    rows = [{"step": 2**53 + s, "loss": loss_at(s)} for s in range(200)]
    path = write_rows(tmp_path / "huge.jsonl", rows)
    assert main(["doctor", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"step {2**53 + 1} is above 2**53" in err
    exact = [{"step": 2.0**53 + 2 * s, "loss": loss_at(s)} for s in range(200)]  # floats: as given
    assert read_log(write_rows(tmp_path / "floats.jsonl", exact)).num_steps == 200
