"""The doctor on real training logs (``../shared/data/real_logs``; skipped when absent).

These logs are real runs, so the checks are about what is documented for them
(their README) and about the doctor behaving sanely, not about tuned numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lengthwise.doctor import diagnose

#: runs whose own configuration (README) says group_by_length is off or not used
NOT_LENGTH_GROUPED = (
    "hf_baize_tcm_qwen3_lora_9ep.jsonl",            # training_args: group_by_length=False
    "hf_stanford_alpaca_llama7b_fullft_3ep.jsonl",  # no GBL
    "hf_luojiu_llama2_7b_qlora_cpt_3ep.jsonl",      # GBL False
    "mng_llmc_gpt2_124m_10B.jsonl",                 # no length grouping
)

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real_logs"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data/real_logs not present")
LOGS = sorted(REAL.glob("*.jsonl")) if REAL.is_dir() else []


@pytest.fixture(scope="module")
def reports():
    return {p.name: diagnose(p) for p in LOGS}


def test_every_real_log_is_diagnosed(reports) -> None:
    assert len(reports) == 14
    for name, r in reports.items():
        d = json.loads(r.to_json())
        assert d["stable_region"]["start"] <= d["stable_region"]["end"], name
        assert r.input.malformed == 0 and r.input.restart_count == 0, name
        assert r.input.duplicate_rows == 0, name  # README: steps strictly increase
        assert r.stats.loss_roughness > 0, name
        assert r.verdict.summary, name


def test_lr_warmup_is_read_from_the_logged_lr(reports) -> None:
    # README: linear warm-up over steps 0..699, lr peaks at step 110 / 37 (3 % of 1218)
    assert reports["mng_llmc_gpt2_124m_10B.jsonl"].phases.warmup_source == "lr"
    assert 650 <= reports["mng_llmc_gpt2_124m_10B.jsonl"].phases.warmup_end <= 700
    assert reports["hf_nsllm_qwen3_8b_cpt.jsonl"].phases.warmup_end == 110
    assert 30 <= reports["hf_stanford_alpaca_llama7b_fullft_3ep.jsonl"].phases.warmup_end <= 40


def test_fp16_divergence_is_called_a_divergence(reports) -> None:
    r = reports["hf_alpaca_lora_llama7b_fp16_divergence.jsonl"]
    assert r.verdict.causes[0].name == "divergence"
    assert any(c.recovery_steps is None for c in r.cliffs)


def test_length_grouped_run_shows_a_cycle_not_bands(reports) -> None:
    # README: group_by_length=True, logged every 10 steps: "a sawtooth rather than bands"
    r = reports["hf_qlora_llama_icliniq_gbl_10k.jsonl"]
    assert r.periodicity.period is not None and r.periodicity.p_value < 1e-6
    assert r.bands.count == 1
    assert r.attribution.likely_cause is not None  # no bucket logged: says what to log


def test_same_data_order_gives_the_same_spikes(reports) -> None:
    # README: the SOAP run has the same model and data order as the Muon run
    muon = {c.step for c in reports["mng_muon_124m.jsonl"].cliffs}
    soap = {c.step for c in reports["mng_soap_124m.jsonl"].cliffs}
    assert len(muon) >= 5 and len(muon & soap) >= 0.5 * len(muon)


def test_runs_without_length_grouping_are_not_banded(reports) -> None:
    for name, r in reports.items():
        assert r.bands.count in (None, 1), name


def test_runs_without_length_grouping_are_not_blamed_on_it(reports) -> None:
    for name in NOT_LENGTH_GROUPED:
        causes = {c.name for c in reports[name].verdict.causes}
        assert "sorted_batches_cycle" not in causes, name


def test_every_cause_names_its_mechanism_or_says_unknown(reports) -> None:
    for name, r in reports.items():
        for c in r.verdict.causes:
            if c.name == "sorted_batches_cycle":
                assert any("matches Hugging Face" in e for e in c.evidence), name
            if c.name == "periodic_unknown":
                assert "unknown cause" in c.claim, name


def test_a_short_snippet_is_not_called_clean() -> None:
    r = diagnose(REAL / "issue_snippets" / "qlora_issue228_bqcao_snippet.jsonl")
    assert r.verdict.clean is None and r.verdict.summary.startswith("not tested")
