"""``lengthwise plan`` end to end, through the console entry point."""

import json
import subprocess
import sys

import numpy as np

from lengthwise.cli import main


def test_plan_json_compare(capsys):
    assert main(["plan", "coqa", "--max-tokens", "4096", "--world-size", "2", "--compare",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("padding_efficiency", "efficiency_vs_sorted", "step_length_cv", "step_cv_ratio",
                "rank_imbalance_p50", "rank_imbalance_p99", "max_same_bucket_run",
                "recomposition", "plan_seconds", "edges", "num_batches", "truncated"):
        assert key in out
    assert set(out["strategies"]) == {"sorted", "random", "bucket-random", "interleave",
                                      "stratified"}
    assert out["strategies"]["random"]["padding_efficiency"] < out["padding_efficiency"]


def test_plan_text_and_saved_plan(tmp_path, capsys):
    lengths = np.random.default_rng(0).integers(1, 500, 3000)
    np.save(tmp_path / "l.npy", lengths)
    out_file = tmp_path / "plan.npz"
    assert main(["plan", str(tmp_path / "l.npy"), "--batch-size", "8", "--buckets", "4",
                 "--order", "interleave", "--out", str(out_file)]) == 0
    text = capsys.readouterr().out
    assert "4 buckets" in text and "padding_efficiency" in text
    saved = np.load(out_file)
    assert np.array_equal(np.sort(saved["indices"]), np.arange(3000))


def test_bad_input_exits_2_with_a_message(tmp_path):
    (tmp_path / "bad.txt").write_text("3\n-1\n")
    proc = subprocess.run([sys.executable, "-m", "lengthwise", "plan", str(tmp_path / "bad.txt")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "row 1: -1 is negative" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "lengthwise", "plan", "sft_mix", "--buckets",
                           "x,y"], capture_output=True, text=True)
    assert proc.returncode == 2 and "edges must be integers" in proc.stderr


def test_more_ranks_than_batches_needs_a_counted_policy(capsys):
    assert main(["plan", "coqa", "--batch-size", "1", "--world-size", "1000"]) == 2
    assert "cannot give each of 1000 ranks" in capsys.readouterr().err
    assert main(["plan", "coqa", "--batch-size", "1", "--world-size", "1000", "--even-out",
                 "repeat", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["repeated"] == 300 and out["unique_samples"] == 700
