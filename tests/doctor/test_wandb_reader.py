"""W&B run files: a real offline run written by ``wandb`` and read back by ``lengthwise doctor``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lengthwise.cli import main
from lengthwise.doctor import diagnose
from lengthwise.doctor.readers import read_log
from lengthwise.doctor.simulate import simulate_run


def _offline_run(root: Path, rows: list[dict], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real offline W&B run of ``rows`` logged the way the Hugging Face integration logs."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(mode="offline", dir=str(root), project="doctor-test")
    for r in rows:  # W&B's own step counts log calls, the trainer's step is a field
        run.log({"train/loss": r["loss"], "train/learning_rate": 1e-4,
                 "train/epoch": r["step"] / 500.0, "train/global_step": r["step"]})
        if r["step"] % 500 == 0:
            run.log({"eval/loss": r["loss"] + 0.1, "train/global_step": r["step"]})
    run.finish()
    (folder,) = (root / "wandb").glob("offline-run-*")
    return folder


@pytest.fixture(scope="module")
def sawtooth_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    rows = simulate_run("sorted_megabatch", steps=1500, seed=3, megabatch=50).records
    with pytest.MonkeyPatch.context() as mp:
        folder = _offline_run(tmp_path_factory.mktemp("wb"), rows, mp)
    return folder, rows


def test_an_offline_run_folder_reads_back_every_logged_row(sawtooth_run) -> None:
    folder, rows = sawtooth_run
    log = read_log(folder)
    assert log.input.format == "wandb"
    assert log.step.tolist() == [float(r["step"]) for r in rows]  # the trainer's global step
    assert log.loss.tolist() == pytest.approx([r["loss"] for r in rows])
    assert log.input.other_rows == len([r for r in rows if r["step"] % 500 == 0])  # eval rows
    assert "epoch" in log.columns and "lr" in log.columns
    (file,) = folder.glob("*.wandb")
    assert read_log(file).loss.tolist() == log.loss.tolist()
    assert read_log(folder.parent).loss.tolist() == log.loss.tolist()  # wandb/ with one run


def test_lengthwise_doctor_reads_a_wandb_run_folder(sawtooth_run, capsys) -> None:
    folder, _ = sawtooth_run
    assert main(["doctor", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["periodicity"]["period"] == pytest.approx(50, rel=0.05)
    assert diagnose(folder).periodicity.period == report["periodicity"]["period"]


def test_a_wandb_folder_with_two_runs_names_them(sawtooth_run, tmp_path: Path, capsys) -> None:
    folder, _ = sawtooth_run
    root = tmp_path / "wandb"
    for name in ("run-a", "run-b"):
        (root / name).mkdir(parents=True)
        (root / name / f"{name}.wandb").write_bytes(next(folder.glob("*.wandb")).read_bytes())
    assert main(["doctor", str(root)]) == 2
    err = capsys.readouterr().err
    assert "holds 2 W&B run files" in err and err.count("\n") == 1


def test_without_wandb_the_error_names_the_extra(tmp_path: Path, capsys,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run-x.wandb"
    path.write_bytes(b":W&B\xe1\xbe\x00" + bytes(20))
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "wandb.proto", None)
    assert main(["doctor", str(path)]) == 2
    err = capsys.readouterr().err
    assert 'pip install "lengthwise[wandb]"' in err and err.count("\n") == 1


def test_a_file_that_is_not_a_wandb_run_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    pytest.importorskip("wandb")
    path = tmp_path / "run-x.wandb"
    path.write_bytes(b"not a wandb file at all")
    assert main(["doctor", str(path)]) == 2
    assert "not a W&B run file" in capsys.readouterr().err
