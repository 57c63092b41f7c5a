"""The demo figures in README.md and docs/ are the ones ``benchmarks/docs_figures.py`` measured.

The fast tests check that every marked region holds exactly what the script renders
from ``benchmarks/DOCS_FIGURES.json`` (nobody typed a figure) at the settings the
script runs. The slow one reruns every order of both demos at those settings and
fails when a deterministic figure (a loss, padding, step composition, roughness, a
verdict, a decoding result) differs from the docs. It always starts from an empty
cache, as a fresh machine does (corpus, tokenizer, DFlash target and its responses
all built by the run): that took 233 s for the causal-LM task and 285 s for the
DFlash task on two shared CPU cores.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from _scripts import load_script, stale_regions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    pytest.importorskip("torch")
    return load_script("docs_figures")


@pytest.fixture(scope="module")
def saved(script):
    return json.loads(script.SAVED.read_text(encoding="utf-8"))


def test_every_region_holds_what_the_script_renders(script, saved):
    stale = stale_regions(script, saved)
    assert not stale, (f"{stale} differ from benchmarks/DOCS_FIGURES.json; run python "
                       "benchmarks/docs_figures.py --render")


def test_the_saved_figures_come_from_the_settings_the_script_runs(script, saved):
    from lengthwise.demo.config import available_orders

    for task in script.SETTINGS:
        assert saved[task]["command"] == script.command(task)
        assert list(saved[task]["strategies"]) == list(available_orders())
        for row in saved[task]["strategies"].values():
            assert set(script.DETERMINISTIC[task]) <= set(row)


def test_the_documented_runs_are_the_demos_defaults(script, saved):
    # the README's table is the one `lengthwise demo` prints: no option changes the run
    from lengthwise.demo.config import DemoConfig, DFlashDemoConfig

    assert script.command("lm") == "lengthwise demo"
    assert script.command("dflash") == "lengthwise demo --task dflash"
    for task, cfg in (("lm", DemoConfig()), ("dflash", DFlashDemoConfig())):
        for key, value in saved[task]["config"].items():
            assert getattr(cfg, key) == value, (task, key)


def test_drift_in_a_deterministic_figure_is_reported_and_throughput_is_not(script, saved):
    fresh = copy.deepcopy(saved["lm"])
    for row in fresh["strategies"].values():
        row["tokens_per_second"] = (row["tokens_per_second"] or 1.0) * 1.5
    assert script.compare(saved["lm"], fresh, "lm") == []
    fresh["strategies"]["sorted"]["verdict"] = "clean"
    fresh["strategies"]["random"]["eval_loss"] += 0.01
    drift = script.compare(saved["lm"], fresh, "lm")
    assert any(line.startswith("lm random eval_loss") for line in drift)
    if saved["lm"]["strategies"]["sorted"]["verdict"] != "clean":
        assert any(line.startswith("lm sorted verdict") for line in drift)
    del fresh["strategies"]["packed"]
    assert "orders" in script.compare(saved["lm"], fresh, "lm")[0]


def test_a_fresh_machines_rounding_is_not_drift(script, saved):
    # a fresh machine's kernels moved the causal-LM losses by 1.3e-4 relative, and a verdict
    # quotes its figures: neither is a change of the documented result
    fresh = copy.deepcopy(saved["lm"])
    for row in fresh["strategies"].values():
        for key in ("eval_loss", "final_loss", "loss_roughness"):
            row[key] *= 1 + 1.3e-4
        row["verdict"] = row["verdict"] + " (loss_roughness 0.1)"
    old = copy.deepcopy(saved["lm"])
    for row in old["strategies"].values():
        row["verdict"] = row["verdict"] + " (loss_roughness 0.2)"
    assert script.compare(old, fresh, "lm") == []


def test_a_region_without_its_markers_is_named(script, saved, tmp_path):
    (tmp_path / "docs").mkdir()
    for rel in script.REGIONS:
        (tmp_path / rel).write_text("no markers here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="README.md has no region lm-table"):
        script.rewrite(saved, root=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["lm", "dflash"])
def test_a_fresh_run_of_every_order_gives_the_documented_figures(script, saved, task,
                                                                 tmp_path):
    # an empty cache, as on a fresh machine: the corpus, tokenizer, target and its responses
    # are all built by the run itself
    fresh = script.figures(task, script.run_task(task, tmp_path, str(tmp_path / "cache")))
    drift = script.compare(saved[task], fresh, task)
    assert not drift, "\n".join(drift)
    why = script.other_kernels(saved[task], fresh, task)
    if why:  # the target's loss was compared (within REL_TOL); what follows it cannot be
        pytest.skip(why)


def test_a_dflash_target_trained_on_other_kernels_is_named_not_taken_for_drift(script, saved):
    """The DFlash target's loss decides what follows it: the same to the last digit, every
    figure is compared; within REL_TOL but not the same, only it (the kernels differ);
    beyond REL_TOL, it is drift."""
    old = saved["dflash"]
    loss = old["data"]["target_eval_loss"]
    same = copy.deepcopy(old)
    next(iter(same["strategies"].values()))["eval_loss"] += 0.5
    assert script.other_kernels(old, same, "dflash") is None
    assert any("eval_loss" in line for line in script.compare(old, same, "dflash"))

    other = copy.deepcopy(same)
    other["data"]["target_eval_loss"] = loss * (1 + 1e-5)
    other["cpu"] = "another CPU"
    why = script.other_kernels(old, other, "dflash")
    assert why and "another CPU" in why and "round" in why
    assert script.compare(old, other, "dflash") == []

    drifted = copy.deepcopy(other)
    drifted["data"]["target_eval_loss"] = loss * 1.01
    assert script.other_kernels(old, drifted, "dflash") is None
    assert script.compare(old, drifted, "dflash") == [
        f"dflash target_eval_loss: {loss} in the docs, {loss * 1.01} now"]
    assert script.other_kernels(saved["lm"], copy.deepcopy(saved["lm"]), "lm") is None
