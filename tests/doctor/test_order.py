"""The doctor reads the batch order a run uses from its log and never prescribes that order."""

from __future__ import annotations

import json

from lengthwise.doctor import diagnose
from lengthwise.doctor.context import logged_plan, plan_text

from simulated_logs.runs import simulate_run

PRESCRIBED = "lengthwise plan --order stratified"


def _fixes(report) -> str:
    return " ".join(p for c in report.verdict.causes for p in c.fix)


def _banded() -> list[dict]:
    return simulate_run("bucketed", steps=1500, seed=3).records


def test_a_banded_run_without_a_logged_order_is_told_to_stratify():
    report = diagnose(_banded())
    assert report.context.order is None
    assert PRESCRIBED in _fixes(report) and PRESCRIBED in report.verdict.summary


def test_a_run_logged_as_stratified_is_not_told_to_use_stratified(tmp_path):
    rows = [{"event": "plan", "order": "stratified", "layout": "pad"}, *_banded()]
    path = tmp_path / "train_log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for source in (rows, str(path)):
        report = diagnose(source)
        assert report.context.order == "stratified"
        assert report.verdict.causes  # the bands are still found and named
        assert PRESCRIBED not in _fixes(report)
        assert "already stratified" in report.verdict.summary
    assert report.to_dict()["context"]["order"] == "stratified"


def test_an_interleaved_run_is_told_to_stratify_not_to_interleave():
    rows = [{"event": "plan", "order": "interleave"}, *_banded()]
    fixes = _fixes(diagnose(rows))
    assert PRESCRIBED in fixes and "interleave or stratify" not in fixes


def logged_order(source):
    return plan_text(logged_plan(source), "order")


def test_the_order_given_by_the_caller_wins_and_other_sources_have_none(tmp_path):
    assert diagnose(_banded(), order="stratified").context.order == "stratified"
    assert logged_order(str(tmp_path / "missing.jsonl")) is None
    assert logged_order([{"event": "plan", "order": 3}]) is None
    (tmp_path / "log.csv").write_text("step,loss\n1,2.0\n", encoding="utf-8")
    assert logged_order(str(tmp_path / "log.csv")) is None
