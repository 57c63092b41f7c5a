"""The DFlash order-quality experiment: its samples, its reading, its committed figures and docs.

The fast tests check the samples (the target's response replaces the end of each sample,
so the lengths keep the corpus's span), that the reading follows the intervals (a
difference only where a paired interval excludes zero), that the committed figures meet
what the experiment promises (every order, at least five seeds, equal real tokens, a wide
length span, lossless decoding) and that the marked regions of the docs hold what the
script renders from them. The slow one reruns the reduced check run and compares it
figure by figure with the committed one.
"""

from __future__ import annotations

import pytest
from _order_quality import check_promises, drift_after
from _scripts import script_fixtures, stale_regions
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.errors import ConfigError

script, saved = script_fixtures("order_quality_dflash")


@settings(deadline=None)
@given(n=st.integers(4, 4096), cap=st.integers(1, 512))
def test_the_response_is_at_most_half_the_sample_and_at_most_the_cap(n, cap):
    from lengthwise.demo.evidence_dflash import response_length

    r = response_length(n, cap)
    assert 0 < r <= min(cap, n // 2) and n - r >= r
    assert r == cap or r == n // 2


@pytest.mark.parametrize("bad", [{"target_size": "huge"}, {"min_len": 2},
                                 {"block_size": 1}, {"eval_prompts": 0},
                                 {"target_epochs": 0.0}, {"orders": ("shuffled",)}])
def test_bad_settings_are_refused_naming_them(bad):
    from lengthwise.demo.evidence_dflash import DFlashEvidenceConfig

    with pytest.raises(ConfigError, match=next(iter(bad)).split("_")[0]):
        DFlashEvidenceConfig(**bad)


def _iv(mean: float, half: float) -> dict:
    return {"mean": mean, "half": half, "lo": mean - half, "hi": mean + half, "n": 5}


def _diff(mean: float, half: float) -> dict:
    return {**_iv(mean, half), "detected": abs(mean) > half}


def _row(accept: float, diff: tuple[float, float] | None) -> dict:
    iv = _iv(accept, 0.05)
    out = {"acceptance_length": iv, "accuracy": _iv(0.4, 0.01), "lossless": True,
           "mismatches": 0, "steps": {"mean": 50.0},
           "strata_acceptance": {"8-20": iv, "170-256": iv},
           "strata_accuracy": {"8-20": _iv(0.4, 0.01), "170-256": _iv(0.4, 0.01)}}
    if diff is not None:
        d = _diff(*diff)
        none = _diff(0.0, 0.1)
        out["vs_random"] = {"acceptance_length": d, "accuracy": none,
                            "strata_acceptance": {"8-20": d, "170-256": none},
                            "strata_accuracy": {"8-20": none, "170-256": none}}
    return out


def test_the_reading_follows_the_intervals(script):
    full = {"orders": {"random": _row(2.0, None), "stratified": _row(2.3, (0.3, 0.1)),
                       "sorted": _row(2.0, (0.02, 0.1))}}
    text = " ".join(script.reading(full).split())
    assert ("Acceptance length against random (paired by seed): - stratified's is higher by "
            "0.30 ± 0.10 (lengths 8-20)") in text
    assert "no difference detected at this size for sorted" in text
    assert "Accuracy against random (paired by seed): no difference detected at this size for " \
           "stratified, sorted" in text
    assert "does not change the draft" not in text
    full["orders"]["stratified"]["vs_random"]["acceptance_length"] = _diff(0.01, 0.1)
    full["orders"]["stratified"]["vs_random"]["strata_acceptance"]["8-20"] = _diff(0.0, 0.1)
    text = " ".join(script.reading(full).split())
    assert "does not change the draft beyond seed noise" in text
    full["orders"]["sorted"]["lossless"] = False
    assert "not lossless for sorted" in " ".join(script.reading(full).split())


def test_the_committed_figures_are_what_the_experiment_promises(saved):
    full = saved["full"]
    check_promises(full)
    lengths = full["data"]["prompt_lengths"]
    assert lengths[1] >= 10 * lengths[0]  # the decoded prompts span the lengths too
    assert all(n > 0 for n in full["prompt_strata"])
    strata = full["strata"]
    for name, row in full["orders"].items():
        assert row["lossless"], name
        for key in ("acceptance_length", "accuracy"):
            assert row[key]["n"] == len(full["config"]["seeds"])
            assert row[key]["half"] is not None
        assert set(row["strata_acceptance"]) == set(row["strata_accuracy"]) == set(strata)
        if name != "random":
            assert set(row["vs_random"]["strata_accuracy"]) == set(strata)
        if name != "sorted":
            assert "acceptance_length" in row["vs_sorted"]


def test_every_region_holds_what_the_script_renders(script, saved):
    stale = stale_regions(script, saved)
    assert not stale, (f"{stale} differ from benchmarks/ORDER_QUALITY_DFLASH.json; run python "
                       "benchmarks/order_quality_dflash.py --render")


def test_the_plot_is_committed(script):
    assert script.PLOT.is_file() and script.PLOT.stat().st_size > 0


def test_drift_in_the_check_run_is_reported(script, saved):
    def change(run):
        run["acceptance_length"] *= 1 + 10 * script.REL_TOL
        run["strata_accuracy"][-1] = (run["strata_accuracy"][-1] or 0.5) * 0.9
        run["real_tokens"] += 1

    drift = drift_after(script, saved["check"], change)
    assert any("acceptance_length" in line for line in drift)
    assert any("strata_accuracy[" in line for line in drift)
    assert any("real_tokens" in line for line in drift)


@pytest.mark.slow
def test_a_rerun_of_the_check_gives_the_committed_figures(script, saved, tmp_path):
    pytest.importorskip("torch")
    # the corpus and tokenizer from the default cache, the target trained afresh
    fresh = script.run(script.CHECK, tmp_path / "runs", 1, None, str(tmp_path / "target"))
    drift = script.compare(saved["check"], fresh)
    assert not drift, "\n".join(drift)
