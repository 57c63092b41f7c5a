"""``lengthwise demo --task dflash`` end to end at toy size, its errors, and the GPU benchmark."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from lengthwise.cli import main as cli_main
from lengthwise.demo.config import DFlashDemoConfig
from lengthwise.demo.dflash import DFLASH_KEYS, render_dflash, run_dflash_demo

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dflash_demo_trains_decodes_and_reports(tmp_path):
    from lengthwise.demo.corpus import stdlib_docstrings

    texts = tmp_path / "texts.jsonl"
    import json

    texts.write_text("\n".join(json.dumps({"text": t})
                               for t in stdlib_docstrings(limit_files=60)[:400]))
    cfg = DFlashDemoConfig(steps=6, grad_accum=2, target_size="tiny", target_steps=6,
                           texts=120, eval_samples=8, eval_prompts=2, max_new_tokens=8,
                           max_len=96, prompt_len=16, response_len=32, progress=False)
    summary = run_dflash_demo(cfg, orders=["random", "packed"], out=tmp_path / "out",
                              data=texts, cache_dir=tmp_path / "cache", vocab_size=300,
                              plot=False)
    rows = summary["strategies"]
    assert list(rows) == ["random", "packed"]
    for name, row in rows.items():
        assert list(row)[: len(DFLASH_KEYS)] == list(DFLASH_KEYS)
        assert row["lossless"] is True, name
        assert 1.0 <= row["acceptance_length"] <= cfg.block_size
        assert 1.0 <= row["simulated_acceptance_length"] <= cfg.block_size
        assert 0 <= row["accuracy_final"] <= 1 and row["padding_efficiency"] <= 1
        assert Path(row["log"]).is_file()
        # the exported draft, loaded back, through the eval stage at T 0 and 1
        assert (Path(row["export"]) / "model.safetensors").is_file()
        stage = row["eval_stage"]
        assert [(r["set"], r["temperature"], r["prompts"]) for r in stage] == [
            (name, 0.0, cfg.eval_prompts), (name, 1.0, cfg.eval_prompts)]
        assert stage[0]["mismatches"] == 0 and "mismatches" not in stage[1]
        assert all(1.0 <= r["acceptance_length"] <= cfg.block_size for r in stage)
    text = render_dflash(summary)
    assert "acceptance_length" in text and "doctor:" in text
    markdown = (tmp_path / "out" / "summary.md").read_text()  # as README says it writes
    assert "| random |" in markdown and "| packed |" in markdown
    assert "acceptance_length" in markdown and "tokens_per_second" in markdown
    assert "eval stage" in text and "random | 1 | 2 |" in text
    # the target and its regenerated data are cached: a second run builds nothing
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir() if "dflash" in p.name)
    assert any(n.startswith("dflash-target-") for n in cached)
    assert any(n.startswith("dflash-data-") for n in cached)
    assert summary["data"]["target"] == "tiny Llama-style model trained here"
    short = DFlashDemoConfig(**{**cfg.__dict__, "steps": 2})
    reused = run_dflash_demo(short, orders=["sorted"], out=tmp_path / "out4", data=texts,
                             cache_dir=tmp_path / "cache", vocab_size=300, plot=False)
    assert reused["data"]["target"].startswith("tiny Llama-style model trained earlier, "
                                                "loaded from ")
    # --target PATH: a local Hugging Face checkpoint (here the cached target) drafts the same way
    path = next(p for p in (tmp_path / "cache").iterdir()
                if p.name.startswith("dflash-target-") and not p.name.endswith("-run"))
    tok = next((tmp_path / "cache").glob("tokenizer-*.json"))
    again = run_dflash_demo(DFlashDemoConfig(**{**cfg.__dict__, "steps": 2}), orders=["sorted"],
                            out=tmp_path / "out2", target=path, tokenizer=tok, data=texts,
                            cache_dir=tmp_path / "cache", plot=False)
    assert again["data"]["target"] == str(path)
    assert again["strategies"]["sorted"]["lossless"] is True
    with pytest.raises(ValueError, match="no tokenizer.json"):
        run_dflash_demo(cfg, orders=["sorted"], out=tmp_path / "out3", target=path, data=texts,
                        cache_dir=tmp_path / "cache", plot=False)


@pytest.mark.parametrize("argv, message", [
    (["demo", "--target", "x"], "--target needs --task dflash"),
    (["demo", "--task", "dflash", "--orders", "shuffled"], "unknown order"),
    (["demo", "--task", "dflash", "--max-len", "100"], "(use --max-len 176 or more)"),
])
def test_user_errors_exit_2_with_one_line(argv, message, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("argv, message", [
    (["demo", "--block-size", "4"], "--block-size needs --task dflash"),
    (["demo", "--warmup-ratio", "0.2"], "--warmup-ratio needs --task dflash"),
    (["demo", "--max-new-tokens", "8"], "--max-new-tokens needs --task dflash"),
    (["demo", "--task", "dflash", "--model-size", "small"], "--model-size is for --task lm"),
])
def test_an_option_of_the_other_task_is_an_error(argv, message, capsys, monkeypatch):
    import lengthwise.demo.dflash as dflash_demo
    import lengthwise.demo.main as demo_main

    def no_run(*args, **kwargs):
        raise AssertionError("the demo ran with an option its task ignores")

    monkeypatch.setattr(demo_main, "prepare_data", no_run)
    monkeypatch.setattr(dflash_demo, "prepare", no_run)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_out_at_a_file_is_a_user_error(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli_main(["demo", "--out", str(afile / "sub")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert cli_main(["demo", "--cache-dir", str(afile)]) == 2
    assert f"--cache-dir {afile}: exists and is not a folder" in capsys.readouterr().err


def test_help_states_each_default_once(capsys):
    with pytest.raises(SystemExit):
        cli_main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text
    assert ("(default: 10% of each order's steps; with --task dflash: --warmup-ratio of "
            "--steps)") in text
    assert "--epochs EPOCHS lm: epochs per order over the same samples" in text
    assert "--steps STEPS dflash: optimizer steps per order (default: 50)" in text


def test_gpu_benchmark_smoke_on_cpu(tmp_path):
    script = runpy.run_path(str(ROOT / "benchmarks" / "gpu_dflash.py"))
    summary = script["main"](["--device", "cpu", "--smoke", "--orders", "sorted,packed",
                              "--out", str(tmp_path / "bench")])
    rows = summary["strategies"]
    assert set(rows) == {"sorted", "packed"}
    assert all(r["tokens_per_second"] > 0 and r["lossless"] for r in rows.values())
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench.md").is_file()
