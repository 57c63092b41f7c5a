"""benchmarks/reference_trainer.py: the batches it gives SpecForge, and the weight mapping.

The mapping test needs a SpecForge checkout (``SPECFORGE_DIR``); it is skipped without one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import reference_trainer as rt  # noqa: E402
from _dflash_tiny import qwen3_pair  # noqa: E402

from lengthwise.pytorch.collate import PadCollator  # noqa: E402

SAMPLES = [{"input_ids": [5, 6, 7, 8, 9, 10], "labels": [-100, -100, 7, 8, 9, 10]},
           {"input_ids": [11, 12, 13, 14], "labels": [-100, 12, 13, -100]}]


def test_the_reference_batch_supervises_the_labelled_tokens_only():
    batch = PadCollator(pad_token_id=0, pad_multiple=1)(SAMPLES)
    feats = torch.randn(2, 6, 8, dtype=torch.float16)
    rb = rt.reference_batch(batch, feats)
    assert rb["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]]
    assert rb["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert rb["hidden_states"].dtype == torch.float32
    assert torch.equal(rb["hidden_states"], feats.float())
    with pytest.raises(ValueError, match="do not match the rows"):
        rt.reference_batch(batch, feats[:, :5])
    packed = {k: v for k, v in batch.items() if k != "attention_mask"}
    with pytest.raises(ValueError, match="padded rows"):
        rt.reference_batch(packed, feats)


def test_the_curve_ends_at_the_last_step():
    assert rt.curve_steps(80) == [20, 40, 80]
    assert rt.curve_steps(2) == [1, 2]


@pytest.mark.skipif(not os.environ.get("SPECFORGE_DIR"),
                    reason="needs a SpecForge checkout in SPECFORGE_DIR")
def test_reference_weights_in_our_draft_give_the_reference_loss(tmp_path):
    sf = rt._specforge(os.environ["SPECFORGE_DIR"])
    target, draft = qwen3_pair(vocab=64, block_size=4)
    dcfg = draft.config
    dcfg.target_vocab_size = 64
    torch.manual_seed(0)
    ref = sf["draft"](rt.reference_config(dcfg)).float()
    online = sf["online"](draft_model=ref, target_lm_head=target.lm_head,
                          target_embed_tokens=target.embed, mask_token_id=dcfg.mask_token_id,
                          block_size=4, attention_backend="eager", num_anchors=3,
                          loss_decay_gamma=dcfg.gamma, loss_type="dflash")
    samples = [{"input_ids": [3 + (7 * i + k) % 50 for k in range(12)],
                "labels": [-100] * 3 + [3 + (7 * i + k) % 50 for k in range(3, 12)]}
               for i in range(2)]
    batch = PadCollator(pad_token_id=0, pad_multiple=1)(samples)
    with torch.no_grad():
        feats = target.features(batch["input_ids"], attention_mask=batch["attention_mask"])
    check = rt.mapping_check(online, ref, dcfg, target, batch, [[0], [1]], feats, seed=0,
                             folder=tmp_path / "mapped")
    assert check["abs_loss_difference"] < 1e-4
    assert check["reference_accuracy"] == pytest.approx(check["lengthwise_accuracy"])


@pytest.mark.skipif(not rt.JSON_PATH.is_file(), reason="no committed figures")
def test_committed_results_are_the_render_of_the_committed_figures():
    import json

    saved = json.loads(rt.JSON_PATH.read_text(encoding="utf-8"))
    assert rt.MD_PATH.read_text(encoding="utf-8") == rt.render_md(saved)
    for runs in saved["runs"].values():
        assert runs["lengthwise"]["same_batches"] and runs["lengthwise"]["same_lr"]
        assert runs["reference"]["mapping_check"]["abs_loss_difference"] < 1e-4
