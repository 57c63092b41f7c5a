"""The memory estimate of a DFlash training step: against measured peaks, and its parts."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _dflash_tiny import tiny_qwen3_config  # noqa: E402

from lengthwise.dflash.cost.device_memory import DEVICE_MEMORY  # noqa: E402
from lengthwise.dflash.cost.step_memory import estimate_step  # noqa: E402
from lengthwise.dflash.train_config import DFlashTrainConfig  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402

HERE = Path(__file__).resolve().parent

def _cfg(**kw: object) -> DFlashTrainConfig:
    base = dict(steps=1, max_tokens=256, max_len=256, block_size=4, num_anchors=16,
                draft_layers=1, grad_accum=1, head_chunk=32, device="cpu", progress=False)
    return DFlashTrainConfig(**{**base, **kw})


def _can_measure() -> bool:
    return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)


@pytest.mark.slow
@pytest.mark.skipif(not _can_measure(), reason="needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("index", [0, 1, 2], ids=["b8", "b16-accum2", "b4-rows2-vocab32k"])
def test_predicted_step_peak_is_within_15_percent_of_the_measured_one(index):
    """Traced under fake tensors vs the resident memory of the real step, one process each."""
    sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
    import memory_estimate

    assert len(memory_estimate.SHAPES) == 3
    got = memory_estimate.measure_in_subprocess(memory_estimate.SHAPES[index])
    assert got["measured"] > 0
    assert abs(got["predicted"] - got["measured"]) <= 0.15 * got["measured"], got


def test_parts_add_up_and_grow_with_the_slot_budget():
    t = tiny_qwen3_config()
    small = estimate_step(t, _cfg(max_slots=64))
    large = estimate_step(t, _cfg(max_slots=512))
    assert small.peak == sum(small.parts.values())
    assert small.slots == 64 and large.slots == 512
    assert large.parts["activations"] > small.parts["activations"]
    assert large.parts["weights"] == small.parts["weights"] > 0
    # AdamW: two fp32 moments per trainable parameter (and a step count each)
    assert small.parts["optimizer"] >= 2 * small.parts["gradients"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_cached_step_peaks_below_the_online_one_by_the_target_forward(device):
    """With the features read from a cache, the step runs no target forward: the target's
    weights stay, its activations go, and the micro-batch's features count instead."""
    t = tiny_qwen3_config()
    cfg = _cfg(max_tokens=1024, max_len=1024, max_slots=64, device=device)
    online, cached = estimate_step(t, cfg), estimate_step(t, cfg, cached=True)
    assert cached.parts["weights"] == online.parts["weights"]
    assert cached.parts["optimizer"] == online.parts["optimizer"]
    assert cached.peak < online.peak
    elt = 2 if device == "cuda" else 4  # the target's dtype: bf16 on CUDA, fp32 on CPU
    assert cached.settings["features_cached"] == 1024 * 32 * elt  # one layer of width 32
    assert online.settings["features_cached"] == 0
    assert "no target forward" in cached.render() and "no target" not in online.render()


def test_weights_are_the_target_in_bf16_and_the_draft_in_fp32_on_cuda():
    t = tiny_qwen3_config()
    est = estimate_step(t, _cfg(device="cuda", grad_accum=2))
    target = transformers.AutoModelForCausalLM.from_config(t)
    n_target = sum(p.numel() for p in target.parameters())
    # with a second micro-batch the first one's gradients are alive at the peak
    draft_bytes = est.parts["gradients"]
    assert draft_bytes > 0
    assert est.parts["weights"] >= 2 * n_target + draft_bytes
    assert est.settings["dtype"] == "bfloat16" and est.device == "cuda"


def test_world_adds_ddp_buckets_the_size_of_the_gradients():
    t = tiny_qwen3_config()
    one = estimate_step(t, _cfg(grad_accum=2))
    eight = estimate_step(t, _cfg(grad_accum=2), world=8)
    assert "ddp_buckets" not in one.parts
    assert eight.parts["ddp_buckets"] == one.parts["gradients"]
    assert eight.peak == one.peak + eight.parts["ddp_buckets"]


def test_head_chunk_bounds_the_logits_buffers():
    t = tiny_qwen3_config()
    small = estimate_step(t, _cfg(head_chunk=16, max_slots=256))
    large = estimate_step(t, _cfg(head_chunk=128, max_slots=256))
    assert 0 < small.logits_high < large.logits_high
    assert large.logits_high <= 4 * 128 * 512 * 4  # a few fp32 chunk x vocab buffers


def test_fits_leaves_a_reserve():
    est = estimate_step(tiny_qwen3_config(), _cfg())
    assert est.fits(est.peak + 2**30)
    assert not est.fits(est.peak + 2**30 - 1)
    assert est.fits(est.peak, reserve=0)


def test_the_context_is_converted_to_the_autocast_dtype_once_with_unchanged_outputs(
        monkeypatch):
    """K and V read one bf16 copy of ``[context | block]``; the outputs are the same bits."""
    import lengthwise.dflash.model as model_mod
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    cfg = DFlashConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=64, num_features=2, block_size=4, mask_token_id=3)
    torch.manual_seed(0)
    draft = DFlashDraft(cfg)
    feats, block = torch.randn(1, 6, 64), torch.randn(1, 4, 32)
    pos, mask = torch.arange(10).unsqueeze(0), torch.ones(1, 4, 10, dtype=torch.bool)

    def run() -> tuple[torch.Tensor, int]:
        seen = []

        class Casts(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == (
                        1, 10, 32) and (kwargs or {}).get("dtype") == torch.bfloat16:
                    seen.append(func)
                return func(*args, **(kwargs or {}))

        with Casts(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = draft(feats, block, pos, mask)
        return out, len(seen)

    once, n_once = run()
    monkeypatch.setattr(model_mod, "_autocast_once", lambda x: x)  # each projection casts
    twice, n_twice = run()
    assert (n_once, n_twice) == (cfg.num_layers, 2 * cfg.num_layers)
    assert torch.equal(once, twice)


def test_the_head_traces_three_of_its_chunks_with_the_peak_of_all_of_them(monkeypatch):
    """Every LM-head chunk holds the same buffers: the trace runs the first two and the
    last one, whatever the slots, and predicts what the trace of every chunk predicts."""
    import lengthwise.dflash.cost.trace as trace
    import lengthwise.dflash.head as head

    calls = []
    logits = head._logits
    monkeypatch.setattr(head, "_logits", lambda *a: calls.append(1) or logits(*a))
    cfg = _cfg(max_tokens=4096, max_len=4096, max_slots=4096, head_chunk=16)
    few = estimate_step(tiny_qwen3_config(), cfg)
    assert len(calls) == 2 * 3  # the forward's chunks and the backward's
    monkeypatch.setattr(trace, "_chunks_kept", lambda n, chunk: range(0, n, chunk))
    every = estimate_step(tiny_qwen3_config(), cfg)
    assert len(calls) > 2 * 3 * 50
    assert (few.peak, few.parts, few.logits_high) == (every.peak, every.parts,
                                                      every.logits_high)


@settings(max_examples=4, deadline=None)
@given(chunk=st.integers(1, 40), slots=st.integers(4, 300), accum=st.integers(1, 2))
def test_the_peak_does_not_depend_on_how_many_head_chunks_are_traced(chunk, slots, accum):
    import lengthwise.dflash.cost.trace as trace

    cfg = _cfg(head_chunk=chunk, max_slots=max(4, slots), grad_accum=accum)
    few = estimate_step(tiny_qwen3_config(), cfg)
    saved = trace._chunks_kept
    trace._chunks_kept = lambda n, c: range(0, n, c)
    try:
        every = estimate_step(tiny_qwen3_config(), cfg)
    finally:
        trace._chunks_kept = saved
    assert (few.peak, few.parts, few.logits_high) == (every.peak, every.parts,
                                                      every.logits_high)


def test_a_billion_tokens_is_estimated_and_more_is_refused_by_name():
    """A million LM-head chunks traced as three: the answer comes; beyond what torch can
    count (the target's tokens x tokens mask), the limit is named."""
    big = estimate_step(tiny_qwen3_config(), _cfg(max_tokens=10**9, max_slots=10**9))
    assert big.tokens == 10**9 and big.slots == 10**9 and not big.fits(DEVICE_MEMORY["h200"])
    for kw, message in (
            ({"max_tokens": 10**9 + 1}, "max_tokens 1,000,000,001 is more tokens than the "
                                        "estimate traces (at most 1,000,000,000)"),
            ({"max_tokens": 10**9, "max_slots": None},
             "block_size 4 x max_tokens 1,000,000,000 (no max_slots): 3,999,999,984 draft slots "
             "are more than the estimate traces"),
            ({"draft_layers": 257, "num_features": 1},
             "draft_layers 257 is more layers than the estimate traces (at most 256)")):
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            estimate_step(tiny_qwen3_config(), _cfg(**kw))
    deep = transformers.Qwen3Config(**{**tiny_qwen3_config().to_dict(), "num_hidden_layers": 257,
                                       "layer_types": None})
    with pytest.raises(ConfigError, match="^num_hidden_layers 257 is more layers"):
        estimate_step(deep, _cfg())
