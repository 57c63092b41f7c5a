"""``lengthwise doctor`` on the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lengthwise.cli import main

from simulated_logs.runs import simulate_run


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("logs")
    return {
        "bands": simulate_run("bucketed", steps=1500, seed=1, checkpoint_every=250,
                              random_spikes=3, spike_height=1.2).write(d / "bands.jsonl"),
        "saw": simulate_run("sorted_megabatch", steps=1500, seed=2,
                            megabatch=25).write(d / "saw.jsonl.gz"),
    }


def test_text_report(logs, capsys) -> None:
    assert main(["doctor", str(logs["bands"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"lengthwise doctor: {logs['bands']}")
    for word in ("phases", "stable region", "loss_roughness", "3 bands", "cliffs",
                 "not associated", "attribution", "verdict", "--order stratified"):
        assert word in out


def test_json_report_keys(logs, capsys) -> None:
    assert main(["doctor", str(logs["saw"]), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"stable_region", "stats", "bands", "periodicity", "cliffs",
                      "checkpoint_association", "attribution", "verdict"}
    assert d["periodicity"]["period"] == 25
    assert d["checkpoint_association"]["associated"] is None


def test_several_logs_compare_side_by_side(logs, capsys) -> None:
    assert main(["doctor", str(logs["bands"]), str(logs["saw"]), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d) == ["runs"] and set(d["runs"]) == {str(logs["bands"]), str(logs["saw"])}
    assert d["runs"][str(logs["bands"])]["bands"]["count"] == 3
    assert main(["doctor", str(logs["bands"]), str(logs["saw"])]) == 0
    out = capsys.readouterr().out
    table = out[out.index("comparison"):]
    assert "bands " in table and "period (steps)" in table and "single_bucket_batches" in table


def test_options_from_to_keys_checkpoint_every(logs, capsys) -> None:
    assert main(["doctor", str(logs["bands"]), "--json", "--from", "700", "--to", "1400",
                 "--checkpoint-every", "250", "--loss-key", "loss", "--step-key", "step"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["stable_region"]["start"], d["stable_region"]["end"]) == (700, 1400)
    assert d["checkpoint_association"]["source"] == "--checkpoint-every 250"


def test_plot_writes_png(logs, tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "doctor.png"
    assert main(["doctor", str(logs["bands"]), str(logs["saw"]), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_clear_error(logs, tmp_path: Path, capsys,
                                                  monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["doctor", str(logs["bands"]), "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lengthwise doctor: error: --plot needs matplotlib")


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ('{"step": 1, "acc": 1}\n', "no row with a loss field"),
    ("not json\n{\n", "2 malformed"),
])
def test_bad_input_exits_2_with_message(tmp_path: Path, capsys, content: str,
                                        message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert main(["doctor", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lengthwise doctor: error: ") and message in err


def test_missing_file_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["doctor", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_range_exits_2(logs, capsys) -> None:
    assert main(["doctor", str(logs["bands"]), "--from", "900", "--to", "100"]) == 2
    assert "after --to" in capsys.readouterr().err


def test_user_errors_exit_2_with_one_line_and_no_traceback(tmp_path, capsys) -> None:
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,accuracy\n1,0.5\n2,0.6\n")
    for argv in (["doctor", str(csv)], ["doctor", str(tmp_path / "missing.jsonl")],
                 ["doctor", str(csv), "--steps-per-epoch", "-1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("lengthwise doctor: error: ") and err.count("\n") == 1
        assert "Traceback" not in err
    main(["doctor", str(csv)])
    assert "--loss-key" in capsys.readouterr().err


def test_steps_per_epoch_names_the_mega_batch_cycle(logs, capsys) -> None:
    # a 25-step cycle is min(N // (4 * batch), 50) = 25 for 100 steps per epoch, and nothing else;
    # the log's epoch field says 750 steps per epoch: 25 steps only with 2 processes (assumed)
    assert main(["doctor", str(logs["saw"]), "--json"]) == 0
    causes = json.loads(capsys.readouterr().out)["verdict"]["causes"]
    cause = next(c for c in causes if c["cause"] == "sorted_batches_cycle")
    assert any("/ 2 = 25 steps" in e and "world size 2 assumed" in e for e in cause["evidence"])
    assert main(["doctor", str(logs["saw"]), "--json", "--world-size", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["context"]["world_size"] == 1
    assert any(c["cause"] == "periodic_unknown" for c in d["verdict"]["causes"])
    assert main(["doctor", str(logs["saw"]), "--json", "--steps-per-epoch", "100",
                 "--batch-size", "16", "--world-size", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["context"]["steps_per_epoch"] == 100 and d["context"]["batch_size"] == 16
    cause = next(c for c in d["verdict"]["causes"] if c["cause"] == "sorted_batches_cycle")
    assert any("min(1 x 100 // 4, 50) / 1 = 25 steps" in e for e in cause["evidence"])


def test_checkpoint_interval_longer_than_the_run(logs, capsys) -> None:
    assert main(["doctor", str(logs["bands"]), "--checkpoint-every", "3000", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["checkpoint_association"]["note"]
    assert "exceeds the" in note and "pass --checkpoint-every" not in note


def test_comparison_table_says_what_the_sections_say(logs, capsys) -> None:
    assert main(["doctor", str(logs["bands"]), str(logs["saw"])]) == 0
    out = capsys.readouterr().out
    table = out[out.index("comparison"):]
    bands_row = next(line for line in table.splitlines() if line.startswith("bands"))
    assert bands_row.split()[1:] == ["3", "none"]
