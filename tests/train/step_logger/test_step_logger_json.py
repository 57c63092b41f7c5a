"""Every line of the step log is standard JSON: NaN and infinities are written as null."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.errors import ConfigError
from lengthwise.train import StepLogger


def _strict(line: str) -> dict:
    """``line`` read as standard JSON, which has no NaN or Infinity literal."""
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def _lines(path) -> list[dict]:
    return [_strict(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_nan_loss_and_an_infinite_gradient_norm_are_written_as_null_and_named(tmp_path):
    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        rec = log.log_step(1, losses=[float("nan")], real_tokens=[4], buckets=[0],
                           grad_norm=np.float32("inf"), skipped=True, acc=[0.5, -math.inf])
        log.log_step(2, losses=[2.0], real_tokens=[4], buckets=[0], grad_norm=1.0)
    assert math.isnan(rec["loss"])  # the record handed back keeps the number
    first, second = _lines(path)
    assert first["loss"] is None and first["grad_norm"] is None and first["acc"] == [0.5, None]
    assert first["non_finite"] == {"loss": "nan", "grad_norm": "inf", "acc[1]": "-inf"}
    assert first["skipped"] is True and first["skipped_total"] == 1
    assert second["loss"] == 2.0 and "non_finite" not in second


def test_an_event_with_a_nan_is_standard_json_too(tmp_path):
    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        log.event("eval", step=3, eval_loss=float("nan"), eval_accuracy=0.25)
    (line,) = _lines(path)
    assert line["eval_loss"] is None and line["non_finite"] == {"eval_loss": "nan"}
    assert line["eval_accuracy"] == 0.25


def test_non_finite_is_a_field_of_the_log_and_cannot_be_passed():
    with StepLogger(None) as log:
        with pytest.raises(ConfigError, match="non_finite"):
            log.step(1, non_finite={"x": "nan"})
        with pytest.raises(ConfigError, match="non_finite"):
            log.event("eval", non_finite=1)


_numbers = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]),
                       _numbers | st.lists(_numbers, max_size=3)
                       | st.dictionaries(st.sampled_from(["x", "y"]), _numbers, max_size=2),
                       max_size=3))
def test_any_numbers_give_a_json_line_that_keeps_the_finite_and_names_the_rest(fields):
    from lengthwise.train.step_logger.writer import json_line

    back = _strict(json_line(fields, "step"))
    named = back.pop("non_finite", {})

    def walk(value, place):
        if isinstance(value, float) and not math.isfinite(value):
            yield place, repr(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, f"{place}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from walk(v, f"{place}[{i}]")

    assert named == dict(kv for k, v in fields.items() for kv in walk(v, k))

    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v) for v in value]
        return value

    assert back == finite(fields)


def test_the_doctor_reads_a_null_loss_as_a_missing_value(tmp_path):
    from lengthwise.doctor import load

    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        for step in range(1, 7):
            loss = None if step == 3 else 2.0 + 0.1 * step
            log.step(step, loss=loss, skipped=loss is None, skip_reason="nothing_to_learn"
                     if loss is None else None)
    assert _lines(path)[2]["loss"] is None
    run = load(str(path))
    assert run.step.tolist() == [1, 2, 3, 4, 5, 6]  # the row is kept, its loss missing
    assert np.isnan(run.loss[2]) and np.isfinite(np.delete(run.loss, 2)).all()
    assert run.input.malformed == 0


class _ScriptedTask:
    """A model whose step loss is scripted: 2.0, NaN at step 10, 50.0 at step 15, none at 5."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.model = torch.nn.Linear(1, 1, bias=False)

    def prepare(self, batch, rows, step):
        return {"tokens": 0.0 if step == 4 else float(batch["real_tokens"]),
                "value": {9: math.nan, 14: 50.0}.get(step, 2.0)}

    def normaliser(self, prepared) -> float:
        return prepared["tokens"]

    def forward(self, net, prepared):
        from lengthwise.train.loop import MicroOut

        loss = (net.weight.sum() * 0.0 + prepared["value"]) * prepared["tokens"]
        return MicroOut(loss=loss, norm=prepared["tokens"])

    def step_fields(self, stats):
        return {}


def test_the_loop_says_why_it_skipped_each_step_and_writes_no_nan(tmp_path):
    torch = pytest.importorskip("torch")
    from lengthwise.train.config import LoopConfig
    from lengthwise.train.loop import TrainLoop

    lengths = np.random.default_rng(0).integers(5, 60, size=200)
    cfg = LoopConfig(steps=20, max_tokens=256, max_len=64, grad_accum=2, progress=False,
                     spike_guard=True)
    loop = TrainLoop(_ScriptedTask(), "stratified", lengths,
                     lambda i: {"input_ids": [1] * int(lengths[i])}, cfg, run_dir=tmp_path,
                     device=torch.device("cpu"))
    try:
        while not loop.done:
            loop.step()
    finally:
        loop.close()
    text = (tmp_path / "train_log.jsonl").read_text(encoding="utf-8")
    records = [r for r in _lines(tmp_path / "train_log.jsonl") if "event" not in r]
    skipped = {r["step"]: (r["loss"], r.get("skip_reason"), r.get("non_finite"))
               for r in records if r["skipped"]}
    assert skipped == {5: (None, "nothing_to_learn", None),
                       10: (None, "non_finite_loss", {"loss": "nan"}),
                       15: (50.0, "loss_spike", None)}
    assert "NaN" not in text and records[-1]["skipped_total"] == 3
    assert all("skip_reason" not in r for r in records if not r["skipped"])
