"""The DFlash recipe end to end, as a user runs it: prepare, train (torchrun), export, eval.

A tiny Qwen3-shaped target saved to a local folder and a chat JSONL go through
``lengthwise dflash prepare``, ``lengthwise dflash train`` under a 2-process
gloo torchrun, ``lengthwise dflash export`` and ``lengthwise dflash eval``, each
a subprocess; the reference ``dflash`` package then loads the exported draft and
reproduces the trained draft's logits and our speculative decoding exactly (that
test alone skips where the package is not installed).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _chat_tiny import conversations, save_target, write_jsonl
from _cli import lengthwise
from _reference import reference, reference_decode, reference_decoder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _summary(stdout: str) -> dict:
    """The JSON summary ``dflash train`` prints last."""
    return json.loads(stdout[stdout.index("{"):])


def _table(stdout: str) -> list[dict[str, str]]:
    """``dflash eval``'s table as rows keyed by its header."""
    lines = [line for line in stdout.splitlines() if " | " in line]
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("set | ")):]
    head = [h.strip() for h in lines[0].split(" | ")]
    return [dict(zip(head, (c.strip() for c in line.split(" | ")), strict=True))
            for line in lines[1:]]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """A target, its chats prepared, a draft trained under torchrun and exported: the folders."""
    from lengthwise.dflash.prepared import open_prepared

    tmp_path = tmp_path_factory.mktemp("recipe")
    target_dir = save_target(tmp_path / "target")
    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(40))
    prepared, run, exported = tmp_path / "prepared", tmp_path / "run", tmp_path / "exported"
    said = {"prepare": lengthwise("dflash", "prepare", str(chats), "--target", str(target_dir),
                                  "--out", str(prepared), "--min-supervised", "16",
                                  "--no-progress")}
    said["train"] = lengthwise(
        "dflash", "train", "--target", str(target_dir), "--data", str(prepared), "--out",
        str(run), "--steps", "4", "--max-tokens", "256", "--grad-accum", "2",
        "--draft-layers", "1", "--block-size", "4", "--num-anchors", "6", "--eval-samples",
        "4", "--eval-every", "2", "--checkpoint-every", "2", "--lr", "1e-2", "--no-progress",
        nproc=2)
    said["export"] = lengthwise("dflash", "export", str(run), str(exported), "--target",
                                str(run / "target"))
    return {"target": target_dir, "data": open_prepared(prepared), "run": run,
            "exported": exported, "said": said}


@pytest.mark.slow
def test_prepare_train_export_eval(recipe):
    from lengthwise.dflash.chat import bundled_prompts, read_prompt_file

    data, run, exported, said = (recipe[k] for k in ("data", "run", "exported", "said"))
    assert f"{len(data)} of 40 conversations kept" in said["prepare"] and len(data) >= 30
    summary = _summary(said["train"])
    assert summary["steps"] == 4 and summary["eval"]["step"] == 4
    assert summary["train_samples"] + summary["eval_samples"] == len(data)
    # the tiny tokenizer has no mask token: <|MASK|> is added and the target grown by a row
    mask = len(transformers.AutoTokenizer.from_pretrained(str(recipe["target"])))
    serve = run / "target"
    assert summary["target"] == str(serve) and summary["mask_token_id"] == mask

    assert f"block 4, mask token {mask}" in said["export"]
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"]["mask_token_id"] == mask
    assert config["vocab_size"] == mask + 1 and config["num_target_layers"] == 4

    rows = _table(lengthwise("dflash", "eval", "--target", str(serve), "--draft",
                             str(exported), "--max-new-tokens", "16"))
    shipped = len(read_prompt_file(bundled_prompts()))
    assert [(r["set"], r["T"], r["prompts"]) for r in rows] == [
        ("dflash_prompts", "0", str(shipped)), ("dflash_prompts", "1", str(shipped))]
    for r in rows:  # the mean over prompts, then its 95 % interval: "1.00 [1.00, 1.00]"
        mean, low, high = (float(x) for x in r["acceptance length"].replace("[", "").replace(
            "]", "").replace(",", "").split())
        assert 1.0 <= mean <= 4.0 and low <= mean <= high
    assert rows[0]["lossless"] == "yes" and rows[1]["lossless"] == "-"


@pytest.mark.slow
def test_the_reference_package_agrees_with_the_trained_draft(recipe, monkeypatch):
    dmodel = reference_decoder(monkeypatch)
    from lengthwise.dflash.chat import bundled_prompts, read_prompt_file, render_prompts
    from lengthwise.dflash.load import load_draft
    from lengthwise.dflash.loss import block_inputs
    from lengthwise.dflash.speculative import speculative_batch
    from lengthwise.dflash.target import Target, load_target

    data, run, exported = recipe["data"], recipe["run"], recipe["exported"]
    serve = run / "target"
    # the reference package loads every exported weight ...
    ref, info = reference(exported)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ours = load_draft(run)  # the run's final draft (step 4)
    final = torch.load(run / "final" / "draft.pt")
    assert all(torch.equal(v, final[k]) for k, v in ours.state_dict().items())
    target = Target(load_target(serve).eval(), layers=ours.config.target_layers)
    assert ref.target_layer_ids == ours.config.target_layers

    # ... reproduces the trained draft's logits on a prepared sample ...
    ids = torch.as_tensor(np.asarray(data.sample(0)["input_ids"][:24]))[None]
    _, feats = target.forward(ids)
    a, b = 18, 4  # context 0..17, the block 18..21
    embeds = block_inputs(ours, target, ids, torch.full((1, 1), a), b)
    positions = torch.arange(a + b)[None]
    with torch.no_grad():
        mine = ours(feats[:, :a], embeds, positions, torch.ones(1, b, a + b, dtype=torch.bool))
        theirs = ref(position_ids=positions, noise_embedding=embeds, target_hidden=feats[:, :a])
    torch.testing.assert_close(theirs, mine, rtol=0, atol=1e-5)
    torch.testing.assert_close(ref.compute_logits(theirs, target.model.lm_head),
                               target.model.lm_head(mine), rtol=0, atol=1e-5)

    # ... and decodes the shipped prompts to our tokens with our acceptance lengths
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(serve))
    prompts = render_prompts(read_prompt_file(bundled_prompts())[:2], tokenizer, thinking=False)
    for prompt in prompts:
        spec = speculative_batch(ours, target, [prompt], max_new_tokens=16)[0]
        assert reference_decode(dmodel, ref, target.model, prompt, 16) == (spec.tokens,
                                                                            spec.accepted)
