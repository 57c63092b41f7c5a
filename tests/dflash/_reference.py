"""The reference ``dflash`` package (``pip install --no-deps dflash==0.1.0``) on our exports."""

from __future__ import annotations

import importlib.util
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def reference_module(name: str = "dflash"):
    """A module of the reference package; the test is skipped when the package is not installed.

    ``pytest.importorskip("dflash")`` does not skip then: ``import dflash`` finds this test
    folder (``tests/dflash``, a namespace package, with no origin file) instead.
    """
    spec = importlib.util.find_spec("dflash")
    if spec is None or spec.origin is None:
        pytest.skip("the reference dflash package is not installed "
                    "(pip install --no-deps dflash==0.1.0)")
    return pytest.importorskip(name)


def reference(folder):
    """The reference package's draft loaded from an exported folder (fp32), and its load info."""
    dflash = reference_module()
    model, info = dflash.DFlashDraftModel.from_pretrained(str(folder), output_loading_info=True,
                                                          dtype=torch.float32)
    return model.eval(), info


def reference_decoder(monkeypatch):
    """The reference decoding module, its CUDA-only timing made to run on the CPU."""
    dmodel = reference_module("dflash.model")
    if not hasattr(transformers.DynamicCache, "activate_past_recording"):
        pytest.skip("the reference decoder needs transformers >= 5 (activate_past_recording)")
    monkeypatch.setattr(dmodel, "_cuda_time", time.perf_counter)  # its stats time CUDA only
    return dmodel


def reference_decode(dmodel, ref, target_model, prompt, max_new_tokens):
    """Reference greedy speculative decoding of ``prompt``: (new tokens, acceptance lengths)."""
    ids = torch.tensor([list(prompt)])
    out = ref.spec_generate(target_model, ids, max_new_tokens=max_new_tokens, stop_token_ids=None)
    stats = dmodel.dflash_generate(ref, target_model, ids, max_new_tokens, None,
                                   return_stats=True)
    return out[0, len(prompt):].tolist(), stats.acceptance_lengths
