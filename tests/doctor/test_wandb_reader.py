"""W&B run files: a real offline run written by ``wandb`` and read back by ``lengthwise doctor``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lengthwise.cli import main
from lengthwise.doctor import diagnose
from lengthwise.doctor.readers import read_log

from simulated_logs.runs import simulate_run


def _settled(folder: Path) -> Path:
    """The run folder once W&B's writer has flushed its file (finish() returns before it does)."""
    (file,) = folder.glob("*.wandb")
    last, still = -1, 0
    for _ in range(600):  # up to a minute
        size = file.stat().st_size
        still = still + 1 if size == last else 0
        if still >= 10:
            break
        last = size
        time.sleep(0.1)
    return folder


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
    return _settled(folder)


@pytest.fixture(scope="module")
def sawtooth_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    rows = simulate_run("sorted_megabatch", steps=1500, seed=3, megabatch=50).records
    with pytest.MonkeyPatch.context() as mp:
        folder = _offline_run(tmp_path_factory.mktemp("wb"), rows, mp)
    return folder, rows


def test_an_offline_run_folder_reads_back_every_logged_row(sawtooth_run) -> None:
    folder, rows = sawtooth_run
    log = read_log(folder)
    assert log.input.format == "wandb" and not log.input.truncated
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


@pytest.mark.slow
def test_a_hugging_face_trainer_run_logged_to_wandb_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Trainer with ``report_to="wandb"`` (offline): steps, epochs and epoch starts."""
    wandb = pytest.importorskip("wandb")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    wandb.teardown()  # W&B set up earlier in this process would keep its settings (its dir)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    samples = [torch.randint(0, 64, (8 + i % 24,), generator=torch.Generator().manual_seed(i))
               for i in range(64)]

    def collate(batch: list) -> dict:
        width = max(len(s) for s in batch)
        ids = torch.stack([torch.nn.functional.pad(s, (0, width - len(s))) for s in batch])
        labels = torch.stack([torch.nn.functional.pad(s, (0, width - len(s)), value=-100)
                              for s in batch])
        return {"input_ids": ids, "labels": labels}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=4,
        logging_steps=1, report_to=["wandb"], save_strategy="no", use_cpu=True,
        disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=samples,
                         data_collator=collate).train()
    wandb.finish()  # the run stays open after train(); finishing flushes the file
    (folder,) = tmp_path.rglob("offline-run-*")
    log = read_log(_settled(folder))
    assert log.step.tolist() == list(range(1, 65)) and np.isfinite(log.loss).all()
    report = diagnose(folder)
    # 64 samples / 4 per step = 16 steps per epoch; the trainer writes 1.0 at step 16
    assert report.context.steps_per_epoch == pytest.approx(16)
    assert report.context.epoch_starts == [17.0, 33.0, 49.0]


def test_a_run_still_writing_reads_up_to_its_last_whole_record(sawtooth_run,
                                                                tmp_path: Path) -> None:
    folder, rows = sawtooth_run
    data = next(folder.glob("*.wandb")).read_bytes()
    cut = tmp_path / "run-live.wandb"
    cut.write_bytes(data[: int(len(data) * 0.6)])  # as a live run's file looks mid-write
    log = read_log(cut)
    assert log.input.truncated and 0 < log.loss.size < len(rows)
    assert log.loss.tolist() == pytest.approx([r["loss"] for r in rows][: log.loss.size])


def _run_folder_without_its_file(root: Path, name: str) -> Path:
    """What W&B writes into a run folder beside the .wandb file, without that file."""
    folder = root / name
    (folder / "files").mkdir(parents=True)
    (folder / "logs").mkdir()
    (folder / "files" / "wandb-metadata.json").write_text("{}")
    (folder / "logs" / "debug.log").write_text("")
    return folder


@pytest.mark.parametrize("name", ["offline-run-20240101_000000-abc", "copied-run"])
def test_a_wandb_run_folder_without_its_wandb_file_is_told_so(tmp_path: Path, capsys,
                                                              name: str) -> None:
    folder = _run_folder_without_its_file(tmp_path / "wandb", name)
    assert main(["doctor", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err == (f"lengthwise doctor: error: {folder}: a W&B run folder without its .wandb "
                   "file (run-<id>.wandb, the run's history, which the doctor reads): copy the "
                   "whole run folder, .wandb file included\n")
    assert main(["doctor", str(folder.parent)]) == 2  # the wandb/ folder that holds it
    err = capsys.readouterr().err
    assert f"holds 1 W&B run folder(s) ({name}) but no .wandb file" in err
    assert "TensorBoard" not in err and err.count("\n") == 1


def test_an_empty_run_named_folder_and_a_plain_folder(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run-20240101_000000-abc"
    run.mkdir()
    assert main(["doctor", str(run)]) == 2
    assert "a W&B run folder without its .wandb file" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["doctor", str(plain)]) == 2
    assert "holds no TensorBoard event file" in capsys.readouterr().err
