"""benchmarks/dflash_rank_balance.py: the ranks' whole DFlash step, measured and quoted."""

from __future__ import annotations

import pytest
from _scripts import ROOT, script_fixtures, stale_regions

script, saved = script_fixtures("dflash_rank_balance")


@pytest.fixture(scope="module")
def reduced(script):
    return script.run(reference_n=20_000)


def test_the_docs_and_the_results_quote_the_saved_figures(script, saved):
    stale = stale_regions(script, saved)
    assert not stale, (f"{stale} differ from benchmarks/DFLASH_BALANCE.json; run python "
                       "benchmarks/dflash_rank_balance.py --render")
    results = (ROOT / "benchmarks" / "DFLASH_BALANCE_RESULTS.md").read_text(encoding="utf-8")
    assert script.table(saved) in results


def test_a_reduced_run_gives_every_figure_of_every_plan(script, reduced):
    assert set(reduced["sets"]) == {"sft_mix", "reference"}
    for s in reduced["sets"].values():
        assert set(s["ranks"]) == {"8", "64"}
        for plans in s["ranks"].values():
            assert tuple(plans) == script.PLANS
            for fig in plans.values():
                assert set(fig) == set(script.FIGURES)
                assert 0.9 < fig["padding_efficiency"] <= 1.0
                assert 0.85 < fig["budget_fill"] <= 1.0
                assert 1.0 <= fig["step_p50"] <= fig["step_p99"]
                assert fig["tokens_p99"] >= 1.0
            assert plans["tokens"]["slowest_rank"] == 1.0


def test_the_bundled_lengths_give_the_saved_figures_at_any_reference_size(saved, reduced):
    # sft_mix is measured whole in both runs: its figures are the same to the last digit
    assert reduced["sets"]["sft_mix"] == saved["sets"]["sft_mix"]


def test_the_default_plan_keeps_the_mix_and_its_whole_step_is_what_the_docs_say(reduced):
    for s in reduced["sets"].values():
        for plans in s["ranks"].values():
            # the stratified plans keep the length mix; steps of one level give it up
            assert plans["tokens"]["step_cv_ratio"] < 0.5
            assert plans["step cost"]["step_cv_ratio"] < 0.5
            assert plans["step cost, level"]["step_cv_ratio"] > 1.0
    sft = reduced["sets"]["sft_mix"]["ranks"]
    for w in ("8", "64"):  # above the mark on sft_mix's long tail, with or without the cost
        level = sft[w]["step cost, level"]
        assert level["step_p99"] < 1.11 and level["slowest_rank"] < 0.95
        assert sft[w]["tokens"]["step_p99"] > 1.15
        assert sft[w]["step cost"]["step_p99"] > 1.15
        assert abs(sft[w]["step cost"]["slowest_rank"] - 1.0) < 0.01
