"""``lengthwise demo``: corpus, tokenizer, the training loop, resume, the report, the CLI.

A crash in the middle of a checkpoint save is covered where the checkpoints
live: ``tests/train/checkpoint/test_checkpoint.py::
test_killed_in_the_middle_of_a_save_the_previous_checkpoint_loads``.
"""

from __future__ import annotations

import copy
import io
import json
import os
import runpy
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from lengthwise.cli import main as cli_main  # noqa: E402
from lengthwise.demo import runner  # noqa: E402
from lengthwise.demo.config import (  # noqa: E402
    DemoConfig,
    available_orders,
    parse_orders,
)
from lengthwise.demo.corpus import (  # noqa: E402
    corpus_fingerprint,
    load_corpus,
    load_texts,
    stdlib_docstrings,
)
from lengthwise.demo.data import DemoData  # noqa: E402
from lengthwise.demo.lm import token_losses  # noqa: E402
from lengthwise.demo.main import check_targets  # noqa: E402
from lengthwise.demo.report import JSON_KEYS, add_ratios, format_table  # noqa: E402
from lengthwise.demo.results import read_log  # noqa: E402
from lengthwise.demo.runner import OrderRun, train_order  # noqa: E402
from lengthwise.demo.tokenizer import EOS, encode_texts, get_tokenizer  # noqa: E402
from lengthwise.train.loop import make_sampler  # noqa: E402
from lengthwise.train.schedule import lr_factor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOG_FIELDS = {"step", "epoch", "loss", "lr", "grad_norm", "real_tokens", "padded_tokens",
              "tokens_per_second", "samples", "buckets", "bucket_loss", "corrected_loss"}
SMALL = dict(grad_accum=2, max_tokens=256, max_len=128, eval_samples=16, progress=False)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return stdlib_docstrings(limit_files=60)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def jsonl(texts, workdir) -> Path:
    path = workdir / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(texts, workdir):
    return get_tokenizer(texts, cache_dir=workdir / "cache", vocab_size=384)


@pytest.fixture(scope="module")
def data(texts, tok) -> DemoData:
    return DemoData.build(texts, tok, max_len=128, eval_samples=16, seed=0)


@pytest.fixture(scope="module")
def few(texts, tok) -> DemoData:
    """40 training samples: an epoch of 6-9 steps at :data:`SMALL`."""
    return DemoData.build(texts, tok, max_len=128, eval_samples=16, seed=0, max_samples=40)


# -- corpus, tokenizer, data ---------------------------------------------------------------
def test_stdlib_corpus_is_deterministic_unique_and_long_tailed(texts):
    assert texts == stdlib_docstrings(limit_files=60)
    assert len(texts) == len(set(texts)) > 200
    assert all(t == t.strip() and t for t in texts)
    chars = np.array([len(t) for t in texts])
    assert chars.max() > 20 * np.median(chars)  # one-line summaries and long guides


def test_stdlib_corpus_skips_installed_packages_and_broken_files(tmp_path):
    (tmp_path / "a.py").write_text('"""Module doc."""\ndef f():\n    """Function doc."""\n')
    (tmp_path / "broken.py").write_text('def f(:\n    """never read"""\n')
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "pkg.py").write_text('"""Third-party doc."""\n')
    (tmp_path / "b.py").write_text('class C:\n    """Module doc."""\n')  # a duplicate
    assert stdlib_docstrings(tmp_path) == ["Module doc.", "Function doc."]


def test_load_corpus_caches_the_stdlib_texts(tmp_path, monkeypatch):
    import lengthwise.demo.corpus as corpus

    calls = []
    monkeypatch.setattr(corpus, "stdlib_docstrings",
                        lambda root=None: calls.append(root) or ["x", "y"])
    assert load_corpus(cache_dir=tmp_path) == ["x", "y"]
    assert load_corpus(cache_dir=tmp_path) == ["x", "y"]
    assert len(calls) == 1


def test_load_texts_reads_jsonl_and_saved_datasets(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "a"}\n{"text": "  "}\n')
    assert load_texts(path) == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 2"):
        load_texts(bad)
    with pytest.raises(FileNotFoundError):
        load_texts(tmp_path / "missing.jsonl")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["one", "two", "one"]}).save_to_disk(tmp_path / "ds")
    assert load_texts(tmp_path / "ds") == ["one", "two"]
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(tmp_path / "ds2")
    with pytest.raises(ValueError, match="no 'text' column"):
        load_texts(tmp_path / "ds2")


def test_tokenizer_is_cached_by_corpus_and_loads_from_a_path(texts, tok, workdir):
    cached = list((workdir / "cache").glob("tokenizer-*-384.json"))
    assert len(cached) == 1 and corpus_fingerprint(texts) in cached[0].name
    again = get_tokenizer([], cache_dir=workdir / "cache", vocab_size=384,
                          fingerprint=corpus_fingerprint(texts))
    assert again.to_str() == tok.to_str()
    assert get_tokenizer([], path=cached[0]).to_str() == tok.to_str()
    assert tok.get_vocab_size() == 384 and tok.token_to_id(EOS) == 0
    ids = encode_texts(tok, [texts[0]])[0]
    assert ids[-1] == 0 and tok.decode(ids[:-1]) == texts[0]
    with pytest.raises(FileNotFoundError):
        get_tokenizer([], path=workdir / "nope.json")


def test_demo_data_holds_out_a_fixed_set_and_truncates(texts, tok, data):
    again = DemoData.build(texts, tok, max_len=128, eval_samples=16, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(data.eval, again.eval, strict=True))
    assert len(data.train) + len(data.eval) <= len(texts)
    assert int(data.lengths.max()) <= 128 and int(data.lengths.min()) >= 2
    held = {a.tobytes() for a in data.eval}
    assert not held & {a.tobytes() for a in data.train}
    with pytest.raises(ValueError, match="eval_samples"):
        DemoData.build(texts[:5], tok, max_len=128, eval_samples=16)


# -- configuration and schedule ------------------------------------------------------------
def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="max_len"):
        DemoConfig(max_tokens=128, max_len=256)
    with pytest.raises(ValueError, match="steps"):
        DemoConfig(steps=0)
    with pytest.raises(ValueError, match="epochs"):
        DemoConfig(epochs=0)
    with pytest.raises(ValueError, match="schedule"):
        DemoConfig(schedule="linear")
    with pytest.raises(ValueError, match="unknown order"):
        parse_orders("random,shuffled")


def test_learning_rate_warms_up_then_holds_or_decays():
    const = {"steps": 50, "warmup": 5, "schedule": "constant"}
    assert [lr_factor(s, **const) for s in range(6)] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]
    assert lr_factor(49, **const) == 1.0
    cos = {"steps": 50, "warmup": 5, "schedule": "cosine"}
    values = [lr_factor(s, **cos) for s in range(5, 51)]
    assert values[0] == 1.0 and values[-1] == pytest.approx(0.1)
    assert all(b <= a for a, b in zip(values, values[1:], strict=False))


# -- the training loop ---------------------------------------------------------------------
def test_step_loss_is_the_mean_over_every_token_of_the_step(data, tmp_path):
    cfg = DemoConfig(steps=1, **SMALL)
    run = OrderRun("random", data, cfg, out=tmp_path)
    model = copy.deepcopy(run.task.model)
    batches = []
    for rows in make_sampler("random", data.lengths, cfg):
        batches.append([i for row in rows for i in row])
        if len(batches) == cfg.grad_accum:
            break
    total, count, sizes = 0.0, 0, []
    with torch.no_grad():
        for b in batches:
            mb = run.loop.collate([[{"input_ids": data.train[i]} for i in b]])
            ce, predicted = token_losses(model, mb, torch.device("cpu"), None)
            n = int(predicted.sum())
            total, count = total + float(ce.sum()), count + n
            sizes.append(n)
    assert len(set(sizes)) > 1  # micro-batches of different token counts
    rec = run.loop.step()
    run.close()
    assert rec["loss"] == pytest.approx(total / count, rel=1e-5)
    assert rec["micro_batches"] == cfg.grad_accum
    assert rec["real_tokens"] == sum(int(data.lengths[b].sum()) for b in batches)


def test_the_micro_log_is_rank_0_of_8_simulated_ranks_and_leaves_the_training_alone(
        data, tmp_path, monkeypatch):
    cfg = DemoConfig(steps=3, **{**SMALL, "grad_accum": 8})
    run = OrderRun("bucket-random", data, cfg, out=tmp_path / "with")
    steps = [run.loop.step() for _ in range(3)]
    result = run.finish()
    monkeypatch.setattr(runner, "micro_ranks", lambda grad_accum, world=1: None)
    bare = OrderRun("bucket-random", data, cfg, out=tmp_path / "without")
    assert bare.loop.micro_logger is None
    same = [bare.loop.step() for _ in range(3)]
    bare.close()
    assert [r["loss"] for r in steps] == [r["loss"] for r in same]  # the same training
    assert not (tmp_path / "without" / "bucket-random" / "micro_log.jsonl").exists()
    path = Path(result.extra["micro_log"])
    assert path == tmp_path / "with" / "bucket-random" / "micro_log.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    plan, lines = rows[0], [r for r in rows if "event" not in r]
    assert plan["view"] == "micro-batch" and plan["world_size"] == result.extra["micro_world"] == 8
    assert plan["edges"] == [int(e) for e in run.loop.sampler.edges]
    # 8 micro-batches per step over 8 ranks: rank 0 logs one per step, from one bucket
    assert [r["optimizer_step"] for r in lines] == [1, 2, 3]
    assert all(r["micro_batches"] == 1 and len(r["buckets"]) == 1 for r in lines)
    assert all(r["real_tokens"] < s["real_tokens"] for r, s in zip(lines, steps, strict=True))


def test_orders_start_from_the_same_model_and_differ_only_in_batches(data, tmp_path):
    cfg = DemoConfig(steps=2, **SMALL)
    runs = [OrderRun(o, data, cfg, out=tmp_path) for o in ("sorted", "stratified")]
    for a, b in zip(runs[0].task.model.parameters(), runs[1].task.model.parameters(),
                    strict=True):
        assert torch.equal(a, b)
    first = [r.loop.step() for r in runs]
    for r in runs:
        r.close()
    assert first[0]["real_tokens"] != first[1]["real_tokens"]


def test_resume_from_a_checkpoint_continues_the_same_run(few, tmp_path):
    base = dict(checkpoint_every=3, keep_checkpoints=2, **SMALL)
    assert runner.order_steps("stratified", few.lengths, DemoConfig(**base)) == 7
    full = train_order("stratified", few, DemoConfig(**base), out=tmp_path / "a")
    ckpts = tmp_path / "a" / "stratified" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_3", "step_6"]
    # a second run that stopped after step 3: only that checkpoint exists
    (tmp_path / "b" / "stratified" / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpts / "step_3", tmp_path / "b" / "stratified" / "checkpoints" / "step_3")
    resumed = train_order("stratified", few, DemoConfig(resume=True, **base),
                          out=tmp_path / "b")
    a = read_log(full.log_path)
    b = read_log(resumed.log_path)
    assert [r["step"] for r in b] == [4, 5, 6, 7]
    assert [r["loss"] for r in b] == [r["loss"] for r in a[3:]]  # bit-identical
    assert [r["grad_norm"] for r in b] == [r["grad_norm"] for r in a[3:]]
    assert resumed.eval_loss == full.eval_loss
    events = [json.loads(line) for line in Path(resumed.log_path).read_text().splitlines()]
    assert {"event": "resume"}.items() <= events[0].items()


def test_resume_without_a_checkpoint_says_so(few, tmp_path, capsys):
    cfg = DemoConfig(resume=True, **SMALL)
    train_order("stratified", few, cfg, out=tmp_path)
    err = capsys.readouterr().err
    assert "resume: no checkpoint under" in err and "stratified starts from step 0" in err


def test_packed_strategy_fills_rows_without_padding(few, tmp_path):
    if "packed" not in available_orders():
        pytest.skip("the packed layout is not installed")
    res = train_order("packed", few, DemoConfig(**SMALL), out=tmp_path)
    recs = read_log(res.log_path)
    assert all(r["padded_tokens"] == r["micro_batches"] * SMALL["max_tokens"] for r in recs)
    assert res.padding_efficiency > 0.9
    assert np.isfinite(res.eval_loss)


@pytest.mark.parametrize("order", available_orders())
def test_every_order_trains_every_sample_once_per_epoch_in_its_own_steps(few, tmp_path, order):
    """Two epochs: each sample twice, the plan's micro-batches in steps of grad_accum (an
    epoch's short last step trained too), the schedule over the order's own steps, and the
    FLOPs of the micro-batches trained."""
    from collections import Counter

    from lengthwise.demo.flops import train_flops
    from lengthwise.demo.model import MODEL_SIZES

    cfg = DemoConfig(epochs=2, **SMALL)
    run = OrderRun(order, few, cfg, out=tmp_path)
    seen: list[int] = []
    sample = run.loop.sample
    run.loop.sample = lambda i: seen.append(int(i)) or sample(i)
    while not run.loop.done:
        run.loop.step()
    result = run.finish()
    assert Counter(seen) == dict.fromkeys(range(len(few.train)), 2)
    assert result.real_tokens == 2 * int(few.lengths.sum()) and result.epochs == 2.0
    sampler = make_sampler(order, few.lengths, cfg)
    per_epoch, flops = [], 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        per_epoch.append(-(-len(batches) // cfg.grad_accum))
        for rows in batches:
            if order == "packed":
                shape = (cfg.max_tokens // cfg.max_len, cfg.max_len)  # every row, full
            else:  # a row per sample, padded to the longest (cut to max_len), rounded up
                longest = min(max(int(few.lengths[i]) for row in rows for i in row), cfg.max_len)
                shape = (sum(map(len, rows)), -(-longest // cfg.pad_multiple) * cfg.pad_multiple)
            flops += train_flops(*shape, MODEL_SIZES["tiny"], vocab_size=few.vocab_size)
    assert result.steps == sum(per_epoch) == runner.order_steps(order, few.lengths, cfg)
    assert result.extra["flops"] == flops
    recs = read_log(result.log_path)
    assert [sum(r["epoch"] == e for r in recs) for e in range(2)] == per_epoch
    assert run.loop.cfg.steps == result.steps and run.loop.cfg.warmup_steps == max(
        1, result.steps // 10)
    micro = [json.loads(line) for line in Path(result.extra["micro_log"]).read_text().splitlines()]
    micro_steps = [r["step"] for r in micro if "event" not in r]
    assert micro_steps == sorted(set(micro_steps))  # a short step's line keeps its own number


def test_orders_that_pad_more_take_more_steps_for_the_same_data(few):
    steps = {o: runner.order_steps(o, few.lengths, DemoConfig(**SMALL))
             for o in ("sorted", "random", "stratified")}
    assert steps["random"] > steps["stratified"] and steps["random"] > steps["sorted"]
    twice = runner.order_steps("random", few.lengths, DemoConfig(epochs=2, **SMALL))
    assert steps["random"] < twice <= 2 * steps["random"] + 1


# -- the report ----------------------------------------------------------------------------
def test_ratios_and_checks():
    rows = {"sorted": {"tokens_per_second": 200.0, "loss_roughness": 0.2},
            "random": {"tokens_per_second": 50.0, "loss_roughness": 0.1, "eval_loss": 3.0},
            "stratified": {"tokens_per_second": 190.0, "loss_roughness": 0.11,
                           "eval_loss": 2.9}}
    add_ratios(rows)
    assert rows["random"]["throughput_vs_sorted"] == 0.25
    assert rows["stratified"]["roughness_ratio"] == pytest.approx(1.1)
    checks = check_targets(rows)
    assert checks["stratified_as_smooth_as_random"] is True
    assert checks["stratified_throughput_near_sorted"] is True
    assert checks["random_throughput_far_below_sorted"] is True
    assert checks["sorted_eval_worse_than_stratified"] is None  # sorted has no held-out loss
    assert checks["same_data_every_order"] is None  # no order counted its tokens
    del rows["sorted"]
    add_ratios(rows)
    assert rows["random"]["throughput_vs_sorted"] is None
    assert "random" in format_table(rows)


def test_the_table_and_the_verdict_quote_one_region(tmp_path):
    from lengthwise.demo.report import diagnose_runs
    from lengthwise.doctor import diagnose

    from simulated_logs.runs import simulate_run

    logs = {}
    for order in ("random", "stratified"):
        path = tmp_path / f"{order}.jsonl"
        rows = simulate_run(order, steps=600, seed=1).records
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        logs[order] = path
    region = (300, 600)
    for name, row in diagnose_runs(logs, region=region).items():
        own = diagnose(str(logs[name]))  # the doctor's own region differs
        assert own.phases.start != region[0]
        report = diagnose(str(logs[name]), start=region[0], end=region[1])
        assert row["loss_roughness"] == report.stats.loss_roughness
        assert row["verdict"] == report.verdict.summary
        assert row["stable_region"] == list(region)


def test_each_order_keeps_its_colour_and_the_residual_panel_has_a_scale(tmp_path):
    from lengthwise.demo.report import order_color, plot_curves, residual_ticks

    orders = available_orders()
    colours = [order_color(o, i) for i, o in enumerate(orders)]
    assert len(set(colours)) == len(orders)
    assert colours == [order_color(o, len(orders) - i) for i, o in enumerate(orders)]
    ticks, labels = residual_ticks([0.0, -0.2, -0.4], 0.2)
    assert len(ticks) == len(labels) == 9 and labels.count("0") == 3
    curves = {o: list(np.linspace(3, 2, 80) + 0.01 * np.sin(np.arange(80))) for o in orders}
    path = plot_curves(curves, tmp_path / "p.png", region=(20, 80),
                       roughness=dict.fromkeys(orders, 0.01))
    assert path.stat().st_size > 10_000


def test_every_failed_check_is_explained():
    from lengthwise.demo.main import render

    rows = {"sorted": {"tokens_per_second": 100.0, "loss_roughness": 0.1, "eval_loss": 1.0,
                       "real_tokens": 10, "flops": 5.0},
            "random": {"tokens_per_second": 95.0, "loss_roughness": 0.1, "eval_loss": 2.0,
                       "real_tokens": 10, "flops": 6.0},
            "stratified": {"tokens_per_second": 50.0, "loss_roughness": 0.2, "eval_loss": 4.0,
                           "real_tokens": 9, "flops": 5.0}}
    add_ratios(rows)
    checks = check_targets(rows)
    assert checks and not any(checks.values())  # every check fails here
    lines = render({"strategies": rows, "checks": checks}).splitlines()
    notes = [ln for ln in lines if ln.startswith("note: ")]
    assert [n.split()[1] for n in notes] == list(checks)


def test_the_table_points_to_the_order_experiment_with_seeds():
    # the demo is one seed at equal data: it says so, and where the comparison with
    # several seeds (same steps and data, or same compute) is
    from lengthwise.demo.main import render

    text = render({"strategies": {"random": {"eval_loss": 5.0, "real_tokens": 7},
                                  "sorted": {"eval_loss": 5.1, "real_tokens": 7}},
                   "config": {"epochs": 2}})
    assert "This is one seed. One seed cannot tell" in text
    assert "Every order trained the same 7 real tokens (2 epochs)" in text
    assert "benchmarks/order_arms.py" in text and "ORDER_ARMS.json" in text
    assert (ROOT / "benchmarks" / "order_arms.py").is_file()
    assert (ROOT / "benchmarks" / "ORDER_ARMS.json").is_file()


@pytest.mark.parametrize("doc, heading", [("README.md", "## The demo"),
                                          ("docs/demo.md", "### Measured")])
def test_measured_tables_have_the_printed_columns(doc, heading):
    """The demo tables of the docs use the printed column names, in the printed order."""
    from lengthwise.demo.report import TABLE_COLUMNS

    text = (ROOT / doc).read_text().split(heading, 1)[1]
    header = next(ln for ln in text.splitlines() if ln.startswith("| order |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    printed = [k for k, _ in TABLE_COLUMNS]
    assert [n for n in names if n in printed] == printed, names
    assert set(names) - set(printed) <= {"order", "verdict"}, names


# -- end to end ----------------------------------------------------------------------------
def test_demo_command_end_to_end(jsonl, workdir):
    out = workdir / "e2e"
    argv = ["demo", "--max-samples", "40", "--epochs", "2", "--grad-accum", "2", "--max-tokens",
            "256", "--max-len", "128", "--eval-samples", "16", "--vocab-size", "384", "--data",
            str(jsonl),
            "--cache-dir", str(workdir / "cache"), "--out", str(out), "--json",
            "--no-progress"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main(argv) == 0
    summary = json.loads(buf.getvalue())
    orders = list(available_orders())
    assert list(summary["strategies"]) == orders
    rows = summary["strategies"]
    assert summary["data"]["train_samples"] == 40 and summary["config"]["epochs"] == 2
    assert len({row["real_tokens"] for row in rows.values()}) == 1  # the same data
    assert summary["checks"]["same_data_every_order"] is True
    assert rows["random"]["steps"] > rows["stratified"]["steps"]  # random pads: more steps
    for name, row in rows.items():
        assert set(JSON_KEYS) <= set(row), name
        assert row["tokens_per_second"] > 0 and 0 < row["padding_efficiency"] <= 1
        assert np.isfinite(row["eval_loss"]) and row["loss_roughness"] >= 0
        assert isinstance(row["verdict"], str) and row["verdict"]
        assert row["micro_log"] == str(out / name / "micro_log.jsonl") and row["micro_verdict"]
        assert row["epochs"] == 2.0 and row["flops"] > 0
        recs = read_log(out / name / "train_log.jsonl")
        assert [r["step"] for r in recs] == list(range(1, row["steps"] + 1))
        # the verdict is what `lengthwise doctor --no-timing LOG` says of the same file
        doctor = io.StringIO()
        with redirect_stdout(doctor):
            assert cli_main(["doctor", "--json", "--no-timing",
                             str(out / name / "train_log.jsonl")]) == 0
        assert row["verdict"] == json.loads(doctor.getvalue())["verdict"]["summary"], name
        for rec in recs:
            assert LOG_FIELDS <= set(rec)
            assert rec["padded_tokens"] >= rec["real_tokens"] > 0
    assert summary["strategies"]["sorted"]["throughput_vs_sorted"] == 1.0
    assert summary["strategies"]["random"]["roughness_ratio"] == 1.0
    assert (out / "loss_curves.png").stat().st_size > 10_000
    assert json.loads((out / "summary.json").read_text())["strategies"].keys() == set(orders)
    # the plain table, without a plot, for two orders
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main([*argv[:-2], "--no-progress", "--no-plot", "--orders",
                         "random,stratified", "--out", str(workdir / "e2e2"), "--wide"]) == 0
    lines = buf.getvalue().splitlines()
    assert "doctor:" in lines
    # where each order's per-micro-batch log is (--grad-accum 2: rank 0 of 2 simulated ranks),
    # and what the doctor says of it
    where = next(ln for ln in lines if ln.startswith("per-micro-batch logs"))
    assert "over 2 simulated ranks" in where and where.endswith(
        f"{workdir / 'e2e2'}/<order>/micro_log.jsonl; the doctor on them:")
    assert [ln.split(":")[0] for ln in lines[lines.index(where) + 1:][:2]] == [
        "  random", "  stratified"]
    assert [ln.split()[0] for ln in lines[2:4]] == ["random", "stratified"]
    # without --wide the same figures fit 100 columns: one row per figure, one column per order
    from lengthwise.demo.main import render

    narrow = render(json.loads((workdir / "e2e2" / "summary.json").read_text())).splitlines()
    assert max(map(len, narrow)) <= 100 and narrow[0].split() == ["figure", "random", "stratified"]
    rows = {ln.split()[0]: ln.split()[1:] for ln in narrow[2:narrow.index("")]}
    assert rows["eval_loss"] == [lines[2].split()[-2], lines[3].split()[-2]]


def test_demo_command_reports_bad_options(capsys, jsonl):
    assert cli_main(["demo", "--orders", "sideways", "--data", str(jsonl)]) == 2
    assert "unknown order" in capsys.readouterr().err
    assert cli_main(["demo", "--max-tokens", "64", "--max-len", "128"]) == 2
    assert "max_len" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli_main(["demo", "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["--steps", "5"], "--steps is for --task dflash"),
    (["--task", "dflash", "--epochs", "2"], "--epochs is for --task lm"),
])
def test_each_task_refuses_the_other_tasks_run_length(argv, match, capsys, monkeypatch):
    import lengthwise.demo.main as demo_main

    monkeypatch.setattr(demo_main, "prepare_data", None)  # never reached
    assert cli_main(["demo", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("task, folder", [("lm", "lengthwise-demo/lm"),
                                          ("dflash", "lengthwise-demo/dflash")])
def test_each_task_writes_under_its_own_folder_by_default(task, folder, monkeypatch,
                                                          tmp_path, capsys):
    import lengthwise.demo.dflash as dflash_demo
    import lengthwise.demo.main as demo_main
    from lengthwise.errors import ConfigError

    seen = []

    def record(cfg, *, out, **kwargs):
        seen.append(str(out))
        raise ConfigError("stopped before training")

    monkeypatch.setattr(demo_main, "run_demo", record)
    monkeypatch.setattr(dflash_demo, "run_dflash_demo", record)
    monkeypatch.chdir(tmp_path)
    assert cli_main(["demo", "--task", task, "--no-progress"]) == 2
    assert seen == [folder]
    assert "stopped before training" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["lm", "dflash"])
@pytest.mark.parametrize("option, match", [
    (["--device", "tpu"], "device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["--dtype", "fp64"], "dtype must be one of fp32, bf16, fp16, got 'fp64'"),
    (["--threads", "-1"], "threads must be a positive integer, got -1"),
    (["--buckets", "0"], "buckets must be a positive integer, got 0"),
    (["--seed", "-1"], "seed must be a non-negative integer, got -1"),
])
def test_demo_options_are_checked_before_the_data(task, option, match, capsys, monkeypatch):
    import lengthwise.demo.dflash as dflash_demo
    import lengthwise.demo.main as demo_main

    def no_data(*args, **kwargs):
        raise AssertionError("the data were prepared before the options were checked")

    monkeypatch.setattr(demo_main, "prepare_data", no_data)
    monkeypatch.setattr(dflash_demo, "prepare", no_data)
    assert cli_main(["demo", "--task", task, *option]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err


def test_gpu_benchmark_runs_with_smoke_settings_on_cpu(tmp_path):
    script = runpy.run_path(str(ROOT / "benchmarks" / "gpu_throughput.py"))
    out = tmp_path / "gpu"
    buf = io.StringIO()
    with redirect_stdout(buf):
        summary = script["main"](["--device", "cpu", "--smoke", "--out", str(out),
                                  "--orders", "sorted,random,stratified"])
    assert set(summary["strategies"]) == {"sorted", "random", "stratified"}
    assert all(r["tokens_per_second"] > 0 for r in summary["strategies"].values())
    assert json.loads(out.with_suffix(".json").read_text())["timed_steps"] == 3
    assert "| stratified |" in out.with_suffix(".md").read_text()
    assert "stratified" in buf.getvalue()


@pytest.mark.slow
def test_two_process_run_under_torchrun(jsonl, workdir, tmp_path):
    out = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1")  # a crash shows every thread's Python stack
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--standalone", "-m", "lengthwise", "demo", "--max-samples", "40",
           "--grad-accum", "2", "--max-tokens", "256", "--max-len", "128",
           "--eval-samples", "16", "--vocab-size", "384", "--data", str(jsonl),
           "--cache-dir", str(workdir / "cache"), "--out", str(out), "--json",
           "--no-progress", "--no-plot", "--orders", "random,stratified"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert set(summary["strategies"]) == {"random", "stratified"}
    assert summary["data"]["world_size"] == 2
    row = summary["strategies"]["stratified"]
    assert row["real_tokens"] == summary["strategies"]["random"]["real_tokens"]
    recs = read_log(out / "stratified" / "train_log.jsonl")
    assert [r["step"] for r in recs] == list(range(1, row["steps"] + 1))
    assert all(r["micro_batches"] == 4 for r in recs[:-1])  # 2 ranks x 2 accumulation slots
    # the first line comes before torch and the corpus load, from rank 0 only
    first = "lengthwise demo: the lm task; loading torch"
    assert proc.stderr.startswith(first) and proc.stderr.count(first) == 1, proc.stderr[:500]


def test_table_columns_are_the_json_keys_and_verdicts_are_never_cut():
    from lengthwise.demo.main import render
    from lengthwise.demo.report import TABLE_COLUMNS

    verdict = ("the length bucket of each step drives its loss (no distinct bands) -> "
               "interleave or stratify length buckets: `lengthwise plan --order stratified`")
    rows = {"bucket-random": {"tokens_per_second": 10.0, "loss_roughness": 0.1,
                              "verdict": verdict}}
    summary = {"strategies": rows, "checks": {"stratified_as_smooth_as_random": False}}
    text = render(summary, wide=True)
    header = text.splitlines()[0].split()
    assert header == ["order", *(k for k, _ in TABLE_COLUMNS)]
    narrow = render(summary).splitlines()  # the same figures, one line each, in 100 columns
    assert [ln.split()[0] for ln in narrow[:2 + len(TABLE_COLUMNS)]] == [
        "figure", narrow[1].split()[0], *(k for k, _ in TABLE_COLUMNS)]
    verdict_lines = text.split("doctor:")[1].split("\n\n")[0]
    assert " ".join(verdict_lines.split()) == f"bucket-random {verdict}"
    assert "..." not in verdict_lines
    assert "note: stratified_as_smooth_as_random asks" in text


def test_lm_sample_losses_follow_packed_sample_boundaries():
    from lengthwise.demo.lm import LMTask
    from lengthwise.demo.model import build_model
    from lengthwise.pytorch.collate import PackCollator

    task = LMTask(build_model("tiny", vocab_size=64, max_len=16, seed=0), device="cpu",
                  max_len=8)
    batch = PackCollator(row_capacity=8, pad_to_capacity=True, pad_token_id=0,
                         return_flash_attn_kwargs=False)(
        [[{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9, 10, 11]}], [{"input_ids": [3, 4]}]])
    prepared = task.prepare(batch, [[0, 1], [2]], 0)
    with torch.no_grad():
        out = task.forward(task.model, prepared)
    counts = [2, 3, 1]  # predicted tokens of each sample (the first token of each is not)
    assert len(out.sample_losses) == 3
    total = sum(x * n for x, n in zip(out.sample_losses, counts, strict=True))
    assert total == pytest.approx(float(out.loss), rel=1e-5) and out.norm == sum(counts)
    assert out.sample_weights == counts


def test_data_folder_that_is_not_a_saved_dataset_is_named(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "texts").mkdir()
    with pytest.raises(ValueError, match="texts: not a Hugging Face dataset saved with "
                                         "save_to_disk"):
        load_corpus(tmp_path / "texts", cache_dir=tmp_path / "cache")


def test_code_layout_names_every_module_of_the_demo():
    import pkgutil

    import lengthwise.demo

    text = (ROOT / "docs/demo.md").read_text().split("### Code layout", 1)[1]
    text = text.split("\n### ", 1)[0]
    for info in pkgutil.iter_modules(lengthwise.demo.__path__):
        assert f"`{info.name}.py`" in text, info.name


def test_the_training_bar_starts_once_for_all_orders(capsys):
    """Building each order's run draws no bar of its own: one ``0/N`` line, then the steps."""
    import time
    from types import SimpleNamespace

    from lengthwise.demo.runner import run_lockstep

    class Run:
        def __init__(self) -> None:
            time.sleep(0.15)  # building a run outlasts the bar's redraw interval, as a model does
            self.loop = SimpleNamespace(step_count=0, done=False, step=self.step)

        def step(self) -> dict:
            self.loop.step_count += 1
            self.loop.done = self.loop.step_count == 2
            return {"loss": 1.0}

        def finish(self) -> int:
            return self.loop.step_count

        def close(self) -> None:
            pass

    done = run_lockstep(["a", "b", "c", "d"], lambda order: Run(), steps=2, progress=True)
    assert done == {"a": 2, "b": 2, "c": 2, "d": 2}
    frames = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert sum(" 0/8 " in f for f in frames) == 1, frames


def test_progress_lines_come_from_rank_0_only(capsys):
    from types import SimpleNamespace

    from lengthwise.train.device import say

    say(SimpleNamespace(rank=1, world_size=2), "from rank 1")
    say(SimpleNamespace(rank=0, world_size=2), "from rank 0")
    say(None, "single process")
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["from rank 0", "single process"] and not captured.out


def test_the_doctor_reads_a_resumed_log_as_one_run(few, tmp_path):
    """A run stopped after step 5 (checkpoint at 3) and resumed: the loop moves steps 4 and 5
    out of the log before it trains them again, so the doctor sees each step once, no restart."""
    from lengthwise.doctor import diagnose

    base = dict(checkpoint_every=3, keep_checkpoints=2, **SMALL)
    full = train_order("stratified", few, DemoConfig(**base), out=tmp_path / "a")
    run = tmp_path / "b" / "stratified"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "stratified" / "checkpoints" / "step_3",
                    run / "checkpoints" / "step_3")
    lines = Path(full.log_path).read_text().splitlines(keepends=True)
    upto5 = [x for x in lines if json.loads(x).get("step", 0) <= 5 and "event" not in x]
    log_path = run / Path(full.log_path).name
    log_path.write_text("".join(upto5))  # the stopped run's rows, steps 1..5
    resumed = train_order("stratified", few, DemoConfig(resume=True, **base),
                          out=tmp_path / "b")
    assert Path(resumed.log_path) == log_path
    r = diagnose(log_path)
    assert r.input.restart_count == 0 and r.input.superseded_rows == 0
    assert "restarts" not in {c.name for c in r.verdict.causes}
    assert r.series.step.tolist() == [1, 2, 3, 4, 5, 6, 7]
    side = [json.loads(x) for x in (run / "train_log.rolled_back.jsonl").read_text().splitlines()]
    assert [x["step"] for x in side] == [3, 4, 5]  # the rolled_back line, then steps 4 and 5
