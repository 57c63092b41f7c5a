"""Rolling a step log back to a step: the lines past it move to the side file, nothing is lost."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.train import StepLogger
from lengthwise.train.step_logger import rollback
from lengthwise.train.step_logger.rollback import roll_back, rolled_back_path


def _line(kind: str, step: int) -> str:
    if kind == "record":
        return json.dumps({"step": step, "loss": 1.0 / (step + 1)})
    if kind == "event":
        return json.dumps({"event": "checkpoint_written", "step": step})
    return json.dumps({"event": "plan", "order": "stratified"})  # an event without a step


_logs = st.lists(st.tuples(st.sampled_from(["record", "event", "plain"]),
                           st.integers(0, 30)), max_size=25)


@settings(max_examples=80, deadline=None)
@given(rows=_logs, step=st.integers(0, 30), block=st.sampled_from([1, 7, 64, 1 << 20]),
       cut_short=st.booleans())
def test_the_log_and_its_side_file_split_the_lines_past_the_step(tmp_path_factory, rows, step,
                                                                 block, cut_short):
    lines = sorted((_line(k, s) for k, s in rows if k == "record"),
                   key=lambda x: json.loads(x)["step"])  # records in step order, as logged
    lines += [_line(k, s) for k, s in rows if k != "record"]
    text = "".join(x + "\n" for x in lines) + ('{"step": 99, "lo' if cut_short else "")
    log = tmp_path_factory.mktemp("log") / "train_log.jsonl"
    log.write_text(text, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rollback, "BLOCK_BYTES", block)  # lines across read blocks
        moved = roll_back(log, step)
    kept = log.read_text(encoding="utf-8").splitlines()
    side = (rolled_back_path(log).read_text(encoding="utf-8").splitlines()
            if moved.side_file else [])
    assert all(json.loads(x).get("step", 0) <= step for x in kept)
    assert moved.lines == len(side[1:]) and (not side or json.loads(side[0])["step"] == step)
    past = [x for x in side[1:] if not x.startswith('{"step": 99, "lo')]
    assert all(json.loads(x)["step"] > step for x in past)
    # nothing lost: the kept lines in their order, then what moved, are the lines of the log
    tail_start = max((i + 1 for i, x in enumerate(lines)
                      if "event" not in x and json.loads(x)["step"] <= step), default=0)
    assert kept == lines[:tail_start] + [x for x in lines[tail_start:]
                                         if json.loads(x).get("step", 0) <= step]
    assert sorted(kept + side[1:]) == sorted(lines + (['{"step": 99, "lo'] if cut_short else []))
    again = roll_back(log, step)  # a second roll-back moves nothing
    assert again.lines == 0 and log.read_text(encoding="utf-8").splitlines() == kept


def test_a_log_without_lines_past_the_step_is_left_alone(tmp_path):
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n', encoding="utf-8")
    before = log.stat().st_ino
    assert roll_back(log, 2).lines == 0 and log.stat().st_ino == before
    assert not rolled_back_path(log).exists()
    assert roll_back(tmp_path / "none.jsonl", 3).lines == 0


def test_a_logger_rolls_its_open_file_back_and_goes_on_appending(tmp_path):
    log_path = tmp_path / "train_log.jsonl"
    with StepLogger(log_path) as log:
        for step in range(1, 6):
            log.step(step, loss=1.0)
    with StepLogger(log_path) as log:
        log.event("resume", step=3)  # written before the roll-back: kept (its step is 3)
        moved = log.roll_back(3)
        assert moved.lines == 2 and log.rolled_back == moved
        for step in (4, 5):
            log.step(step, loss=2.0)
    rows = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [(r.get("event"), r["step"]) for r in rows] == [
        (None, 1), (None, 2), (None, 3), ("resume", 3), (None, 4), (None, 5)]
    assert [r["loss"] for r in rows if "event" not in r] == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_a_log_that_is_a_link_stays_one_and_its_file_is_rolled_back(tmp_path):
    real = tmp_path / "elsewhere" / "log.jsonl"
    real.parent.mkdir()
    real.write_text("".join(_line("record", s) + "\n" for s in range(1, 7)), encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").symlink_to(real)
    with StepLogger(run / "train_log.jsonl") as log:
        assert log.roll_back(4).lines == 2
        log.step(5, loss=2.0)
    assert (run / "train_log.jsonl").is_symlink()
    assert [json.loads(x)["step"] for x in real.read_text().splitlines()] == [1, 2, 3, 4, 5]
    side = rolled_back_path(run / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in side] == [4, 5, 6]  # the rolled_back line, 5, 6


def test_steps_written_as_floats_are_rolled_back_as_the_numbers_they_are(tmp_path):
    log = tmp_path / "train_log.jsonl"
    rows = [{"step": 3}, {"step": 4}, {"event": "checkpoint_written", "step": 4},
            {"step": 5.0}, {"step": 6.0}, {"step": 6.5}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert roll_back(log, 4).lines == 3
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [3, 4, 4]
    rows[1]["step"] = 4.0  # the last record at the step, a float too
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert roll_back(log, 5).lines == 2
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [3, 4.0, 4, 5.0]
