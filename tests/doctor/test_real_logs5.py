"""The doctor on seven more real runs (``../shared/data/real_logs5``; skipped when absent).

Labels come from each run's own configuration (``labels.json`` there); the checks
are what those configurations settle, not tuned numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lengthwise.doctor import diagnose

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real_logs5"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data/real_logs5 not present")
NANOGPT = "buildnanogpt_gpt2_124m_{}.jsonl"


@pytest.mark.parametrize("run", ["halfdata_2ep_ddp4_19k", "nowarmup_ddp4_19k",
                                 "fineweb_3ep_ddp8_56k"])
def test_a_fixed_data_order_shows_its_fractional_cycle_not_epochs(run: str) -> None:
    r = diagnose(REAL / NANOGPT.format(run))
    per = r.periodicity
    assert per.period is not None and abs(per.period - 46.6) < 0.5
    assert per.period_error is not None and abs(per.period - 46.6) < 4 * per.period_error + 0.1
    assert not r.epochs.found and "epoch_boundaries" not in {c.name for c in r.verdict.causes}


def test_restarts_in_separate_run_folders_and_a_loss_that_does_not_move() -> None:
    r = diagnose(REAL / "tb_alpacalora_luganda_restarts_runs")
    assert r.input.restart_count == 2 and r.input.duplicate_rows == 0
    assert r.verdict.causes[0].name == "not_learning"
    assert r.verdict.causes[0].claim.startswith("the loss has not moved since step 10")
