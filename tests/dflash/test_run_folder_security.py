"""A run folder is data: export, eval and resume never run code from a forged checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

import pytest
from _chat_tiny import conversations, save_target, write_jsonl

from lengthwise.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class Payload:
    """Unpickling this runs ``os.system("touch MARKER")``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A target, a ``dflash prepare`` folder and a 2-step ``dflash train`` run, all by the CLI."""
    root = tmp_path_factory.mktemp("secrun")
    target = save_target(root / "target")
    chats = write_jsonl(root / "chats.jsonl", conversations(24))
    assert main(["dflash", "prepare", str(chats), "--target", str(target), "--out",
                 str(root / "prepared"), "--min-supervised", "16", "--shard-rows", "16",
                 "--no-progress"]) == 0
    assert main(_train_args(target, root / "prepared", root / "run", steps=2)) == 0
    return target, root / "prepared", root / "run"


def _train_args(target, data, out, *, steps):
    return ["dflash", "train", "--target", str(target), "--data", str(data), "--out", str(out),
            "--steps", str(steps), "--max-tokens", "256", "--draft-layers", "1", "--block-size",
            "4", "--num-anchors", "4", "--eval-samples", "2", "--eval-every", "0",
            "--checkpoint-every", "1", "--keep-checkpoints", "3", "--lr", "1e-2",
            "--no-progress"]


def _forge(run, dst, marker, *, inner=False, files=True):
    """A copy of ``run`` whose newest ``state.pt`` unpickles the payload; the manifest matches."""
    shutil.copytree(run, dst)
    step = dst / "checkpoints" / "step_2"
    if inner:  # a real state dict whose training state is a pickle holding the payload
        state = torch.load(step / "state.pt", weights_only=True)
        state["aux_rank0"] = pickle.dumps(Payload(marker))
        torch.save(state, step / "state.pt")
    else:
        (step / "state.pt").write_bytes(pickle.dumps(Payload(marker)))
    manifest = json.loads((step / "COMPLETE").read_text())
    if files:
        data = (step / "state.pt").read_bytes()
        manifest["files"]["state.pt"] = {"bytes": len(data),
                                         "sha256": hashlib.sha256(data).hexdigest()}
    else:
        del manifest["files"]
    (step / "COMPLETE").write_text(json.dumps(manifest))
    return dst


def _one_line(capsys):
    """The command's one error line (progress bars of transformers aside), no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lengthwise dflash")
             and ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize("inner", [False, True], ids=["whole-file", "training-state"])
def test_export_eval_and_resume_refuse_a_forged_state_and_run_nothing(run, tmp_path, capsys,
                                                                     inner):
    target, data, good = run
    marker = tmp_path / "MARKER"
    forged = _forge(good, tmp_path / "forged", marker, inner=inner)
    said = ("holds objects other than tensors and plain data" if not inner
            else "its training state is a bytes, not JSON text")

    ckpts = forged / "checkpoints"  # the run itself gives its final draft
    assert main(["dflash", "export", str(ckpts), str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert not marker.exists() and said in line

    assert main(["dflash", "eval", "--target", str(forged / "target"), "--draft", str(ckpts),
                 "--max-new-tokens", "4", "--limit", "1", "--temperatures", "0"]) == 2
    line = _one_line(capsys)
    assert not marker.exists() and said in line

    assert main([*_train_args(target, data, forged, steps=3), "--resume"]) == 2
    line = _one_line(capsys)
    assert not marker.exists() and "step_2/state.pt" in line and said in line


def test_a_rehashed_state_without_the_draft_s_tensors_is_one_line(run, tmp_path, capsys):
    target, data, good = run
    forged = shutil.copytree(good, tmp_path / "forged")
    step = forged / "checkpoints" / "step_2"
    torch.save({"model": {"x": torch.zeros(1)}, "aux_rank0": "{}"}, step / "state.pt")
    manifest = json.loads((step / "COMPLETE").read_text())
    state = (step / "state.pt").read_bytes()
    manifest["files"]["state.pt"] = {"bytes": len(state),
                                     "sha256": hashlib.sha256(state).hexdigest()}
    (step / "COMPLETE").write_text(json.dumps(manifest))
    said = (f"{step}/state.pt: its model state does not fit the model: 14 tensors missing "
            "(e.g. 'context_norm.weight'), 1 unexpected (e.g. 'x')")
    assert main(["dflash", "export", str(forged / "checkpoints"), str(tmp_path / "out")]) == 2
    assert said in _one_line(capsys)
    assert main([*_train_args(target, data, forged, steps=3), "--resume"]) == 2
    line = _one_line(capsys)  # it has no optimizer state either: the first thing read
    assert f"{step}/state.pt" in line and "the previous good checkpoint is step 1" in line


def test_a_manifest_without_files_is_refused(run, tmp_path, capsys):
    _, _, good = run
    marker = tmp_path / "MARKER"
    forged = _forge(good, tmp_path / "forged", marker, files=False)
    assert main(["dflash", "export", str(forged / "checkpoints" / "step_2"),
                 str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert not marker.exists() and "the manifest lists no files with checksums" in line
    # the run's newest checkpoint that verifies is used instead, with a warning naming step 2
    with pytest.warns(UserWarning, match=r"step_2: the manifest lists no files"):
        assert main(["dflash", "export", str(forged / "checkpoints"), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())
    assert not marker.exists()


def test_a_round_trip_still_exports_and_resumes(run, tmp_path, capsys):
    target, data, good = run
    resumed = tmp_path / "resumed"
    shutil.copytree(good, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_2")
    (resumed / "train_log.jsonl").unlink()
    assert main([*_train_args(target, data, resumed, steps=2), "--resume"]) == 0
    capsys.readouterr()
    full = [json.loads(line) for line in (good / "train_log.jsonl").read_text().splitlines()]
    again = [json.loads(line) for line in (resumed / "train_log.jsonl").read_text().splitlines()]
    loss = {r["step"]: r["loss"] for r in full if "event" not in r}
    assert [(r["step"], r["loss"]) for r in again if "event" not in r] == [(2, loss[2])]
    assert main(["dflash", "export", str(resumed), str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("name", ["../x.parquet", "/etc/hostname", "sub/../../x.parquet",
                                  "link.parquet", 3])
def test_a_shard_name_that_leaves_the_data_folder_is_refused_by_name(run, tmp_path, name):
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.errors import DataError

    _, data, _ = run
    copy = tmp_path / "prepared"
    shutil.copytree(data, copy)
    info = json.loads((copy / "prepare.json").read_text())
    first = copy / info["shards"][0]
    if name == "link.parquet":  # a link to a shard outside the folder
        outside = tmp_path / "outside.parquet"
        shutil.copy(first, outside)
        (copy / name).symlink_to(outside)
    else:
        shutil.copy(first, tmp_path / "x.parquet")
    info["shards"][0] = name
    (copy / "prepare.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=rf"--data {copy}: .*{name}.*refused"):
        open_prepared(copy)


def test_a_lengths_file_of_python_objects_is_refused_not_unpickled(run, tmp_path):
    import numpy as np

    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.errors import DataError

    _, data, _ = run
    copy = tmp_path / "prepared"
    shutil.copytree(data, copy)
    marker = tmp_path / "MARKER"
    n = int(np.load(copy / "lengths.npy").size)
    lengths = np.empty(n, dtype=object)
    lengths[0] = Payload(marker)
    np.save(copy / "lengths.npy", lengths, allow_pickle=True)
    with pytest.raises(DataError, match="lengths.npy: not an array of lengths"):
        open_prepared(copy)
    assert not marker.exists()


def test_target_weights_that_are_a_pickle_payload_are_refused_by_name(run, tmp_path, capsys):
    target, data, _ = run
    bad = tmp_path / "target"
    shutil.copytree(target, bad)
    (bad / "model.safetensors").unlink()
    marker = tmp_path / "MARKER"
    (bad / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    assert main(_train_args(bad, data, tmp_path / "run", steps=1)) == 2
    line = _one_line(capsys)
    assert not marker.exists()
    assert "pytorch_model.bin holds objects other than tensors; refused, not loaded" in line


def test_a_target_whose_config_maps_to_its_own_code_is_refused_by_every_command(run, tmp_path,
                                                                                capsys):
    target, data, good = run
    marker = tmp_path / "MARKER"
    evil = shutil.copytree(target, tmp_path / "evil_target")
    (evil / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    config = json.loads((evil / "config.json").read_text())
    config.update(model_type="evilmodel", auto_map={
        "AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
        "AutoTokenizer": ["evil.EvilTok", None]})
    (evil / "config.json").write_text(json.dumps(config))
    said = (f"--target {evil}: config.json's model_type 'evilmodel' is not one transformers "
            f"{transformers.__version__} implements, and its auto_map points to code in the "
            "folder (evil.EvilConfig, evil.EvilModel, evil.EvilTok); lengthwise never runs a "
            "model folder's own code")
    commands = {
        "eval": ["dflash", "eval", "--target", str(evil), "--draft", str(good / "checkpoints"),
                 "--max-new-tokens", "4", "--limit", "1", "--temperatures", "0"],
        "train": _train_args(evil, data, tmp_path / "run", steps=1),
        "prepare": ["dflash", "prepare", str(target.parent / "chats.jsonl"), "--target",
                    str(evil), "--out", str(tmp_path / "prepared"), "--no-progress"],
        "estimate": ["dflash", "estimate", "--target", str(evil), "--device", "cpu"],
        "export": ["dflash", "export", str(good / "checkpoints"), str(tmp_path / "export"),
                   "--target", str(evil)],
    }
    for name, argv in commands.items():
        assert main(argv) == 2, name
        assert _one_line(capsys).endswith(said), name
        assert not marker.exists(), name
