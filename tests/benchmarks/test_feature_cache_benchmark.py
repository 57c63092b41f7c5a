"""benchmarks/feature_cache.py: its whole run on a tiny target, and its committed results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import feature_cache  # noqa: E402


def test_the_run_measures_every_figure_on_a_tiny_target(tiny_prepared, tmp_path):
    target, prepared = tiny_prepared
    res = feature_cache.run(prepared, target, tmp_path, micro_batches=2, steps=2,
                            eval_samples=4, repeats=1)
    p, st, q = res["pass"], res["step"], res["quality"]
    assert p["measured_bytes"] >= p["predicted_bytes"] > 0  # the .npy headers and records
    assert p["measured_bytes"] - p["predicted_bytes"] < 16_384
    assert set(st["median_seconds"]) == {"online", "cached", "draft_only", "draft_layers",
                                         "lm_head"}
    assert 0 < st["cached_over_online_step"] and 0 < st["lm_head_share_of_draft_only"] < 1
    # float16 features against the target's own: the same draft to rounding
    diff = q["heldout_loss_cached_minus_online"]
    assert abs(diff["mean"]) < 1e-2 and q["heldout_loss"]["online"]["n"] == 4
    text = feature_cache.render_md(res)
    assert "cached_over_online_step" in text


@pytest.mark.skipif(not feature_cache.SAVED.is_file(), reason="no committed figures")
def test_committed_results_are_the_render_of_the_committed_figures():
    saved = json.loads(feature_cache.SAVED.read_text(encoding="utf-8"))
    assert feature_cache.RESULTS_MD.read_text(encoding="utf-8") == feature_cache.render_md(saved)
