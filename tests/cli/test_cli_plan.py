"""``lengthwise plan`` end to end, through the console entry point."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from lengthwise.cli import main
from lengthwise.planning.config import PlanConfig


def test_plan_json_compare(capsys):
    assert main(["plan", "coqa", "--max-tokens", "4096", "--world-size", "2", "--compare",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("padding_efficiency", "efficiency_vs_sorted", "step_length_cv", "step_cv_ratio",
                "rank_imbalance_p50", "rank_imbalance_p99", "max_same_bucket_run",
                "recomposition", "plan_seconds", "edges", "micro_batches_per_rank",
                "micro_batches", "truncated", "truncated_share", "notes"):
        assert key in out
    assert "num_batches" not in out  # per rank or all ranks: named so
    assert out["micro_batches"] == 2 * out["micro_batches_per_rank"]
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


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "lengthwise", *args], capture_output=True,
                          text=True, **kw)


def _one_line_error(proc, match):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert match in lines[0], lines[0]


def test_out_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    _one_line_error(_run("plan", "coqa", "--out", "afile/p.npz", cwd=tmp_path),
                    "--out afile/p.npz: afile is not a folder")
    _one_line_error(_run("plan", "coqa", "--out", "adir", cwd=tmp_path),
                    "--out adir is a folder; give a file name")
    _one_line_error(_run("plan", "coqa", "--out", "nowhere/p.npz", cwd=tmp_path),
                    "nowhere does not exist")
    assert _run("plan", "coqa", "--out", "p.plan", cwd=tmp_path).returncode == 0
    assert (tmp_path / "p.plan").is_file()  # exactly the name given, no ".npz" added


def test_user_errors_are_one_line(tmp_path):
    _one_line_error(_run("plan", "coqa", "--max-tokens", "0"), "max_tokens must be a positive")
    _one_line_error(_run("plan", "coqa", "--buckets", "0,900"), "bucket edges must be >= 1")
    _one_line_error(_run("plan", "coqa", "--layout", "pack", "--order", "sorted"),
                    "layout='pack' supports order in")
    _one_line_error(_run("plan", "coqa", "--on-overflow", "split"), "it needs layout='pack'")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    _one_line_error(_run("plan", str(tmp_path / "bin.txt")), "not UTF-8 text")


@pytest.mark.parametrize("argv, match", [
    (["plan", "coqa", "--max-len", "abc"], "argument --max-len: invalid int value: 'abc'"),
    (["plan", "coqa", "--order", "shuffled"], "argument --order: invalid choice: 'shuffled'"),
    (["plan"], "the following arguments are required: lengths"),
    (["plan", "coqa", "--batch-size", "4", "--max-tokens", "64"], "not allowed with"),
    (["demo", "--task", "foo"], "argument --task: invalid choice: 'foo'"),
    (["demo", "--steps", "abc"], "argument --steps: must be a positive integer, got 'abc'"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_usage_errors_are_one_line(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # no usage block
    assert match in err and "--help)" in err, err


def test_edges_above_a_row_of_the_budget(capsys):
    assert main(["plan", "sft_mix", "--buckets", "1024,2048,4096,8192", "--max-tokens", "4096",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["edges"] == [1024, 2048, 4096, 8192] and out["truncated"] > 0


def test_json_into_a_closed_pipe_is_not_an_error():
    proc = subprocess.Popen([sys.executable, "-m", "lengthwise", "plan", "coqa", "--compare",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head` does, before anything was written
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and "BrokenPipeError" not in err and "Traceback" not in err


def test_help_gives_every_option_a_text_and_its_default():
    from lengthwise.cli import build_parser

    parser = build_parser()
    plan = next(a for a in parser._subparsers._group_actions[0].choices.items()
                if a[0] == "plan")[1]
    options = [a for a in plan._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 17
    for action in options:
        assert action.help and "(default: " in action.help, action.option_strings
    order = next(a for a in options if a.dest == "order")
    assert "(default: stratified)" in order.help


def test_readme_synopsis_lists_every_option():
    from pathlib import Path

    from lengthwise.cli import build_parser

    guide = (Path(__file__).resolve().parents[2] / "docs" / "first-ten-minutes.md").read_text()
    synopsis = guide.split("```\nlengthwise plan LENGTHS", 1)[1].split("```", 1)[0]
    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    for action in plan._actions:
        if action.option_strings and action.dest != "help":
            assert f"[{action.option_strings[0]}" in synopsis or \
                f"| {action.option_strings[0]}" in synopsis, action.option_strings[0]
    for order in plan._option_string_actions["--order"].choices:
        assert order in synopsis


def test_compare_with_one_micro_batch_per_step_says_why(capsys):
    assert main(["plan", "coqa", "--max-tokens", "4096", "--compare"]) == 0
    text = capsys.readouterr().out
    assert "every optimizer step is one micro-batch" in text
    assert main(["plan", "coqa", "--max-tokens", "4096", "--compare", "--world-size", "2",
                 "--grad-accum", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notes"] == []
    assert out["strategies"]["stratified"]["step_cv_ratio"] < (
        out["strategies"]["sorted"]["step_cv_ratio"])


def test_one_order_at_one_rank_notes_what_step_cv_ratio_cannot_tell(capsys):
    assert main(["plan", "coqa", "--max-tokens", "4096"]) == 0
    text = capsys.readouterr().out
    assert "step_cv_ratio" in text and "every optimizer step is one micro-batch" in text
    assert main(["plan", "coqa", "--max-tokens", "4096", "--grad-accum", "4"]) == 0
    assert "every optimizer step is one micro-batch" not in capsys.readouterr().out


def test_cut_tokens_are_a_line_of_the_output(capsys):
    assert main(["plan", "sft_mix", "--max-len", "8192"]) == 0
    text = capsys.readouterr().out
    assert "warning: 7.1% of the tokens are cut: 254 samples truncated to 8192 tokens" in text
    assert "truncated=254" in text


def test_packed_layout(tmp_path, capsys):
    out_file = tmp_path / "pack.npz"
    assert main(["plan", "coqa", "--layout", "pack", "--max-tokens", "4096", "--world-size", "2",
                 "--out", str(out_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"] == "pack" and out["capacity"] == 4096 and out["fill"] > 0.95
    saved = np.load(out_file)
    assert np.array_equal(np.sort(saved["indices"]), np.arange(700))
    assert main(["plan", "coqa", "--layout", "pack", "--max-tokens", "4096", "--compare"]) == 0
    text = capsys.readouterr().out
    assert "packed rows of 4096 tokens" in text and "bucket-random" not in text


def test_json_figures_hold_no_nan_and_no_numpy_scalars():
    import json

    import numpy as np

    from lengthwise.cli.plan import _clean

    out = _clean({"a": float("nan"), "b": np.int64(2), "c": [1.0, float("inf")], "num_batches": 3})
    assert out == {"a": None, "b": 2, "c": [1.0, None]}
    json.dumps(out, allow_nan=False)  # strict JSON


@pytest.mark.parametrize("argv, match", [
    (["--layout", "pack", "--pad-multiple", "8"],
     "--pad-multiple 8 rounds padded rows up, but --layout pack has no padded rows"),
    (["--layout", "pack", "--buckets", "4"], "--buckets 4 sets the buckets of padded rows"),
])
def test_padded_options_with_the_packed_layout_are_errors(argv, match, capsys):
    assert main(["plan", "coqa", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err


@pytest.mark.parametrize("content, match", [
    (b"", "the file is empty (0 bytes)"),
    (b"hello world", "not a .npy file"),
    ("cut data", "the file is cut short: its header promises more data than it holds"),
    ("cut header", "a cut or corrupt .npy header"),
    ("objects", "the array holds Python objects, not numbers"),
])
def test_a_broken_npy_is_one_line_naming_the_file(tmp_path, content, match, capsys):
    path = tmp_path / "lens.npy"
    if content == "objects":
        np.save(path, np.array([3, "a"], dtype=object))
    elif isinstance(content, str):
        np.save(path, np.arange(1, 1000))
        whole = path.read_bytes()
        path.write_bytes(whole[:500] if content == "cut data" else whole[:60])
    else:
        path.write_bytes(content)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot read lengths from {path}: {match}" in err, err


def test_help_names_every_lengths_source(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for source in ("FILE.jsonl:FIELD", "FILE.parquet:COLUMN", "FILE.arrow:COLUMN", "PREFIX.idx",
                   "FOLDER:COLUMN"):
        assert source in text


def test_plan_command_imports_neither_torch_nor_the_other_commands(tmp_path):
    np.save(tmp_path / "l.npy", np.random.default_rng(0).integers(1, 500, 2000))
    code = ("import sys\nfrom lengthwise.cli import main\n"
            f"assert main(['plan', {str(tmp_path / 'l.npy')!r}, '--world-size', '2']) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
            "             or m.startswith(('lengthwise.demo', 'lengthwise.dflash',\n"
            "                              'lengthwise.cli.demo', 'lengthwise.cli.dflash',\n"
            "                              'lengthwise.doctor', 'lengthwise.train'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_command_alone_parses_as_with_every_command():
    from lengthwise.cli import build_parser, commands

    argv = ["plan", "x.npy", "--buckets", "4", "--world-size", "8"]
    assert vars(build_parser("plan").parse_args(argv)) == vars(build_parser().parse_args(argv))
    assert "plan" in commands() and "demo" in commands()


@pytest.mark.parametrize("low, top", [(1_500, 3_000), (32_000, 32_767), (30_000, 60_000)])
def test_bucket_table_counts_and_efficiency_equal_the_wide_sums(low, top):
    """The bucket table's counts and per-bucket padding efficiency, from lengths gathered
    narrow, equal int64 sums over the plan's micro-batches, whose token sums exceed int16."""
    from lengthwise.cli.plan import _edge_table
    from lengthwise.planning.plan import plan_epoch

    lengths = np.random.default_rng(2).integers(low, top + 1, 4000)  # int16 or int32 narrowed
    plan = plan_epoch(lengths, PlanConfig(batch_size=16, buckets=3, pad_multiple=64))
    lens = plan.lengths.astype(np.int64)[plan.indices]
    per_batch = np.add.reduceat(lens, plan.offsets[:-1])
    padded = np.diff(plan.offsets) * (-(-np.maximum.reduceat(lens, plan.offsets[:-1]) // 64) * 64)
    assert per_batch.max() > 2**15
    edges = np.asarray(plan.edges)
    table = _edge_table(plan).splitlines()[2:]
    for k, line in enumerate(table):
        fields = line.split()
        assert int(fields[2]) == np.count_nonzero(np.searchsorted(edges, lens) == k)
        eff = per_batch[plan.bucket == k].sum() / padded[plan.bucket == k].sum()
        assert fields[4] == f"{eff:.3f}"


def test_compare_forms_the_next_epochs_batches_once_per_formation(monkeypatch, capsys):
    """The orders that cut batches inside buckets cut the same ones, whatever their order,
    balance or run limit: a comparison forms the next epoch's batch sets once for them."""
    from lengthwise.planning import padded
    from lengthwise.planning.config import PlanConfig

    lengths = np.random.default_rng(1).integers(1, 3000, 5000)
    sets = {}
    for order, balance, max_run in (("bucket-random", "none", 3), ("interleave", "none", 1),
                                    ("stratified", "level", 3), ("stratified", "none", 2)):
        cfg = PlanConfig(max_tokens=8192, world_size=4, grad_accum=2, order=order,
                         balance=balance, max_run=max_run)
        idx, off = padded.padded_batch_sets(lengths, cfg, seed=3, epoch=1)
        sets[order, balance, max_run] = (idx.tolist(), off.tolist())
    assert len({str(v) for v in sets.values()}) == 1
    formed = []
    real = padded.padded_batch_sets
    monkeypatch.setattr(padded, "padded_batch_sets",
                        lambda *a, **k: formed.append(a[1].order) or real(*a, **k))
    assert main(["plan", "coqa", "--max-tokens", "4096", "--world-size", "2", "--compare",
                 "--json"]) == 0
    by_order = json.loads(capsys.readouterr().out)["strategies"]
    assert sorted(formed) == ["bucket-random", "random", "sorted"]
    from lengthwise import load_lengths, plan_epoch, recomposition

    coqa = load_lengths("coqa")
    for order, got in by_order.items():  # as two whole plans of the order measure it
        plans = [plan_epoch(coqa, PlanConfig(max_tokens=4096, world_size=2, order=order), epoch=e)
                 for e in (0, 1)]
        assert got["recomposition"] == recomposition(*plans)


def test_auto_edges_keep_a_few_long_samples_apart_and_the_budget_fill_is_printed(tmp_path,
                                                                                capsys):
    """100,000 samples of 2,048 tokens and 5 of 8,192: two buckets, every micro-batch of the
    short ones full (not one bucket of two rows a micro-batch), the budget fill printed and
    the small bucket named in a note."""
    np.save(tmp_path / "c.npy", np.array([2048] * 100_000 + [8192] * 5))
    argv = ["plan", str(tmp_path / "c.npy"), "--max-tokens", "16384", "--world-size", "8"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["edges"] == [2048, 8192]
    assert out["micro_batches"] == 12504
    assert out["budget_fill"] == pytest.approx(out["padded_tokens"] / (16384 * 12504))
    assert out["budget_fill"] > 0.99
    assert any("edge 8192: 5 samples" in n and "4.00x" in n for n in out["notes"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "budget_fill              0.9999" in text
    assert "note: auto edges: 1 bucket(s) (edge 8192: 5 samples)" in text


def test_budget_fill_shows_what_a_padding_efficiency_near_one_hides(tmp_path, capsys):
    """One bucket of edge 8,192 for samples of 2,048 tokens: padding is near perfect, but a
    micro-batch holds two rows of 2,048 tokens out of 16,384."""
    np.save(tmp_path / "c.npy", np.array([2048] * 1000 + [8192] * 5))
    assert main(["plan", str(tmp_path / "c.npy"), "--max-tokens", "16384", "--buckets", "8192,",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["padding_efficiency"] > 0.98
    assert out["budget_fill"] == pytest.approx(
        out["padded_tokens"] / (16384 * out["micro_batches"]))
    assert 0.25 < out["budget_fill"] < 0.26


def test_compare_names_the_balanced_row(tmp_path, capsys):
    np.save(tmp_path / "l.npy", np.random.default_rng(0).integers(1, 8000, 5000))
    argv = ["plan", str(tmp_path / "l.npy"), "--max-tokens", "16384", "--world-size", "8",
            "--balance", "level"]
    assert main([*argv, "--compare", "--wide"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert sum("(balance level)" in r for r in rows) == 1
    assert any(r.strip().startswith("stratified (balance level)") for r in rows)
    assert main([*argv, "--compare"]) == 0  # one column per order: the header names it
    header = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("figure"))
    assert header.split()[-3:] == ["stratified", "(balance", "level)"]
    assert main(argv) == 0
    assert "order: stratified (balance level)" in capsys.readouterr().out
    assert main([*argv, "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["balance"] == "level" and out["strategies"]["interleave"]["balance"] == "none"


def test_lengths_whose_token_sums_would_overflow_are_one_line(tmp_path, capsys):
    np.save(tmp_path / "big.npy", np.array([2**61] * 8 + [5] * 8, dtype=np.int64))
    assert main(["plan", str(tmp_path / "big.npy"), "--batch-size", "3", "--buckets", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must stay below 2**62" in err


def test_text_fits_100_columns_unless_wide(capsys):
    """80 auto buckets and five orders side by side: the first and last buckets, one column
    per order and wrapped notes fit 100 columns; ``--wide`` lists every bucket, one row per
    order."""
    argv = ["plan", "sft_mix", "--compare", "--world-size", "8", "--grad-accum", "2",
            "--max-len", "8192"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 100
    buckets = int(re.search(r"^(\d+) buckets$", text, re.M).group(1))
    assert buckets > 11 and f"({buckets - 10} buckets more: --wide lists every bucket)" in text
    figures = {line.split()[0]: line.split()[1:] for line in text.splitlines()
               if line.split() and line.split()[0] in ("figure", "padding_efficiency")}
    assert figures["figure"] == ["sorted", "random", "bucket-random", "interleave", "stratified"]
    assert main([*argv, "--wide"]) == 0
    wide = capsys.readouterr().out
    rows = [line.split() for line in wide.splitlines()]
    assert sum(1 for r in rows if len(r) == 5 and r[0].isdigit() and "%" in r[3]) == buckets
    ordered = [r for r in rows if r and r[0] in ("sorted", "random", "stratified")]
    assert [r[0] for r in ordered] == ["sorted", "random", "stratified"]
    assert ordered[1][1] == figures["padding_efficiency"][1]  # the same figure either way
