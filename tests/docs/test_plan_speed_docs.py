"""The planner's speed figures in docs/planner.md are what benchmarks/plan_speed.py wrote."""

from __future__ import annotations

import json

from _scripts import ROOT, load_script, stale_regions


def test_the_docs_quote_the_saved_speed_figures():
    script = load_script("plan_speed")
    saved = json.loads((ROOT / "benchmarks" / "PLAN_SPEED.json").read_text())
    stale = stale_regions(script, saved)
    assert not stale, (f"{stale} differ from benchmarks/PLAN_SPEED.json; run python "
                       "benchmarks/plan_speed.py --render")
    results = (ROOT / "benchmarks" / "PLAN_SPEED_RESULTS.md").read_text()
    for name, value in saved["ratios"].items():  # the same run as the results table
        assert f"| {name} | {value:.2f} |" in results, name
