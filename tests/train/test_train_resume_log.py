"""The step log of a resumed run: the same records as the uninterrupted run, each step once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lengthwise.train.config import LoopConfig  # noqa: E402
from lengthwise.train.loop import MicroOut, TrainLoop  # noqa: E402

#: fields that hold wall-clock time, different in every run
WALL_CLOCK = {"time", "seconds", "tokens_per_second", "blocking_seconds", "path"}


class _GappyTask:
    """A two-weight model; every fifth step has nothing to learn (its normaliser is 0)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 1, bias=False)

    def prepare(self, batch, rows, step):
        return {"tokens": float(batch["real_tokens"]) * (step % 5 != 3),
                "x": float(batch["real_tokens"]) / 100.0}

    def normaliser(self, prepared) -> float:
        return prepared["tokens"]

    def forward(self, net, prepared) -> MicroOut:
        x = torch.tensor([[prepared["x"], 1.0]])
        loss = (net(x) - 1.0).square().sum() * prepared["tokens"] + 2.0 * prepared["tokens"]
        return MicroOut(loss=loss, norm=prepared["tokens"])

    def step_fields(self, stats):
        return {}


LENGTHS = np.random.default_rng(0).integers(5, 190, size=300)


def _loop(run_dir: Path, **kw) -> TrainLoop:
    cfg = LoopConfig(steps=24, max_tokens=512, max_len=192, grad_accum=2, progress=False,
                     checkpoint_every=8, keep_checkpoints=3, **kw)
    return TrainLoop(_GappyTask(), "bucket-random", LENGTHS,
                     lambda i: {"input_ids": [1] * int(LENGTHS[i])}, cfg, run_dir=run_dir,
                     device=torch.device("cpu"), micro_log=True)


def _train(loop: TrainLoop, steps: int | None = None) -> None:
    try:
        while not loop.done and (steps is None or loop.step_count < steps):
            loop.step()
    finally:
        loop.close()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _steady(rows: list[dict]) -> list[dict]:
    """The rows without their wall-clock fields and without the resume event."""
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows
            if r.get("event") != "resume"]


def _events(rows: list[dict]) -> list[dict]:
    return sorted(_steady([r for r in rows if "event" in r]),
                  key=lambda r: (r.get("step") or 0, r["event"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_log")
    _train(_loop(root / "full"))
    _train(_loop(root / "cut"), steps=13)  # stopped 5 steps after the checkpoint of step 8
    with open(root / "cut" / "train_log.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 14, "epoch": 0, "lo')  # killed while writing a line
    resumed = _loop(root / "cut", resume=True)
    assert resumed.step_count == 8
    _train(resumed)
    return root


def test_a_resumed_log_equals_the_uninterrupted_log_field_by_field(runs):
    full = _rows(runs / "full" / "train_log.jsonl")
    cut = _rows(runs / "cut" / "train_log.jsonl")
    records = [r for r in cut if "event" not in r]
    assert [r["step"] for r in records] == list(range(1, 25))  # each step once
    assert _steady(records) == _steady([r for r in full if "event" not in r])
    # the same events (checkpoints are written in the background: their order varies)
    assert _events(cut) == _events(full)
    last = records[-1]
    assert last["skipped_total"] == 5 and last["bucket_loss"] and records[-2]["corrected_loss"]


def test_the_rows_rolled_back_are_kept_beside_the_log(runs):
    resume = [r for r in _rows(runs / "cut" / "train_log.jsonl") if r.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 8
    side = runs / "cut" / "train_log.rolled_back.jsonl"
    assert resume[0]["rolled_back"] == 6 and resume[0]["rolled_back_to"] == str(side)
    lines = side.read_text(encoding="utf-8").splitlines()
    assert lines[-1] == '{"step": 14, "epoch": 0, "lo'
    kept = [json.loads(line) for line in lines[:-1]]
    assert [r["step"] for r in kept if "event" not in r] == [9, 10, 11, 12, 13]


def test_the_micro_batch_log_is_rolled_back_and_continued_too(runs):
    full = _rows(runs / "full" / "micro_log.jsonl")
    cut = _rows(runs / "cut" / "micro_log.jsonl")
    records = [r for r in cut if "event" not in r]
    assert [r["step"] for r in records] == list(range(1, 49))  # 2 micro-batches a step
    assert _steady(records) == _steady([r for r in full if "event" not in r])
    side = _rows(runs / "cut" / "micro_log.rolled_back.jsonl")
    assert [r["optimizer_step"] for r in side if "event" not in r] == [9, 9, 10, 10, 11, 11,
                                                                     12, 12, 13, 13]


def test_a_checkpoint_without_step_log_state_is_refused_naming_it(tmp_path, monkeypatch):
    import lengthwise.train.loop as loop_module
    from lengthwise.train.checkpoint import CheckpointError

    with monkeypatch.context() as patch:  # checkpoints as an older version saved them
        patch.setattr(loop_module, "LOG_STATE", "unknown")
        patch.setattr(loop_module, "MICRO_LOG_STATE", "unknown_micro")
        _train(_loop(tmp_path), steps=11)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.jsonl")}
    with pytest.raises(CheckpointError) as err:
        _loop(tmp_path, resume=True)
    assert str(err.value) == (
        f"{tmp_path / 'checkpoints' / 'step_8'} holds no step-log state: it was written by an "
        "older lengthwise, which this version does not resume; train without resume to start "
        "over, or into another folder")
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.jsonl")} == before  # untouched


def test_a_resume_that_adds_the_micro_batch_log_starts_it_there(tmp_path):
    first = _loop(tmp_path)
    first.micro_logger.close()
    first.micro_logger = None  # this run keeps no micro-batch log
    _train(first, steps=11)
    (tmp_path / "micro_log.jsonl").unlink()
    resumed = _loop(tmp_path, resume=True)
    assert resumed.step_count == 8
    _train(resumed)
    records = [r for r in _rows(tmp_path / "micro_log.jsonl") if "event" not in r]
    assert records[0]["optimizer_step"] == 9 and records[-1]["optimizer_step"] == 24


def test_the_doctor_reads_the_resumed_log_as_the_uninterrupted_one(runs):
    from lengthwise.doctor import load

    full, cut = (load(str(runs / name / "train_log.jsonl")) for name in ("full", "cut"))
    assert cut.input.restart_count == 0 and cut.input.malformed == 0  # no step logged twice
    assert np.array_equal(cut.step, full.step)
    assert np.array_equal(cut.loss, full.loss, equal_nan=True)  # skipped steps: missing
    assert cut.bucket_loss == full.bucket_loss


@pytest.mark.parametrize(("change", "named"), [
    ({"version": 2}, "version 2"),
    ({"skipped_total": -1}, "skipped_total must be a non-negative integer"),
    ({"bucket_losses": {"windows": [[0, [[0, "x", 1.0]]]], "observed": []}}, "'x'"),
    ({"extra": 1}, "not a StepLogger state"),
])
def test_a_step_log_state_that_is_not_one_is_refused_by_name(change, named):
    from lengthwise.errors import ConfigError
    from lengthwise.train import StepLogger

    with StepLogger(None) as log:
        log.step(1, loss=1.0)
        state = {**log.state_dict(), **change}
        with pytest.raises(ConfigError, match=named):
            log.load_state_dict(state)
        assert log.skipped_total == 0 and log.steps_logged == 1  # nothing changed


def test_a_resume_with_no_checkpoint_keeps_an_earlier_log_and_says_what_to_do(tmp_path):
    from lengthwise.errors import ConfigError

    _train(_loop(tmp_path), steps=5)  # stopped before the first checkpoint (step 8)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.jsonl")}
    with pytest.raises(ConfigError, match=r"resume: no checkpoint under .*checkpoints to resume "
                                          r"from, .* train_log\.jsonl, micro_log\.jsonl: "
                                          r"train without resume to start over"):
        _loop(tmp_path, resume=True)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.jsonl")} == before
    fresh = _loop(tmp_path / "new", resume=True)  # an empty folder: nothing to lose, step 0
    _train(fresh, steps=1)
    assert fresh.resumed_from is None and fresh.step_count == 1


def test_a_step_longer_than_grad_accum_numbers_its_micro_batch_lines_on(tmp_path):
    """Steps formed elsewhere (``loop.batches`` replaced) may hold more micro-batches than
    ``grad_accum``: the micro-batch log's lines still count up, one number each."""
    from lengthwise.train.loop import StepBatches

    loop = _loop(tmp_path)
    loop.batches = StepBatches(loop.sampler, 3)  # 3 micro-batches a step, grad_accum 2
    _train(loop, steps=4)
    steps = [r["step"] for r in _rows(tmp_path / "micro_log.jsonl") if "event" not in r]
    assert steps == list(range(1, 13))
