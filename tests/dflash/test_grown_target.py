"""The run's target/ (the target grown by the mask token's row): whole or not at all, kept when
unchanged, and a full disk or a file-size limit while saving it is one line."""

from __future__ import annotations

import json

import pytest
from _chat_tiny import chat_tokenizer, save_target

from lengthwise.dflash.mask_token import save_grown_target
from lengthwise.errors import DiskFullError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class SafetensorError(Exception):
    """Stands for safetensors' error: it carries no errno, only the system's text."""


@pytest.fixture
def grown(tmp_path):
    """A tiny target and its tokenizer, as a run holds them once the mask row is added."""
    folder = save_target(tmp_path / "source")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    return model, chat_tokenizer()


def _failing_save(text):
    def save(self, folder, **kwargs):
        with open(f"{folder}/model.safetensors", "wb") as handle:
            handle.write(b"\0" * 100)  # half a file, then the writer gives up
        raise SafetensorError(f"Error while serializing: I/O error: {text}")
    return save


@pytest.mark.parametrize("text, reason", [
    ("No space left on device (os error 28)", "the disk is full"),
    ("File too large (os error 27)", "a file grew past the largest file size allowed"),
])
def test_a_full_disk_while_saving_is_one_line_and_leaves_nothing(grown, tmp_path, monkeypatch,
                                                                  text, reason):
    model, tok = grown
    run = tmp_path / "run"
    monkeypatch.setattr(type(model), "save_pretrained", _failing_save(text))
    with pytest.raises(DiskFullError) as info:
        save_grown_target(model, tok, run / "target")
    message = str(info.value)
    assert message.startswith(f"saving the grown target into {run / 'target'} failed: {reason}")
    assert "it needs about" in message and "\n" not in message
    assert list(run.iterdir()) == []  # no target/ that looks complete, no hidden leftover


def test_a_failed_save_keeps_the_older_target(grown, tmp_path, monkeypatch):
    model, tok = grown
    target = tmp_path / "run" / "target"
    assert save_grown_target(model, tok, target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1  # another target: it would be written again
    monkeypatch.setattr(type(model), "save_pretrained",
                        _failing_save("No space left on device (os error 28)"))
    with pytest.raises(DiskFullError):
        save_grown_target(model, tok, target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in target.parent.iterdir()] == ["target"]


def test_an_unchanged_target_is_not_written_again(grown, tmp_path):
    model, tok = grown
    target = tmp_path / "target"
    assert save_grown_target(model, tok, target) is True
    weights = target / "model.safetensors"
    stamp = (weights.stat().st_ino, weights.stat().st_mtime_ns)
    assert save_grown_target(model, tok, target) is False
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == stamp
    with torch.no_grad():
        model.model.embed_tokens.weight[-1] += 1
    assert save_grown_target(model, tok, target) is True  # other weights: saved anew
    again = transformers.AutoModelForCausalLM.from_pretrained(str(target))
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_a_damaged_target_is_written_again(grown, tmp_path):
    model, tok = grown
    target = tmp_path / "target"
    save_grown_target(model, tok, target)
    (target / "model.safetensors").write_bytes(b"cut")
    assert save_grown_target(model, tok, target) is True
    assert json.loads((target / "config.json").read_text())["vocab_size"] == len(tok)


def test_train_onto_a_real_full_disk_exits_2_in_one_line(tiny_prepared, small_disk, capsys):
    from _cli import tiny_train_args

    from lengthwise.cli import main

    target, data = tiny_prepared
    out = small_disk / "run"
    assert main(tiny_train_args(target, data, out, "--steps", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # transformers' own progress bars stay off
    assert err[0].startswith(f"lengthwise dflash: error: saving the grown target into "
                             f"{out / 'target'} failed: the disk is full")
    assert not (out / "target").exists() and not [p for p in out.iterdir()
                                                   if p.name.startswith(".target")]


def test_a_resume_keeps_the_run_s_target_as_it_is(tiny_prepared, tmp_path, capsys):
    from _cli import tiny_train_args

    from lengthwise.cli import main

    target, data = tiny_prepared
    out = tmp_path / "run"
    assert main(tiny_train_args(target, data, out, "--steps", "2")) == 0
    weights = out / "target" / "model.safetensors"
    stamp = (weights.stat().st_ino, weights.stat().st_mtime_ns)
    assert main(tiny_train_args(target, data, out, "--steps", "3", "--resume")) == 0
    capsys.readouterr()
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == stamp


def test_a_full_disk_while_saving_the_final_draft_is_one_line(tiny_prepared, tmp_path, capsys,
                                                              monkeypatch):
    from _cli import tiny_train_args
    from _full_disk import zip_writer_full

    from lengthwise.cli import main

    target, data = tiny_prepared
    out = tmp_path / "run"
    real_save = torch.save

    def full(obj, where, *args, **kwargs):  # the final draft's file: the disk fills under it
        if not hasattr(where, "write"):
            return real_save(obj, where, *args, **kwargs)
        zip_writer_full(where)

    monkeypatch.setattr(torch, "save", full)
    assert main(tiny_train_args(target, data, out, "--steps", "1", "--checkpoint-every",
                                "0")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"lengthwise dflash: error: saving the final draft into "
                              f"{out / 'final'} failed: the disk is full"), err
    assert sorted(p.name for p in (out / "final").iterdir()) == []  # no draft.pt that looks whole
