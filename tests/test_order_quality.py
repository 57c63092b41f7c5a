"""The order-quality experiment: its intervals, its reading, its committed figures and docs.

The fast tests check the statistics against scipy, that the reading follows the intervals
(a difference only where a paired interval excludes zero), that the committed figures meet
what the experiment promises (every order, at least five seeds, equal real tokens, a wide
length span), and that the marked regions of the docs hold what the script renders from them.
The slow one reruns the reduced check run and compares it figure by figure with the
committed one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _order_quality import check_promises, drift_after
from _scripts import script_fixtures, stale_regions
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.intervals import paired_difference, t_critical, t_interval

ROOT = Path(__file__).resolve().parents[1]
script, saved = script_fixtures("order_quality")


@pytest.mark.parametrize("df", [1, 2, 4, 9, 19, 30])
def test_t_critical_values_are_students(df):
    stats = pytest.importorskip("scipy.stats")
    assert t_critical(df) == pytest.approx(stats.t.ppf(0.975, df), abs=6e-4)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=12))
def test_the_interval_is_scipys_t_interval(values):
    stats = pytest.importorskip("scipy.stats")
    iv = t_interval(values)
    if iv["sd"] == 0:
        assert iv["half"] == 0
        return
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=iv["mean"],
                              scale=stats.sem(values))
    # the table's critical values have 3 decimals: the half-width is within 3e-4 of scipy's
    assert iv["half"] == pytest.approx((hi - lo) / 2, rel=3e-4, abs=1e-12)
    assert iv["mean"] == pytest.approx((hi + lo) / 2, rel=1e-9, abs=1e-9)


def test_paired_difference_pairs_by_seed_and_says_when_zero_is_outside():
    a = {0: 5.0, 1: 6.0, 2: 7.0}
    b = {2: 6.9, 0: 4.9, 1: 5.9, 3: 0.0}  # seed 3 has no partner: left out
    d = paired_difference(a, b)
    assert d["n"] == 3 and d["mean"] == pytest.approx(0.1) and d["detected"]
    noisy = paired_difference(a, {0: 4.0, 1: 6.5, 2: 7.2})
    assert not noisy["detected"]


def _row(mean: float, half: float, diff: tuple[float, float] | None) -> dict:
    iv = {"mean": mean, "half": half, "lo": mean - half, "hi": mean + half, "n": 5}
    out = {"eval_loss": iv, "settled": True, "strata": {"8-20": iv, "170-256": iv},
           "tokens_to_target": {"mean": 1000.0, "half": 50.0}, "steps": {"mean": 50.0}}
    if diff is not None:
        d = {"mean": diff[0], "half": diff[1], "n": 5,
             "detected": abs(diff[0]) > diff[1]}
        out["vs_random"] = {"eval_loss": d, "strata": {"8-20": d, "170-256": {
            "mean": 0.0, "half": 0.1, "detected": False}}}
    return out


def test_the_reading_follows_the_intervals(script):
    full = {"config": {"max_tokens": 512}, "orders": {"random": _row(5.0, 0.02, None),
                       "stratified": _row(4.9, 0.02, (-0.1, 0.03)),
                       "sorted": _row(5.0, 0.02, (0.01, 0.05))}}
    text = " ".join(script.reading(full).split())
    assert "stratified's held-out loss is lower than random's by 0.100 ± 0.030" in text
    assert "(lengths 8-20)" in text
    assert "no difference detected at this size for sorted" in text
    assert "does not change the final model" not in text
    for row in full["orders"].values():
        if "vs_random" in row:
            row["vs_random"] = {"eval_loss": {"mean": 0.01, "half": 0.05, "detected": False},
                                "strata": {}}
    text = " ".join(script.reading(full).split())
    assert "no difference detected at this size for stratified, sorted" in text
    assert "does not change the final model beyond seed noise" in text


def test_the_committed_figures_are_what_the_experiment_promises(saved):
    full = saved["full"]
    check_promises(full)
    strata = full["strata"]
    for row in full["orders"].values():
        assert row["eval_loss"]["n"] == len(full["config"]["seeds"])
        assert set(row["strata"]) == set(strata)
        assert row["eval_loss"]["half"] is not None
    for name, row in full["orders"].items():
        if name != "random":
            assert set(row["vs_random"]["strata"]) == set(strata)
        if name != "sorted":
            assert "eval_loss" in row["vs_sorted"]


def test_the_doctor_agrees_with_each_orders_composition(saved):
    # an order whose steps each hold the data set's length mix (step_cv_ratio well below a
    # random shuffle's 1.0) is not one whose step bucket drives its loss
    for run in saved["full"]["runs"]:
        name = run["order"]
        if run["step_cv_ratio"] is not None and run["step_cv_ratio"] < 0.5:
            assert "composition_noise" not in run["doctor"]["step"]["causes"], name
        if name in ("stratified", "interleave"):
            assert not run["doctor"]["step"]["bands"], name


def test_the_reading_counts_the_per_micro_batch_levels_of_the_runs(script, saved):
    full = saved["full"]
    text = script.doctor_text(full)
    for name, row in full["orders"].items():
        runs = [r["doctor"]["micro"]["bucket_levels"] for r in full["runs"] if r["order"] == name]
        tested = sum(lv is not None and lv["p_value"] is not None for lv in runs)
        found = sum(bool(lv and lv["found"]) for lv in runs)
        assert row["doctor"]["micro"]["levels_found"].count(True) == found
        line = next(ln for ln in text.split("\n- ") if ln.lstrip("- ").startswith(f"`{name}`"))
        expected = (f"one loss level per length range in {found} of the {tested} seeds" if tested
                    else "per-bucket levels tested in no seed")
        assert expected in " ".join(line.split()), name


def test_every_region_holds_what_the_script_renders(script, saved):
    stale = stale_regions(script, saved)
    assert not stale, (f"{stale} differ from benchmarks/ORDER_QUALITY.json; run python "
                       "benchmarks/order_quality.py --render")


def test_the_plots_are_committed(script):
    for path in script.PLOTS.values():
        assert path.is_file() and path.stat().st_size > 0


def test_drift_in_the_check_run_is_reported(script, saved):
    def change(run):
        run["eval_loss"] *= 1 + 10 * script.REL_TOL
        run["real_tokens"] += 1

    drift = drift_after(script, saved["check"], change)
    assert any("eval_loss" in line for line in drift)
    assert any("real_tokens" in line for line in drift)


def test_json_is_written_without_nan(script, tmp_path):
    path = tmp_path / "x.json"
    script.write({"a": [math.nan, 1.0], "b": {"c": math.inf}}, path)
    assert json.loads(path.read_text()) == {"a": [None, 1.0], "b": {"c": None}}


@pytest.mark.slow
def test_a_rerun_of_the_check_gives_the_committed_figures(script, saved, tmp_path):
    pytest.importorskip("torch")
    fresh = script.run(script.CHECK, tmp_path, 1, None)
    drift = script.compare(saved["check"], fresh)
    assert not drift, "\n".join(drift)


SCRIPTS = ("order_quality", "order_quality_dflash")


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0"], "argument --workers: must be a positive integer, got '0'"),
    (["--workers", "-3"], "argument --workers: must be a positive integer, got '-3'"),
    (["--out", "{file}"], "--out {file}: exists and is not a folder"),
    (["--out", "{file}/runs"], "--out {file}/runs: {file} is not a folder"),
    (["--cache-dir", "{file}/cache"], "--cache-dir {file}/cache: {file} is not a folder"),
    (["--cache-dir", "/proc/1/nope"], "--cache-dir /proc/1/nope: cannot make this folder"),
], ids=["workers-0", "workers-negative", "out-file", "out-under-file", "cache-under-file",
        "cache-unmakeable"])
def test_a_bad_option_is_one_line_and_nothing_runs(name, args, message, tmp_path, capsys,
                                                    monkeypatch):
    """Both scripts share their options: a count of workers below one, or a folder that
    cannot be one, is refused before any run starts (not accepted, not a traceback)."""
    from _scripts import load_script

    if message.startswith("--cache-dir /proc") and not Path("/proc/1").is_dir():
        pytest.skip("needs /proc")
    module = load_script(name)
    monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("a run started"))
    file = tmp_path / "afile.txt"
    file.write_text("not a folder\n")
    with pytest.raises(SystemExit) as exit_:
        module.main([*(a.format(file=file) for a in args), "--check-only"])
    lines = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"{name}.py: error: " + message.format(file=file)), lines


def _refused(module, argv: list[str], capsys, monkeypatch) -> str:
    """The one line a script's ``main(argv)`` is refused with (exit 2), nothing run or written."""
    for name in ("run", "plot", "rewrite", "write", "write_json"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("it ran"))
    with pytest.raises(SystemExit) as exit_:
        module.main(argv)
    said = capsys.readouterr()
    lines = said.err.splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and not said.out, lines
    return lines[0]


@pytest.mark.parametrize("name", ("order_arms", *SCRIPTS))
@pytest.mark.parametrize(("argv", "message"), [
    (["--check-only", "--full-only"], "argument --full-only: not allowed with argument "
                                      "--check-only"),
    (["--render", "--check"], "argument --check: not allowed with argument --render"),
    (["--check", "--check-only"], "argument --check-only: not allowed with argument --check"),
], ids=["check-only-full-only", "render-check", "check-check-only"])
def test_contradictory_modes_are_refused_in_one_line(name, argv, message, capsys, monkeypatch):
    from _scripts import load_script

    line = _refused(load_script(name), argv, capsys, monkeypatch)
    assert line.startswith(f"{name}.py: error: {message}"), line


@pytest.mark.parametrize("name", ("order_arms", *SCRIPTS))
def test_a_damaged_committed_json_is_one_line_naming_it(name, tmp_path, capsys, monkeypatch):
    from _scripts import load_script

    module = load_script(name)
    text = module.SAVED.read_text(encoding="utf-8")
    damaged = tmp_path / module.SAVED.name
    damaged.write_text(text[: len(text) // 2], encoding="utf-8")
    monkeypatch.setattr(module, "SAVED", damaged)
    line = _refused(module, ["--render"], capsys, monkeypatch)
    assert line.startswith(f"{name}.py: error: {damaged}: not valid JSON, damaged or cut short "
                           "("), line
    damaged.write_text("[1, 2]\n", encoding="utf-8")
    line = _refused(module, ["--render"], capsys, monkeypatch)
    assert line.startswith(f"{name}.py: error: {damaged}: holds a JSON list, not the figures' "
                           "object"), line


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_option_a_script_documents_is_one_it_has(name, capsys):
    import re

    from _scripts import load_script

    module = load_script(name)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    helped = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))
    documented = set(re.findall(r"--[a-z][a-z-]*", module.__doc__))
    assert documented and documented <= helped, documented - helped


def test_the_default_orders_are_the_vocabularys_then_packed(monkeypatch):
    """The experiment's default order list is read from the planner's vocabulary, not spelled out
    again: a name added there is trained by the experiment."""
    from lengthwise.demo.evidence import EvidenceConfig
    from lengthwise.planning import vocabulary

    assert EvidenceConfig().orders == (*vocabulary.ORDERS, "packed")
    monkeypatch.setattr(vocabulary, "ORDERS", vocabulary.ORDERS[:2])
    assert EvidenceConfig().orders == (*vocabulary.ORDERS[:2], "packed")
