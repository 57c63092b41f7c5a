"""A checkpoint folder is data: loading one never runs code, whatever its files hold."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from lengthwise.cli import main  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402
from lengthwise.train import Checkpointer, list_checkpoints, load_checkpoint  # noqa: E402
from lengthwise.train.checkpoint import (  # noqa: E402
    CheckpointError,
    CorruptCheckpointError,
    LegacyCheckpointError,
)
from lengthwise.train.checkpoint.folder import file_digests, prune  # noqa: E402
from lengthwise.train.checkpoint.state import from_json, to_json  # noqa: E402

BACKENDS = [pytest.param(False, id="torch-save"), pytest.param(True, id="dcp")]


class Payload:
    """Unpickling this runs ``os.system("touch MARKER")``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Counter:
    """A sampler-like object whose state is a dict of ints."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self):
        return {"n": self.n, "seen": [1, 2, 3]}

    def load_state_dict(self, state):
        self.n = state["n"]


def _run(tmp_path, use_dcp, steps=(1, 2)):
    """A model, optimizer, scheduler and counter, saved at ``steps``; returns the objects."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    counter = Counter()
    with Checkpointer(tmp_path, use_dcp=use_dcp, async_=False, keep=None) as ckpt:
        for step in steps:
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            sched.step()
            counter.n += 1
            ckpt.save(step, model=model, optimizer=opt, scheduler=sched, sampler=counter,
                      extra={"note": "x", "pair": (1, 2.5), "ids": np.arange(3)},
                      files={"config.json": "{}"})
    return model, opt, sched, counter


def _rehash(folder, *, drop_files=False):
    manifest = json.loads((folder / "COMPLETE").read_text())
    if drop_files:
        del manifest["files"]
    else:
        manifest["files"] = file_digests(folder)
    (folder / "COMPLETE").write_text(json.dumps(manifest))


def _fresh():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s), Counter()


def _load(path, fresh=None):
    model, opt, sched, counter = fresh or _fresh()
    return load_checkpoint(path, model=model, optimizer=opt, scheduler=sched, sampler=counter)


@pytest.mark.parametrize("where", ["whole-file", "training-state"])
def test_a_forged_state_pt_with_matching_checksums_is_refused_and_runs_nothing(tmp_path, where):
    _run(tmp_path / "run", False)
    step, marker = tmp_path / "run" / "step_2", tmp_path / "MARKER"
    if where == "whole-file":
        (step / "state.pt").write_bytes(pickle.dumps(Payload(marker)))
        said = "holds objects other than tensors and plain data; it is refused"
    else:
        state = torch.load(step / "state.pt", weights_only=True)
        state["aux_rank0"] = pickle.dumps(Payload(marker))
        torch.save(state, step / "state.pt")
        said = "its training state is a bytes, not JSON text"
    _rehash(step)
    for path in (step, tmp_path / "run"):
        with pytest.raises(CorruptCheckpointError, match=said):
            _load(path)
    assert not marker.exists()


@pytest.mark.parametrize("part", ["model", "optimizer"])
def test_a_rehashed_state_that_does_not_fit_the_model_is_one_line(tmp_path, part):
    _run(tmp_path / "run", False)
    step = tmp_path / "run" / "step_2"
    state = torch.load(step / "state.pt", weights_only=True)
    if part == "model":
        state["model"] = {"x": torch.zeros(1)}
        said = ("state.pt: its model state does not fit the model: 2 tensors missing "
                "(e.g. 'bias'), 1 unexpected (e.g. 'x')")
    else:
        state["optimizer"]["param_groups"][0]["params"] = [0]
        said = "state.pt: its optimizer state does not fit the model's parameters"
    torch.save(state, step / "state.pt")
    _rehash(step)
    for path in (step, tmp_path / "run"):
        with pytest.raises(CheckpointError, match=re.escape(said)) as info:
            _load(path)
        assert "\n" not in str(info.value)


def test_a_forged_distributed_checkpoint_is_refused_and_runs_nothing(tmp_path):
    import torch.distributed.checkpoint as dcp

    _run(tmp_path / "run", True)
    step, marker = tmp_path / "run" / "step_2", tmp_path / "MARKER"
    index = step / ".metadata"
    saved = index.read_bytes()
    index.write_bytes(pickle.dumps(Payload(marker)))  # the index torch reads with pickle
    _rehash(step)
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata: refuses posix\.system"):
        _load(step)
    assert not marker.exists()
    # a value of the state dict (read by torch with torch.load) holding the payload
    index.write_bytes(saved)
    for name in [p.name for p in step.iterdir() if p.suffix == ".distcp"] + [".metadata"]:
        (step / name).unlink()
    model = torch.nn.Linear(4, 3)
    dcp.save({"model": model.state_dict(), "aux_rank0": Payload(marker)},
             storage_writer=dcp.FileSystemWriter(str(step)), no_dist=True)
    _rehash(step)
    with pytest.raises(CorruptCheckpointError, match="aux_rank0 holds objects other than"):
        load_checkpoint(step, model=model)
    assert not marker.exists()


@pytest.mark.parametrize("use_dcp", BACKENDS)
def test_a_manifest_without_files_or_missing_an_entry_is_refused(tmp_path, use_dcp):
    _run(tmp_path, use_dcp)
    step = tmp_path / "step_2"
    _rehash(step, drop_files=True)
    with pytest.raises(CorruptCheckpointError, match="step_2: the manifest lists no files"):
        _load(step)
    with pytest.warns(UserWarning, match="step_2: the manifest lists no files"):
        assert _load(tmp_path)["step"] == 1  # the newest one that verifies
    _rehash(step)
    manifest = json.loads((step / "COMPLETE").read_text())
    del manifest["files"]["config.json"]
    (step / "COMPLETE").write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="config.json is not listed in the manifest"):
        _load(step)
    manifest["files"]["../step_1/config.json"] = manifest["files"].pop(
        next(iter(manifest["files"])))
    (step / "COMPLETE").write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match=r"lists '\.\./step_1/config\.json', which "
                                                     "is not a file inside the folder"):
        _load(step)


@pytest.mark.parametrize("use_dcp", BACKENDS)
def test_save_and_load_are_exact_for_every_part_of_the_state(tmp_path, use_dcp):
    model, opt, sched, counter = _run(tmp_path, use_dcp)
    random.seed(4)
    np.random.seed(4)
    torch.manual_seed(4)
    with Checkpointer(tmp_path, use_dcp=use_dcp, async_=False) as ckpt:
        ckpt.save(3, model=model, optimizer=opt, scheduler=sched, sampler=counter,
                  extra={"note": "x", "pair": (1, 2.5), "ids": np.arange(3), 7: float("inf")})
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    fresh = _fresh()
    state = _load(tmp_path, fresh)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws
    extra = state["extra"]
    assert extra["pair"] == (1, 2.5) and extra[7] == float("inf")
    assert extra["ids"].dtype == np.arange(3).dtype and extra["ids"].tolist() == [0, 1, 2]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 fresh[0].state_dict().values(), strict=True))
    assert fresh[2].state_dict() == sched.state_dict() and fresh[3].n == counter.n
    assert str(opt.state_dict()) == str(fresh[1].state_dict())


def test_extra_that_is_not_plain_data_is_refused_at_the_save_naming_it(tmp_path):
    with Checkpointer(tmp_path, async_=False) as ckpt, pytest.raises(
            ConfigError, match=r"extra\['cb'\] cannot be saved in a checkpoint: a Counter"):
        ckpt.save(1, model=torch.nn.Linear(1, 1), extra={"cb": Counter()})
    assert list_checkpoints(tmp_path) == []


def _as_legacy(step, payload=None):
    """Rewrite a current checkpoint as the old format wrote it: a pickled state, version 2."""
    state = torch.load(step / "state.pt", weights_only=True)
    old = from_json(state["aux_rank0"])
    if payload is not None:
        old["extra"] = payload
    state["aux_rank0"] = pickle.dumps(old, protocol=pickle.HIGHEST_PROTOCOL)
    torch.save(state, step / "state.pt")
    manifest = json.loads((step / "COMPLETE").read_text())
    manifest["version"] = 2
    (step / "COMPLETE").write_text(json.dumps(manifest))
    _rehash(step)


def _older_message(step, version):
    return (f"{step} is a checkpoint of an older lengthwise (format version {version}), which "
            "this version does not read (it reads version 3); nothing in it was loaded")


@pytest.mark.parametrize("use_dcp", [False, True], ids=["torch-save", "dcp"])
@pytest.mark.parametrize("version", [2, None], ids=["version-2", "no-version"])
def test_an_old_checkpoint_is_refused_naming_it_and_nothing_in_it_runs(tmp_path, use_dcp,
                                                                       version):
    _run(tmp_path / "run", use_dcp)
    step, marker = tmp_path / "run" / "step_2", tmp_path / "MARKER"
    if use_dcp:
        (step / "state.pt").write_bytes(pickle.dumps(Payload(marker)))
        _rehash(step)
    else:
        _as_legacy(step, payload=Payload(marker))
    manifest = json.loads((step / "COMPLETE").read_text())
    if version is None:  # version 1 wrote no version
        del manifest["version"]
    else:
        manifest["version"] = version
    (step / "COMPLETE").write_text(json.dumps(manifest))
    for path in (step, tmp_path / "run"):
        with pytest.raises(LegacyCheckpointError) as err:
            _load(path)
        assert str(err.value) == _older_message(step, version or 1)
    assert not marker.exists()


def test_the_command_line_refuses_an_old_checkpoint_in_one_line(tmp_path, capsys):
    _run(tmp_path / "run", False)
    step = tmp_path / "run" / "step_2"
    _as_legacy(step)
    assert main(["dflash", "export", str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"lengthwise dflash: error: {_older_message(step, 2)}\n"
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as done:  # the converting command is gone
        main(["checkpoint", "convert", str(tmp_path / "run")])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'checkpoint'" in err and err.count("\n") == 1


def test_pruning_a_linked_step_folder_removes_the_link_not_its_target(tmp_path):
    _run(tmp_path / "run", False)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    (victim / "COMPLETE").write_text((tmp_path / "run" / "step_1" / "COMPLETE").read_text())
    (tmp_path / "run" / "step_0").symlink_to(victim, target_is_directory=True)
    prune(tmp_path / "run", 3, keep=2)
    assert not (tmp_path / "run" / "step_0").exists()
    assert sorted(p.name for p in victim.iterdir()) == ["COMPLETE", "precious.txt"]


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text() | st.integers(), inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(_plain)
def test_the_training_state_round_trips_through_json(value):
    assert from_json(to_json(value)) == value


def test_tensors_and_arrays_round_trip_with_their_dtype():
    value = {"t": torch.tensor([1.5, -0.0, float("nan")], dtype=torch.bfloat16),
             "b": torch.tensor([True, False]), "u": np.array([[1, 2]], dtype=np.uint32),
             "s": np.float32(0.1), "rng": torch.get_rng_state()}
    back = from_json(to_json(value))
    assert back["t"].dtype == torch.bfloat16 and torch.equal(back["t"][:2], value["t"][:2])
    assert torch.isnan(back["t"][2]) and torch.equal(back["b"], value["b"])
    assert back["u"].dtype == np.uint32 and back["u"].shape == (1, 2)
    assert back["s"] == value["s"] and back["s"].dtype == np.float32
    assert torch.equal(back["rng"], value["rng"])
    text = to_json(value)
    assert "NaN" not in text and hashlib.sha256(text.encode()).hexdigest() == hashlib.sha256(
        to_json(from_json(text)).encode()).hexdigest()


@pytest.mark.parametrize("aux", ['{"step": 2, "extra": null, "rng": {"python": 5}}',
                                 '[' * 100_000 + ']' * 100_000,
                                 '{"step": 2, "extra": {"__lw__": "ndarray", "dtype": "|O", '
                                 '"shape": [1], "data": [1]}, "rng": {}}'])
def test_a_training_state_of_the_wrong_shape_is_a_named_error(tmp_path, aux):
    model = torch.nn.Linear(1, 1)
    with Checkpointer(tmp_path, async_=False) as ckpt:
        ckpt.save(1, model=model)
    step = tmp_path / "step_1"
    state = torch.load(step / "state.pt", weights_only=True)
    state["aux_rank0"] = aux
    torch.save(state, step / "state.pt")
    _rehash(step)
    with pytest.raises(CorruptCheckpointError, match=r"step_1"):
        load_checkpoint(step, model=model)
