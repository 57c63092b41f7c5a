"""The recipe on an instruct target shaped like SmolLM2: a Llama with tied embeddings saved in
bfloat16 and a ChatML template that injects a default system prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
from _chat_tiny import save_instruct_target

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return save_instruct_target(tmp_path_factory.mktemp("instruct") / "target")


def test_a_bfloat16_checkpoint_runs_in_float32_on_cpu_unless_told(instruct):
    from lengthwise.dflash.target import load_target

    assert load_target(instruct).dtype == torch.float32
    assert load_target(instruct, dtype="bfloat16").dtype == torch.bfloat16


def test_regeneration_loads_the_target_in_the_dtype_asked(instruct):
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.regenerate import TurnGenerator
    from lengthwise.dflash.target import load_tokenizer

    renderer = ChatRenderer(load_tokenizer(instruct))
    for dtype, want in ((None, torch.float32), ("bfloat16", torch.bfloat16)):
        cfg = PrepareConfig(regenerate=True, dtype=dtype, progress=False)
        assert TurnGenerator(instruct, renderer, cfg).model.dtype == want


def _learned(renderer, conv):
    r = renderer.render(conv)
    tok = renderer.tokenizer
    runs, run = [], []
    for t, m in zip(r.input_ids, r.loss_mask, strict=True):
        if m:
            run.append(t)
        elif run:
            runs.append(tok.decode(run))
            run = []
    return runs + ([tok.decode(run)] if run else [])


def test_an_opening_assistant_turn_learns_its_content_not_the_injected_system_prompt(instruct):
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.target import load_tokenizer

    renderer = ChatRenderer(load_tokenizer(instruct))
    conv = [{"role": "assistant", "content": "hello there"},
            {"role": "user", "content": "the cat"},
            {"role": "assistant", "content": "sat on a mat"}]
    assert "You are a helpful assistant" in renderer.text(conv)
    assert _learned(renderer, conv) == ["hello there<|im_end|>", "sat on a mat<|im_end|>"]


@pytest.fixture(scope="module")
def long_prompts(instruct, tmp_path_factory):
    """Prepared chats, a third of them a long user turn before a short reply."""
    from _chat_tiny import conversations, texts, write_jsonl

    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    rows = conversations(24)
    for i, row in enumerate(rows):
        if i % 3 == 0:
            row["messages"] = [{"role": "user", "content": " ".join(texts(8, seed=i))},
                               {"role": "assistant", "content": "the cat sat on a mat"}]
    root = tmp_path_factory.mktemp("long_prompts")
    prepare_chats(write_jsonl(root / "chats.jsonl", rows), instruct, root / "prepared",
                  PrepareConfig(min_supervised=4, progress=False))
    return root / "prepared"


def test_samples_cut_before_any_supervision_are_dropped_and_counted(instruct, long_prompts,
                                                                    tmp_path, capsys):
    import json

    import numpy as np

    from lengthwise.cli import main
    from lengthwise.dflash.prepared import open_prepared

    data = open_prepared(long_prompts)
    every = np.arange(len(data))
    lost = data.unlearnable_when_cut(every, 96)
    first = [data[int(i)]["loss_mask"].index(1) for i in every]
    assert lost.tolist() == [f >= 95 for f in first] and 0 < lost.sum() < len(data)
    args = ["dflash", "train", "--target", str(instruct), "--data", str(long_prompts), "--out",
            str(tmp_path / "run"), "--steps", "1", "--max-tokens", "256", "--max-len", "96",
            "--draft-layers", "1", "--block-size", "4", "--num-anchors", "4",
            "--eval-samples", "2", "--checkpoint-every", "0", "--eval-every", "0",
            "--no-progress"]
    assert main(args) == 0
    said = capsys.readouterr()
    summary = json.loads(said.out)
    dropped = summary["dropped_unsupervised_after_truncation"]
    assert dropped > 0 and summary["train_samples"] == len(data) - 2 - dropped
    assert (f"{dropped} dropped: no supervised tokens left after truncation to max_len 96"
            in said.err)
    assert main([*args[:-1], "--max-len", "8", "--overwrite", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-len 8 is too small for two supervised tokens" in err[0]
    assert "give --max-len" in err[0]  # with the least value that keeps a sample trainable


def test_regenerated_turns_keep_the_targets_ids_and_no_end_of_turn_after_a_cut(
        instruct, tmp_path, monkeypatch):
    from _chat_tiny import write_jsonl

    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.target import load_tokenizer

    tok = load_tokenizer(instruct)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    # turn 1 is cut inside "é" (its first byte alone), turn 2 ends with the end-of-turn token
    first = tok.encode("the cat", add_special_tokens=False) + [tok.convert_tokens_to_ids("Ã")]
    second = tok.encode("sat on a mat", add_special_tokens=False) + [end]
    assert "\ufffd" in tok.decode(first) and tok.encode(tok.decode(first)) != first
    written = iter([first, second])
    _fake_target(monkeypatch, lambda ids: next(written))
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
            {"role": "user", "content": "and then"}, {"role": "assistant", "content": "old"}]
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": chat}])
    rec = prepare_chats(src, instruct, tmp_path / "p",
                        PrepareConfig(regenerate=True, min_supervised=2, progress=False))
    assert rec["counts"]["regenerated_turns"] == 2 and rec["counts"]["unfinished_turns"] == 1
    row = open_prepared(tmp_path / "p")[0]
    ids, mask = row["input_ids"], row["loss_mask"]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == first + second
    at = ids.index(first[-1])  # after the cut: the template's end of turn, not learned
    assert ids[at + 1] == end and mask[at + 1] == 0 and ids[-1] == end and mask[-1] == 1
    assert not list((tmp_path / "p").glob("regenerated-*"))


def _fake_target(monkeypatch, answer, *, stop_after=None):
    """The target's decode loop replaced: each conversation's turns written one after another
    by ``answer(prompt)``; after ``stop_after`` turns a Ctrl-C. Returns the prompts asked."""
    from lengthwise.dflash import generate, regenerate

    asked = []

    def decode(model, conversations, prompt, **kw):
        for c in conversations:
            ids = prompt(c, None)
            while ids is not None:
                if stop_after is not None and len(asked) == stop_after:
                    raise KeyboardInterrupt
                asked.append(ids)
                written = answer(ids)
                ids = prompt(c, written)
                yield [(c, written)]
        return generate.DecodeCounts()

    monkeypatch.setattr(regenerate, "decode_conversations", decode)
    return asked


def _the_cat(tok):
    """Every prompt answered "the cat" and its end of turn."""
    answer = tok.encode("the cat", add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")]
    return lambda ids: list(answer)


def test_an_interrupted_regeneration_resumes_with_the_turns_it_finished(instruct, tmp_path,
                                                                          monkeypatch):
    from _chat_tiny import conversations, write_jsonl

    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.target import load_tokenizer

    tok = load_tokenizer(instruct)
    rows = [{"messages": [{"role": "user", "content": t["messages"][-2]["content"]}]}
            for t in conversations(7)]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    cfg = PrepareConfig(regenerate=True, min_supervised=2, batch_size=2, progress=False)
    asked = _fake_target(monkeypatch, _the_cat(tok))
    whole = prepare_chats(src, instruct, tmp_path / "whole", cfg)
    assert len(asked) == 7
    asked = _fake_target(monkeypatch, _the_cat(tok), stop_after=4)
    with pytest.raises(KeyboardInterrupt):
        prepare_chats(src, instruct, tmp_path / "cut", cfg)
    assert len((tmp_path / "cut" / "regenerated-00000.jsonl").read_text().splitlines()) == 5
    asked = _fake_target(monkeypatch, _the_cat(tok))
    again = prepare_chats(src, instruct, tmp_path / "cut", cfg)
    assert len(asked) == 3  # only the 3 turns left
    assert again["counts"] == whole["counts"]
    a, b = open_prepared(tmp_path / "whole"), open_prepared(tmp_path / "cut")
    assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    assert not list((tmp_path / "cut").glob("regenerated-*"))


def test_a_regeneration_killed_mid_batch_resumes_to_the_same_samples(instruct, tmp_path,
                                                                       monkeypatch):
    """The real decode loop, 2 rows for 9 conversations of 1-2 turns: stopped after its first
    logged turns, run again, it writes what an uninterrupted run writes."""
    from _chat_tiny import conversations, write_jsonl

    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.regenerate import TurnLog

    src = write_jsonl(tmp_path / "c.jsonl", conversations(9))
    cfg = PrepareConfig(regenerate=True, min_supervised=2, batch_size=2, max_new_tokens=6,
                        progress=False)
    whole = prepare_chats(src, instruct, tmp_path / "whole", cfg)
    real = TurnLog.append

    def append_then_stop(self, turns):
        real(self, turns)
        raise KeyboardInterrupt

    monkeypatch.setattr(TurnLog, "append", append_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare_chats(src, instruct, tmp_path / "cut", cfg)
    monkeypatch.setattr(TurnLog, "append", real)
    again = prepare_chats(src, instruct, tmp_path / "cut", cfg)
    assert again["counts"] == whole["counts"] and whole["counts"]["regenerated_turns"] > 9
    a, b = open_prepared(tmp_path / "whole"), open_prepared(tmp_path / "cut")
    assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]


def test_regeneration_progress_counts_turns(instruct, tmp_path, monkeypatch):
    from _chat_tiny import conversations, write_jsonl

    import lengthwise.dflash.prepare as prepare_module
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.target import load_tokenizer

    rows = conversations(5)
    turns = sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    _fake_target(monkeypatch, _the_cat(load_tokenizer(instruct)))
    seen = []

    def progress(items, *, desc="", unit="it", total=None, enable=True):
        seen.append((unit, total))
        for item in items:
            seen.append(item)
            yield item

    monkeypatch.setattr(prepare_module, "progress", progress)
    prepare_chats(write_jsonl(tmp_path / "c.jsonl", rows), instruct, tmp_path / "p",
                  PrepareConfig(regenerate=True, min_supervised=2, batch_size=2))
    assert seen[0] == ("turn", turns) and len(seen) == 1 + turns


@pytest.fixture(scope="module")
def trained_run(instruct, long_prompts, tmp_path_factory):
    """A 5-step run with checkpoints at steps 2 and 4 (the newest is not the final draft)."""
    from lengthwise.cli import main

    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["dflash", "train", "--target", str(instruct), "--data", str(long_prompts),
                 "--out", str(run), "--steps", "5", "--max-tokens", "256", "--draft-layers",
                 "1", "--block-size", "4", "--num-anchors", "4", "--eval-samples", "2",
                 "--checkpoint-every", "2", "--eval-every", "0", "--lr", "1e-2",
                 "--no-progress"]) == 0
    return run


def test_export_of_a_run_takes_its_final_draft_and_names_it(trained_run, tmp_path, capsys):
    from safetensors.torch import load_file

    from lengthwise.cli import main

    final = torch.load(trained_run / "final" / "draft.pt", weights_only=True)
    capsys.readouterr()
    for given, out in ((trained_run, tmp_path / "a"), (trained_run / "final", tmp_path / "b")):
        assert main(["dflash", "export", str(given), str(out)]) == 0
        assert f"draft {trained_run / 'final'} (step 5)" in capsys.readouterr().out
        assert load_file(out / "model.safetensors")["fc.weight"].equal(final["fc.weight"])
    assert main(["dflash", "export", str(trained_run / "checkpoints"), str(tmp_path / "c")]) == 0
    assert "step_4 (step 4)" in capsys.readouterr().out
    assert not load_file(tmp_path / "c" / "model.safetensors")["fc.weight"].equal(
        final["fc.weight"])


def test_eval_of_a_run_takes_its_final_draft_and_names_it(trained_run, capsys):
    from lengthwise.cli import main

    served = trained_run / "target"  # grown by the mask token's row
    assert main(["dflash", "eval", "--target", str(served), "--draft", str(trained_run),
                 "--limit", "1", "--max-new-tokens", "3", "--temperatures", "0",
                 "--no-check", "--no-accuracy", "--no-progress", "--json"]) == 0
    said = capsys.readouterr()
    assert f"draft {trained_run / 'final'} (step 5)" in said.err


def _cut_save(monkeypatch, error):
    """``save_file`` writes half the file, then raises ``error`` (``None``: returns)."""
    import safetensors.torch

    real = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "rb+") as fh:
            fh.truncate(Path(filename).stat().st_size // 2)
        if error is not None:
            raise error

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def test_a_full_disk_during_export_is_one_line_and_leaves_no_folder(trained_run, tmp_path,
                                                                    monkeypatch, capsys):
    from safetensors import SafetensorError

    from lengthwise.cli import main

    full = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                           'message: "No space left on device" })')
    for error in (full, None):  # raised, or a cut file without an error
        monkeypatch.undo()
        _cut_save(monkeypatch, error)
        out = tmp_path / "out"
        capsys.readouterr()
        assert main(["dflash", "export", str(trained_run), str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("the disk is full" if error else "not written whole") in err[0]
        assert not out.exists() and not list(tmp_path.iterdir())


def test_an_interrupted_export_leaves_the_older_folder_as_it_was(trained_run, tmp_path,
                                                                 monkeypatch):
    from lengthwise.cli import main

    out = tmp_path / "out"
    assert main(["dflash", "export", str(trained_run / "checkpoints"), str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _cut_save(monkeypatch, KeyboardInterrupt())
    assert main(["dflash", "export", str(trained_run), str(out), "--overwrite"]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


class _Payload:
    """Unpickling this creates the file ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_final_draft_holding_objects_is_refused_and_runs_nothing(trained_run, tmp_path,
                                                                    capsys):
    import pickle
    import shutil

    from lengthwise.cli import main

    forged = tmp_path / "run"
    shutil.copytree(trained_run / "final", forged / "final")
    marker = tmp_path / "MARKER"
    (forged / "final" / "draft.pt").write_bytes(pickle.dumps(_Payload(marker)))
    capsys.readouterr()
    assert main(["dflash", "export", str(forged), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not marker.exists() and len(err) == 1 and "objects other than tensors" in err[0]


def _target_and_tokenizer(folder):
    import transformers

    from lengthwise.dflash.target import load_tokenizer

    return (load_tokenizer(folder),
            transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32))


@pytest.mark.parametrize("extra, chosen", [
    (("<repo_name>", "<file_sep>"), "<repo_name>"),
    (("<file_sep>", "<|reserved_special_token_0|>"), "<|reserved_special_token_0|>")])
def test_a_special_token_the_target_never_writes_is_the_mask_and_nothing_grows(
        tmp_path, extra, chosen):
    from lengthwise.dflash.mask_token import ensure_mask_token

    tok, model = _target_and_tokenizer(save_instruct_target(tmp_path / "t",
                                                            extra_special=extra))
    rows, size = model.get_input_embeddings().weight.shape[0], len(tok)
    mask = ensure_mask_token(tok, model)
    assert (mask.token, mask.id) == (chosen, tok.convert_tokens_to_ids(chosen))
    assert mask.unused and not mask.added and not mask.resized
    assert model.get_input_embeddings().weight.shape[0] == rows and len(tok) == size


def test_without_a_spare_special_token_the_mask_token_grows_the_tied_target(instruct):
    from lengthwise.dflash.mask_token import ensure_mask_token

    tok, model = _target_and_tokenizer(instruct)  # its specials: eos, pad and the template's
    rows = model.get_input_embeddings().weight.shape[0]
    mask = ensure_mask_token(tok, model)
    assert (mask.token, mask.id, mask.added, mask.resized) == ("<|MASK|>", rows, True, True)
    assert model.get_output_embeddings().weight.shape[0] == rows + 1
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_training_with_a_spare_special_token_serves_the_draft_with_the_target_as_it_is(
        tmp_path, capsys):
    import json

    from _chat_tiny import conversations, write_jsonl

    from lengthwise.cli import main

    target = save_instruct_target(tmp_path / "t", extra_special=("<repo_name>",))
    chats = write_jsonl(tmp_path / "c.jsonl", conversations(12))
    assert main(["dflash", "prepare", str(chats), "--target", str(target), "--out",
                 str(tmp_path / "p"), "--min-supervised", "4", "--no-progress"]) == 0
    assert main(["dflash", "train", "--target", str(target), "--data", str(tmp_path / "p"),
                 "--out", str(tmp_path / "run"), "--steps", "1", "--max-tokens", "256",
                 "--draft-layers", "1", "--block-size", "4", "--num-anchors", "4",
                 "--eval-samples", "2", "--checkpoint-every", "0", "--no-progress"]) == 0
    said = capsys.readouterr()
    summary = json.loads(said.out[said.out.index("{"):])
    assert summary["target"] == str(target) and not (tmp_path / "run" / "target").exists()
    assert "mask token <repo_name> id" in said.err and "grew" not in said.err


def test_eval_progress_counts_prompts(monkeypatch):
    from _dflash_tiny import qwen3_pair

    import lengthwise.dflash.evaluate
    from lengthwise.dflash.evaluate import evaluate_set

    seen = []

    def progress(items, *, desc="", unit="it", total=None, enable=True):
        seen.append((desc, unit, total))
        for item in items:
            seen.append(desc)
            yield item

    monkeypatch.setattr(lengthwise.dflash.evaluate, "bar", progress)
    target, draft = qwen3_pair()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 2], [5]]
    evaluate_set(draft, target, prompts, name="p", temperatures=[0.0], max_new_tokens=2,
                 batch_size=2, check=False, accuracy=False, progress=True)
    assert seen[0] == ("p T=0: decoding", "prompt", 5) and seen.count("p T=0: decoding") == 5
