"""The new findings on two small real logs kept in tests/data/real_logs."""

from __future__ import annotations

from pathlib import Path

from lengthwise.doctor import diagnose

DATA = Path(__file__).resolve().parents[1] / "data" / "real_logs"


def test_a_real_run_whose_held_out_loss_rises_is_over_fitting() -> None:
    r = diagnose(DATA / "hf_whisper_lora_nam2ja_11k.trainer_state.json")
    e = r.eval_gap
    assert e.evals == 22 and e.widening and e.eval_rising and e.eval_min_step == 5500
    assert "eval_overfitting" in {c.name for c in r.verdict.causes}
    assert not r.grad_norm.rising and r.grad_norm.spikes == 0


def test_a_real_fp16_divergence_shows_a_gradient_norm_that_keeps_rising() -> None:
    r = diagnose(DATA / "hf_alpaca_lora_llama7b_fp16_divergence.jsonl")
    names = [c.name for c in r.verdict.causes]
    assert names[0] == "divergence" and "grad_norm_rising" in names
    assert r.grad_norm.rise > 100 and r.eval_gap.evals == 0
    assert r.step_time.note.startswith("not tested")
