"""``dflash eval``'s stage: the teacher-forced pass in bounded forwards, its optional passes."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from _dflash_tiny import tiny_draft, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def models():
    target = tiny_target(seed=3)
    return target, tiny_draft(target, block_size=4)


@settings(max_examples=12, deadline=None)
@given(slots=st.integers(1, 300), lengths=st.lists(st.integers(3, 24), min_size=1, max_size=5),
       batch=st.integers(1, 4))
def test_bounded_forwards_give_the_figures_of_one_forward(models, slots, lengths, batch):
    from lengthwise.dflash.evaluate import teacher_forced

    target, draft = models
    g = torch.Generator().manual_seed(sum(lengths))
    prompts = [torch.randint(0, 39, (3,), generator=g).tolist() for _ in lengths]
    outs = [torch.randint(0, 39, (n,), generator=g).tolist() for n in lengths]
    one = teacher_forced(draft, target, prompts, outs, batch_size=batch, slots_per_forward=None)
    parts = teacher_forced(draft, target, prompts, outs, batch_size=batch,
                           slots_per_forward=slots)
    assert parts.accuracy == one.accuracy
    assert parts.slot_accuracy == pytest.approx(one.slot_accuracy, nan_ok=True, abs=0)
    assert math.isclose(parts.loss, one.loss, rel_tol=1e-5)


def test_the_check_and_the_accuracy_pass_are_optional(models):
    from lengthwise.dflash.evaluate import evaluate_set

    target, draft = models
    prompts = [[1, 2, 3], [4, 5]]
    full, = evaluate_set(draft, target, prompts, name="p", temperatures=[0.0], max_new_tokens=5)
    assert full["mismatches"] == 0 and 0.0 <= full["draft_accuracy"] <= 1.0
    bare, = evaluate_set(draft, target, prompts, name="p", temperatures=[0.0], max_new_tokens=5,
                         check=False, accuracy=False)
    assert not {"mismatches", "draft_accuracy", "slot_accuracy"} & set(bare)
    assert bare["acceptance_length"] == full["acceptance_length"]


def test_eval_speed_benchmark_writes_its_table(tmp_path):
    spec = importlib.util.spec_from_file_location("eval_speed", BENCH / "eval_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "EVAL.md"
    assert bench.main(["--prompts", "2", "--max-new-tokens", "4", "--repeats", "1",
                       "--out", str(out)]) == 0
    text = " ".join(out.read_text().split())
    assert "--max-new-tokens 4 --threads 1 --repeats 1`" in text
    assert "each time is the fastest of 1 runs" in text
    assert "| target greedy generate, one prompt at a time |" in text
    assert "dflash eval --no-check --no-accuracy" in text and "same accuracy: True" in text


def test_counts_pool_the_figures_of_parts_into_those_of_the_whole(models):
    # accuracy per length stratum and overall from one pass per stratum: the counts weight them
    from lengthwise.dflash.evaluate import teacher_forced

    target, draft = models
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 39, (3,), generator=g).tolist() for _ in range(6)]
    outs = [torch.randint(0, 39, (n,), generator=g).tolist() for n in (2, 4, 7, 11, 16, 20)]
    whole = teacher_forced(draft, target, prompts, outs)
    parts = [teacher_forced(draft, target, prompts[i:i + 3], outs[i:i + 3]) for i in (0, 3)]
    assert whole.count == sum(p.count for p in parts) > 0
    assert math.isclose(sum(p.accuracy * p.count for p in parts) / whole.count, whole.accuracy,
                        rel_tol=1e-12)
    assert math.isclose(sum(p.loss * p.weight for p in parts) / whole.weight, whole.loss,
                        rel_tol=1e-5)
