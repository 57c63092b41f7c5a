"""``dflash eval``'s stage: the teacher-forced pass in bounded forwards, its optional passes."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from _dflash_tiny import tiny_draft, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.errors import ConfigError

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
    from lengthwise.dflash.teacher_forced import teacher_forced

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


@pytest.fixture(scope="module")
def exact():
    """Float64 models: batched differently, the same text gets the same top-1 to the bit."""
    target = tiny_target(seed=5)
    target.model.double()
    return target, tiny_draft(target, block_size=4).double()


class Forwards:
    """Tokens of every target forward and block slots of every draft forward, while on."""

    def __init__(self, target, draft) -> None:
        self.on, self.tokens, self.slots = False, [], []

        def base(module, args, kwargs):
            if self.on:
                self.tokens.append(int(kwargs["input_ids"].numel()))

        def head(module, args):
            if self.on:
                self.slots.append(int(args[1].shape[0] * args[1].shape[1]))  # block embeds

        self.hooks = [target.base.register_forward_pre_hook(base, with_kwargs=True),
                      draft.register_forward_pre_hook(head)]

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=7),
       max_tokens=st.integers(8, 64), max_slots=st.integers(4, 64))
def test_teacher_forced_pass_keeps_the_training_budgets(exact, lengths, max_tokens, max_slots):
    """No target forward holds more than max_tokens tokens, no draft forward more than
    max_slots slots; the figures are the unbudgeted pass's on the texts cut to max_tokens."""
    from lengthwise.dflash.teacher_forced import teacher_forced

    target, draft = exact
    g = torch.Generator().manual_seed(sum(lengths) + max_tokens)
    prompts = [torch.randint(0, 39, (3,), generator=g).tolist() for _ in lengths]
    outs = [torch.randint(0, 39, (n,), generator=g).tolist() for n in lengths]
    seen = Forwards(target, draft)
    seen.on = True
    try:
        kept = teacher_forced(draft, target, prompts, outs, max_tokens=max_tokens,
                              max_slots=max_slots)
    finally:
        seen.close()
    assert seen.tokens and max(seen.tokens) <= max_tokens
    assert seen.slots and max(seen.slots) <= max_slots
    cut = [o[: max(0, max_tokens - len(p))] for p, o in zip(prompts, outs, strict=True)]
    free = teacher_forced(draft, target, prompts, cut, slots_per_forward=None)
    assert kept.accuracy == free.accuracy or math.isnan(free.accuracy)
    assert kept.slot_accuracy == pytest.approx(free.slot_accuracy, nan_ok=True, abs=0)
    assert kept.loss == pytest.approx(free.loss, rel=1e-6, nan_ok=True)


def test_eval_stage_passes_the_budgets_to_its_accuracy_pass(exact, monkeypatch):
    """evaluate_set's teacher-forced pass within max_tokens and max_slots, the same figures as
    without them (no text is cut); budgets that hold no block or token are refused before
    decoding."""
    import lengthwise.dflash.teacher_forced as teacher_forced
    from lengthwise.dflash.evaluate import evaluate_set

    target, draft = exact
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    seen = Forwards(target, draft)
    inner = teacher_forced.evaluate_blocks

    def counted(*args, **kwargs):  # only the accuracy pass, not the decoding
        seen.on = True
        try:
            return inner(*args, **kwargs)
        finally:
            seen.on = False

    monkeypatch.setattr(teacher_forced, "evaluate_blocks", counted)
    run = dict(name="p", temperatures=[0.0], max_new_tokens=6, check=False)
    try:
        free, = evaluate_set(draft, target, prompts, **run)
        big = (max(seen.tokens), max(seen.slots))
        seen.tokens.clear(), seen.slots.clear()
        kept, = evaluate_set(draft, target, prompts, max_tokens=12, max_slots=8, **run)
    finally:
        seen.close()
    assert big[0] > 12 and big[1] > 8  # the budgets below bind
    assert max(seen.tokens) <= 12 and max(seen.slots) <= 8
    assert kept == free
    with pytest.raises(ConfigError, match="max_slots=3 holds no block of block_size=4"):
        evaluate_set(draft, target, prompts, max_slots=3, **run)
    with pytest.raises(ConfigError, match="max_tokens must be >= 1, got 0"):
        evaluate_set(draft, target, prompts, max_tokens=0, **run)


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
    from lengthwise.dflash.teacher_forced import teacher_forced

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
