"""`lengthwise dflash estimate` and `dflash train --estimate`: what they print, read and refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _dflash_tiny import tiny_qwen3_config  # noqa: E402


def test_estimate_cli_prints_parts_and_exits_1_when_it_does_not_fit(tmp_path, capsys):
    from lengthwise.cli import main

    tiny_qwen3_config().save_pretrained(tmp_path)
    flags = ["dflash", "estimate", "--target", str(tmp_path), "--max-tokens", "256",
             "--block-size", "4", "--max-slots", "128", "--draft-layers", "1",
             "--head-chunk", "32"]
    assert main([*flags, "--device-memory", "141GiB"]) == 0
    text = capsys.readouterr().out
    for part in ("weights", "optimizer", "gradients", "activations", "logits_chunk", "fits in"):
        assert part in text
    assert main([*flags, "--device-memory", "1GiB"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main([*flags, "--json", "--world", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slots"] == 128 and data["settings"]["world"] == 2
    assert "ddp_buckets" in data["parts_gib"]


def test_estimate_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    from lengthwise.cli import main

    assert main(["dflash", "estimate", "--target", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    tiny_qwen3_config().save_pretrained(tmp_path)
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--device-memory",
                 "lots"]) == 2
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--block-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "device memory 'lots'" in err and "block_size" in err


def test_estimate_cli_reads_the_run_yaml_of_dflash_train(tmp_path, capsys):
    """The settings of `dflash train --config`: its other keys are left alone, 6e-4 is a number,
    and flags override the file."""
    pytest.importorskip("yaml")
    from lengthwise.cli import main

    tiny_qwen3_config().save_pretrained(tmp_path)
    run = tmp_path / "run.yaml"
    run.write_text("target: ./t\ndata: prepared/\nout: run/\nlr: 6e-4\nmax-tokens: 256\n"
                   "block_size: 4\nmax_slots: 64\ndraft_layers: 1\nhead_chunk: 32\n")
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--config", str(run),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slots"] == 64 and data["settings"]["block_size"] == 4
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--config", str(run),
                 "--max-slots", "128", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 128
    run.write_text("lr: fast\n")
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--config", str(run)]) == 2
    assert "lr must be a number" in capsys.readouterr().err


def _estimate_target(folder: Path) -> Path:
    """A target folder of config.json, a tokenizer and weights that cannot be read."""
    from _chat_tiny import chat_tokenizer

    tiny_qwen3_config().save_pretrained(folder)
    chat_tokenizer().save_pretrained(str(folder))
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def test_train_estimate_prints_dflash_estimate_and_reads_and_writes_nothing(tmp_path, capsys):
    """`dflash train --estimate`: the numbers of `dflash estimate` at the same settings, from
    config.json alone (unreadable weights, no data), and --out neither made nor touched."""
    pytest.importorskip("yaml")
    from lengthwise.cli import main

    target = _estimate_target(tmp_path / "target")
    shape = ["--max-tokens", "256", "--block-size", "4", "--max-slots", "128",
             "--draft-layers", "1", "--head-chunk", "32", "--grad-accum", "2"]
    run = tmp_path / "run.yaml"
    run.write_text(f"target: {target}\ndata: {tmp_path / 'no-data'}\nout: {tmp_path / 'out'}\n"
                   "device: cuda\nnum_anchors: 8\n")
    assert main(["dflash", "estimate", "--target", str(target), *shape, "--num-anchors", "8",
                 "--world", "2", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["dflash", "train", "--config", str(run), *shape, "--world", "2", "--json",
                 "--estimate"]) == 0
    assert json.loads(capsys.readouterr().out) == alone
    assert alone["device"] == "cuda" and alone["settings"]["num_anchors"] == 8
    assert not (tmp_path / "out").exists()
    # a folder of an earlier run (training would refuse it) is left exactly as it was
    out = tmp_path / "earlier"
    (out / "checkpoints" / "step_2").mkdir(parents=True)
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    flags = ["dflash", "train", "--target", str(target), "--out", str(out), "--device", "cpu",
             *shape, "--estimate"]
    # on CPU: the process's peak (its own ~0.4 GiB included) against the machine's memory
    assert main([*flags, "--device-memory", "300MiB"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("predicted peak resident memory of the process (CPU)")
    assert "per GPU" not in text and "does NOT fit in 0.3 GiB" in text
    assert main(["dflash", "estimate", "--target", str(target), "--device", "cpu", *shape,
                 "--device-memory", "300MiB"]) == 1
    step = "predicted peak of the training step's tensors"  # this process's size may move
    again = capsys.readouterr().out
    assert again[again.index(step):] == text[text.index(step):]
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) == before


#: each rank runs `dflash train --estimate` three times (a user error, an estimate as JSON, one
#: that does not fit), records the exit statuses, waits for the other rank's record (torchrun
#: stops the others at the first rank that exits non-zero) and exits with the last status
RANK_WORKER = """
import json, os, sys, time
from pathlib import Path
from lengthwise.cli import main

out, flags = Path(sys.argv[1]), ["dflash", "train", *sys.argv[2:], "--estimate"]
codes = [main([*flags, "--block-size", "1"]), main([*flags, "--json"]),
         main([*flags, "--device-memory", "300MiB"])]
import torch
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({
    "codes": codes, "group": torch.distributed.is_initialized(),
    "cuda": torch.cuda.is_initialized()}))
deadline = time.monotonic() + 60
while len(list(out.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(codes[-1])
"""


@pytest.mark.slow
def test_train_estimate_under_torchrun_prints_once_and_every_rank_exits_alike(tmp_path):
    """Two real ranks: rank 0 prints the estimate, both exit with its verdict, neither joins a
    process group or starts CUDA; a user error is its one line on each rank, exit 2 on both."""
    import subprocess

    from _cli import launcher

    target = _estimate_target(tmp_path / "target")
    script = tmp_path / "worker.py"
    script.write_text(RANK_WORKER)
    launch, env = launcher(nproc=2)
    proc = subprocess.run(
        [*launch, str(script), str(tmp_path), "--target", str(target), "--out",
         str(tmp_path / "out"), "--device", "cpu", "--max-tokens", "256", "--block-size", "4",
         "--max-slots", "128", "--draft-layers", "1", "--head-chunk", "32"],
        env=env, capture_output=True, text=True, timeout=180)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1] == {"codes": [2, 0, 1], "group": False, "cuda": False}, \
        proc.stderr[-3000:]
    assert proc.returncode != 0  # torchrun reports the ranks' verdict: does not fit
    assert proc.stdout.count("predicted peak resident memory of the process (CPU): ") == 1
    assert proc.stdout.count("does NOT fit in 0.3 GiB") == 1
    assert proc.stdout.count('"measure"') == 1
    printed = json.loads(proc.stdout[:proc.stdout.index("}\npredicted peak") + 1])
    assert len(printed["parts_gib"]) >= 4 and len(printed["step"]["parts_gib"]) >= 4
    assert proc.stderr.count("lengthwise dflash: error:") == 2  # the package's errors: each rank
    assert "block_size" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_train_lists_estimate_and_refuses_its_flags_without_it(tmp_path, capsys):
    from lengthwise.cli import main

    assert main(["dflash", "train", "--target", str(tmp_path), "--data", str(tmp_path),
                 "--world", "2", "--device-memory", "h200"]) == 2
    assert "--world, --device-memory: read with --estimate only" in capsys.readouterr().err
    assert main(["dflash", "train", "--estimate"]) == 2
    assert "--target is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dflash", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--estimate print the run's predicted peak memory (per GPU on CUDA, the process's "
            "resident memory on CPU)") in text
    # the estimate's own options are named once, with where their help is
    assert "(--rows, --world, --device-memory, --json, --time, --profile-steps, " in text
    assert "--device-profile, --save-profile): see its --help" in text
    assert "--device-memory SIZE" not in text
    with pytest.raises(SystemExit):
        main(["dflash", "--help"])
    assert "with --time the run's time" in " ".join(capsys.readouterr().out.split())


def test_without_device_memory_the_selected_cuda_device_is_judged(tmp_path, capsys,
                                                                   monkeypatch):
    """A run on a CUDA device torch sees is judged against that device's memory; a CPU run,
    or no GPU, gets no verdict."""
    from types import SimpleNamespace

    from lengthwise.cli import main

    tiny_qwen3_config().save_pretrained(tmp_path)
    asked = []

    def properties(device):
        asked.append(str(device))
        return SimpleNamespace(total_memory=2**30)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    flags = ["--target", str(tmp_path), "--max-tokens", "256", "--block-size", "4",
             "--draft-layers", "1", "--head-chunk", "32"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["dflash", "estimate", *flags]) == 0
    assert "fit" not in capsys.readouterr().out and not asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["dflash", "estimate", *flags, "--device", "cuda:1"]) == 1
    assert "does NOT fit in 1.0 GiB" in capsys.readouterr().out and asked == ["cuda:1"]
    assert main(["dflash", "train", *flags, "--estimate"]) == 0  # training's default: cpu
    assert "fit" not in capsys.readouterr().out and asked == ["cuda:1"]
