"""The two-arm order experiment: its FLOPs count, its steps, its schedules, its reading.

The fast tests check the FLOPs count against a hand count, the arms' steps on real plans
(equal steps and real tokens per step; equal FLOPs), that ``sorted`` keeps one set of
batches across epochs while the bucketed orders re-form theirs, both learning-rate
schedules, the unigram reference, and the renderers on synthetic figures (a detected case
and an overlapping one). The check design is then run end to end (real training, a few
hundred samples, one thread): its invariants always, and against the committed check
run once ``benchmarks/ORDER_ARMS.json`` exists.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
from _scripts import load_script

from lengthwise.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    return load_script("order_arms")


# -- the FLOPs count ----------------------------------------------------------------------
def test_the_flops_of_a_micro_batch_are_the_hand_count():
    from lengthwise.demo.flops import token_flops, train_flops
    from lengthwise.demo.model import ModelSize

    # hidden 4, one layer, 2 heads sharing one k/v head (k and v are 4 x 2), MLP 4 -> 3,
    # vocabulary 5: per token q 16 + k 8 + v 8 + o 16 + gate/up/down 3 x 12 + head 20
    # multiply-adds = 104, i.e. 208 FLOPs
    size = ModelSize(hidden=4, layers=1, heads=2, kv_heads=1, intermediate=3)
    assert token_flops(size, vocab_size=5) == 208
    # 3 rows of 6 tokens: forward 3 x (6 x 208 + QK^T and AV 2 x 2 x 6 x 6 x 4) = 3 x 1824,
    # training three forwards
    assert train_flops(3, 6, size, vocab_size=5) == 3 * 3 * (6 * 208 + 4 * 36 * 4)
    assert train_flops(0, 0, size, vocab_size=5) == 0
    with pytest.raises(ValueError):
        train_flops(-1, 4, size, vocab_size=5)


def test_the_counted_shape_is_the_collated_one():
    from lengthwise.pytorch.collate import PadCollator

    from experiments.arms import batch_shape

    rng = np.random.default_rng(0)
    for pad in (1, 8):
        collate = PadCollator(pad_token_id=0, pad_multiple=pad, metadata=False)
        for _ in range(5):
            lengths = rng.integers(3, 200, rng.integers(1, 6))
            batch = collate([{"input_ids": np.ones(n, dtype=np.int64)} for n in lengths])
            assert tuple(batch["input_ids"].shape) == batch_shape(lengths, max_len=256,
                                                                  pad_multiple=pad)


# -- the steps of each arm, on real plans -------------------------------------------------
LENGTHS = np.random.default_rng(3).choice(
    np.r_[np.arange(8, 40), np.arange(8, 257)], 900).astype(np.int64)


def _sampler(order: str, batch: int = 8, seed: int = 0):
    from lengthwise.train.simulated import simulated_sampler

    from experiments.arms import ArmsConfig, _loop_config

    cfg = ArmsConfig()
    return cfg, simulated_sampler(order, LENGTHS, _loop_config(cfg, batch, seed), world=8)


def _epoch_steps(former, steps: int) -> list[list[int]]:
    return [[i for b in former.next() for row in b for i in row] for _ in range(steps)]


@pytest.mark.parametrize("order", ["sorted", "random", "bucket-random", "interleave",
                                   "stratified"])
def test_same_data_steps_hold_equal_real_tokens_and_every_sample_once(order):
    from experiments.arms import EqualData, budgets

    cfg, sampler = _sampler(order)
    plan = budgets(cfg, LENGTHS, 2048, 8)
    k, per = plan["per_epoch"], plan["real_tokens_per_step"]
    former = EqualData(sampler, LENGTHS, k, max_len=cfg.max_len)
    for _epoch in range(2):
        steps = _epoch_steps(former, k)
        tokens = [int(LENGTHS[s].sum()) for s in steps]
        # each step ends at the sample that brings it closest: within one sample of the budget
        assert max(abs(t - per) for t in tokens) <= cfg.max_len, (min(tokens), max(tokens))
        assert sorted(i for s in steps for i in s) == list(range(len(LENGTHS)))


def test_same_data_costs_the_padding_order_more_micro_batches():
    from experiments.arms import EqualData, budgets

    counts = {}
    for order in ("random", "stratified", "sorted"):
        cfg, sampler = _sampler(order)
        k = budgets(cfg, LENGTHS, 2048, 8)["per_epoch"]
        former = EqualData(sampler, LENGTHS, k, max_len=cfg.max_len)
        counts[order] = sum(len(former.next()) for _ in range(k))
    assert counts["random"] > counts["stratified"] > counts["sorted"], counts


def test_same_compute_gives_equal_flops_and_less_data_to_the_order_that_pads_more():
    from experiments.arms import EqualCompute, _flops_counter, budgets, micro_flops_bound

    seen = {}
    for order in ("random", "stratified", "sorted"):
        cfg, sampler = _sampler(order)
        plan = budgets(cfg, LENGTHS, 2048, 8)
        flops_of = _flops_counter(cfg, LENGTHS, 2048)
        former = EqualCompute(sampler, LENGTHS, 8, plan["flops"], flops_of=flops_of)
        tokens = 0
        while not former.done:
            tokens += sum(int(LENGTHS[[i for row in b for i in row]].sum())
                          for b in former.next())
        assert plan["flops"] <= former.spent < plan["flops"] + micro_flops_bound(cfg, 2048)
        with pytest.raises(ConfigError):
            former.next()
        seen[order] = tokens
    # the budget is random's epochs: random sees them, the orders that pad less see more
    assert seen["random"] <= cfg.epochs * LENGTHS.sum()
    assert seen["random"] < seen["stratified"] < seen["sorted"], seen


def test_sorted_keeps_one_set_of_batches_across_epochs_the_bucketed_orders_reform_theirs():
    from experiments.arms import EqualData

    for order in ("sorted", "bucket-random", "stratified", "random"):
        _, sampler = _sampler(order)
        epochs = []
        for epoch in (0, 1, 2):
            sampler.set_epoch(epoch)
            epochs.append([tuple(i for row in b for i in row) for b in sampler])
        if order == "sorted":
            assert epochs[0] == epochs[1] == epochs[2]
        else:
            assert epochs[0] != epochs[1] and set(epochs[0]) != set(epochs[1]), order
    # and so are the steps of arm "data", which cut them by real tokens from each epoch's start
    _, sampler = _sampler("sorted")
    former = EqualData(sampler, LENGTHS, 7, max_len=256)
    assert _epoch_steps(former, 7) == _epoch_steps(former, 7)
    _, sampler = _sampler("bucket-random")
    former = EqualData(sampler, LENGTHS, 7, max_len=256)
    assert _epoch_steps(former, 7) != _epoch_steps(former, 7)


# -- schedules, unigram reference, configuration ------------------------------------------
def test_both_schedules_warm_up_then_decay_or_hold():
    from experiments.arms import lr_share

    at = (0.0, 0.05, 0.1, 0.325, 0.55, 1.0)
    cosine = [lr_share(s, "cosine", lr=2.0, warmup_share=0.1) for s in at]
    constant = [lr_share(s, "constant", lr=2.0, warmup_share=0.1) for s in at]
    assert cosine == pytest.approx([0.0, 1.0, 2.0, 1.0 + math.sqrt(0.5), 1.0, 0.0])
    assert constant == pytest.approx([0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    with pytest.raises(ConfigError):
        lr_share(0.5, "linear", lr=1.0)


def test_the_unigram_reference_is_the_smoothed_cross_entropy():
    from experiments.arms import unigram_loss

    train = [np.array([1, 1, 2, 3]), np.array([1])]
    held = [np.array([3, 1, 0])]  # predicted: 1, then 0 (never seen in training)
    # add-one over 4 tokens: counts 1, 4, 2, 2 of 9
    expected = -(math.log(4 / 9) + math.log(1 / 9)) / 2
    assert unigram_loss(train, held, 4) == pytest.approx(expected)


@pytest.mark.parametrize(("settings", "message"), [
    ({"orders": ("packed",)}, "orders must be among"),
    ({"reduced": ("sorted",)}, "must hold random"),
    ({"batches": (12,)}, "multiples of world"),
    ({"schedules": ("linear",)}, "schedules must be among"),
    ({"epochs": 0}, "epochs must be a positive integer"),
    ({"seeds": (1, 1)}, "seeds must be distinct"),
    ({"skip": (("data", "linear"),)}, "skip must name some"),
    ({"arms": ("data",), "schedules": ("cosine",), "skip": (("data", "cosine"),)},
     "skip must name some"),
])
def test_bad_settings_are_one_config_error(settings, message):
    from experiments.arms import ArmsConfig

    with pytest.raises(ConfigError, match=message):
        ArmsConfig(**settings)


def test_the_full_design_is_what_the_issue_asks(script):
    cfg = script._config(script.FULL)
    cells = cfg.cells()
    assert {c[0] for c, _ in cells} == {"data", "compute"}
    assert {c[1] for c, _ in cells} == {"cosine", "constant"}
    assert {c[2] for c, _ in cells} == {8, 64}
    assert len(cfg.seeds) >= 5 and cfg.epochs >= 4
    for (_, _, batch), orders in cells:
        assert {"sorted", "random", "bucket-random", "stratified"} <= set(orders)
        if batch == 8:
            from lengthwise.planning.vocabulary import ORDERS

            assert orders == ORDERS


# -- the reading, on synthetic figures ----------------------------------------------------
def _iv(mean: float, half: float) -> dict:
    return {"mean": mean, "half": half, "lo": mean - half, "hi": mean + half, "n": 5}


def _diff(mean: float, half: float) -> dict:
    return {**_iv(mean, half), "detected": abs(mean) > half}


def _row(loss: float, flops: float, tokens: float, diff=None, strata=None) -> dict:
    curve = [{"step": s, "tokens": tokens * s / 4, "flops": flops * s / 4, "seconds": s,
              "eval_loss": _iv(loss + 0.1 * (4 - s), 0.01)} for s in (1, 2, 3, 4)]
    row = {"eval_loss": _iv(loss, 0.01), "flops": _iv(flops, 0.0), "real_tokens": _iv(tokens, 0),
           "steps": _iv(40, 0), "train_seconds": _iv(12, 1), "settled": True, "curve": curve}
    if diff is not None:
        row["vs_random"] = {"eval_loss": _diff(*diff),
                            "strata": {"8-20": _diff(*(strata or (0.0, 0.1))),
                                       "170-256": _diff(0.0, 0.1)}}
    return row


def _full(compute_diff, data_diff, strata=None) -> dict:
    cells = {}
    for arm in ("data", "compute"):
        d = compute_diff if arm == "compute" else data_diff
        rows = {"random": _row(5.0, 2e11, 4e5),
                "stratified": _row(5.0 + d[0], 2e11 if arm == "compute" else 1.2e11,
                                   6e5 if arm == "compute" else 4e5, d, strata),
                "sorted": _row(5.0, 2e11 if arm == "compute" else 1.1e11, 4e5, (0.01, 0.05))}
        cells[f"{arm}/cosine/8"] = {"arm": arm, "schedule": "cosine", "batch": 8,
                                    "orders": rows}
    return {"cells": cells, "unigram_loss": 6.4, "settle_share": 0.2,
            "unigram_smoothing": "add-one", "config": {"batches": [8], "seeds": [0, 1, 2, 3, 4]}}


def test_the_decision_names_a_detected_difference(script):
    full = _full((-0.1, 0.03), (0.05, 0.02))
    text = " ".join(script.decision(full).split())
    assert text.startswith("At equal compute: - At 8 micro-batches per step (cosine) pick "
                           "stratified: the held-out loss is below random's under every "
                           "schedule, by 0.100 nats.")
    assert "Stratified costs 0.60x random's compute and its held-out loss is higher" in text
    assert "Sorted costs 0.55x random's compute and no difference detected at this size" in text
    assert "8-20" not in text  # no stratum differs: none is named


def test_the_decision_is_per_batch_and_judges_an_order_only_where_it_ran(script):
    full = _full((-0.1, 0.03), (0.05, 0.02))
    c8 = full["cells"]["compute/cosine/8"]
    c64 = {"arm": "compute", "schedule": "cosine", "batch": 64,
           "orders": {"random": _row(6.0, 2e11, 4e5),
                      "sorted": _row(6.03, 2e11, 4e5, (0.03, 0.01))}}
    c8["orders"]["interleave"] = _row(4.85, 2e11, 6e5, (-0.15, 0.05))
    full["cells"]["compute/cosine/64"] = c64
    text = " ".join(script.decision(full).split())
    assert ("At 8 micro-batches per step (cosine) pick any of stratified and interleave: the "
            "held-out loss is below random's under every schedule, by 0.100-0.150 nats") in text
    assert ("At 64 micro-batches per step (cosine) no order's held-out loss is below random's "
            "under every schedule; above it: sorted by up to 0.030 (cosine)") in text


def test_the_decision_says_no_difference_where_intervals_overlap(script):
    full = _full((0.01, 0.05), (-0.01, 0.05), strata=(0.2, 0.05))
    text = " ".join(script.decision(full).split())
    assert text.startswith("At equal compute: - At 8 micro-batches per step (cosine) no order's "
                           "held-out loss differs from random's (no difference detected at "
                           "this size)")
    assert ("Stratified costs 0.60x random's compute and no difference detected at this size "
            "overall, though lengths 8-20 differ by +0.200 ± 0.050") in text
    assert "170-256" not in text


def test_the_table_has_a_row_per_arm_schedule_batch_and_order(script):
    full = _full((-0.1, 0.03), (0.05, 0.02), strata=(0.2, 0.05))
    lines = script.table(full).splitlines()
    assert len(lines) == 2 + 6
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    row = next(ln for ln in lines if "same compute" in ln and "| stratified |" in ln)
    assert "4.900 ± 0.010" in row and "-0.100 ± 0.030" in row and "8-20 +0.200 ± 0.050" in row
    assert "| random |" in lines[2] and "| - | - |" in lines[2]


def test_the_demo_note_says_the_demo_compares_at_equal_data_in_each_orders_steps(script):
    text = " ".join(script.demo_note(_full((0.0, 0.1), (0.0, 0.1))).split())
    assert "compares the orders at equal data, at one seed" in text
    assert "each in its own plan's steps" in text and "over 5 paired seeds" in text


def test_the_plots_are_drawn_from_the_figures(script, tmp_path):
    pytest.importorskip("matplotlib")
    paths = {"compute": tmp_path / "c.png", "data": tmp_path / "d.png"}
    script.plot(_full((-0.1, 0.03), (0.05, 0.02)), paths)
    assert all(p.stat().st_size > 0 for p in paths.values())


def test_json_is_written_without_nan(tmp_path):
    from experiments.saved import write

    path = tmp_path / "x.json"
    write({"a": [math.nan, 1.0], "b": {"c": math.inf}}, path)
    assert json.loads(path.read_text()) == {"a": [None, 1.0], "b": {"c": None}}


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0"], "argument --workers: must be a positive integer, got '0'"),
    (["--workers", "-3"], "argument --workers: must be a positive integer, got '-3'"),
    (["--out", "{file}"], "--out {file}: exists and is not a folder"),
    (["--out", "{file}/runs"], "--out {file}/runs: {file} is not a folder"),
    (["--cache-dir", "{file}/cache"], "--cache-dir {file}/cache: {file} is not a folder"),
    (["--cache-dir", "/proc/1/nope"], "--cache-dir /proc/1/nope: cannot make this folder"),
], ids=["workers-0", "workers-negative", "out-file", "out-under-file", "cache-under-file",
        "cache-unmakeable"])
def test_a_bad_option_is_one_line_and_nothing_runs(args, message, tmp_path, capsys,
                                                    monkeypatch):
    """A count of workers below one, or a folder that cannot be one, is refused before any
    run starts (not accepted, not a traceback)."""
    if message.startswith("--cache-dir /proc") and not Path("/proc/1").is_dir():
        pytest.skip("needs /proc")
    module = load_script("order_arms")
    monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("a run started"))
    file = tmp_path / "afile.txt"
    file.write_text("not a folder\n")
    with pytest.raises(SystemExit) as exit_:
        module.main([*(a.format(file=file) for a in args), "--check-only"])
    lines = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("order_arms.py: error: " + message.format(file=file)), lines


def _refused(module, argv: list[str], capsys, monkeypatch) -> str:
    """The one line the script's ``main(argv)`` is refused with (exit 2), nothing run or
    written."""
    for name in ("run", "plot", "rewrite", "run_parts"):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("it ran"))
    with pytest.raises(SystemExit) as exit_:
        module.main(argv)
    said = capsys.readouterr()
    lines = said.err.splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and not said.out, lines
    return lines[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--check-only", "--full-only"], "argument --full-only: not allowed with argument "
                                      "--check-only"),
    (["--render", "--check"], "argument --check: not allowed with argument --render"),
    (["--check", "--check-only"], "argument --check-only: not allowed with argument --check"),
], ids=["check-only-full-only", "render-check", "check-check-only"])
def test_contradictory_modes_are_refused_in_one_line(argv, message, capsys, monkeypatch):
    line = _refused(load_script("order_arms"), argv, capsys, monkeypatch)
    assert line.startswith(f"order_arms.py: error: {message}"), line


def test_a_damaged_committed_json_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    module = load_script("order_arms")
    text = module.SAVED.read_text(encoding="utf-8")
    damaged = tmp_path / module.SAVED.name
    damaged.write_text(text[: len(text) // 2], encoding="utf-8")
    monkeypatch.setattr(module, "SAVED", damaged)
    line = _refused(module, ["--render"], capsys, monkeypatch)
    assert line.startswith(f"order_arms.py: error: {damaged}: not valid JSON, damaged or cut "
                           "short ("), line
    damaged.write_text("[1, 2]\n", encoding="utf-8")
    line = _refused(module, ["--render"], capsys, monkeypatch)
    assert line.startswith(f"order_arms.py: error: {damaged}: holds a JSON list, not the "
                           "figures' object"), line


def test_every_option_the_script_documents_is_one_it_has(script, capsys):
    import re

    with pytest.raises(SystemExit):
        script.main(["--help"])
    helped = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))
    documented = set(re.findall(r"--[a-z][a-z-]*", script.__doc__))
    assert documented and documented <= helped, documented - helped


# -- the check design, end to end ---------------------------------------------------------
@pytest.fixture(scope="module")
def check(script, tmp_path_factory):
    pytest.importorskip("torch")
    return script.run(script.CHECK, tmp_path_factory.mktemp("arms"), 1, None)


def test_the_check_run_keeps_the_designs_promises(script, check, tmp_path):
    assert script.invariants(check) == []
    assert math.isfinite(check["unigram_loss"]) and check["unigram_loss"] > 0
    data = check["cells"]["data/cosine/8"]
    compute = check["cells"]["compute/cosine/8"]
    steps = {row["steps"]["mean"] for row in data["orders"].values()}
    tokens = {row["real_tokens"]["mean"] for row in data["orders"].values()}
    assert len(steps) == 1 and len(tokens) == 1
    # equal data: the order that pads more spends more compute on it
    flops = {n: row["flops"]["mean"] for n, row in data["orders"].items()}
    assert flops["random"] > flops["stratified"] > flops["sorted"], flops
    # equal compute: the order that pads more sees less data
    seen = {n: row["real_tokens"]["mean"] for n, row in compute["orders"].items()}
    assert seen["random"] < seen["stratified"] < seen["sorted"], seen
    for cell in check["cells"].values():
        for row in cell["orders"].values():
            assert len(row["curve"]) == check["config"]["eval_points"]
            axis = [p["flops"] for p in row["curve"]]
            assert axis == sorted(axis) and axis[0] > 0
    # the figures as written are strict JSON (one seed's NaN intervals as null)
    from experiments.saved import write

    path = tmp_path / "check.json"
    write({"check": check}, path)

    def refuse(name):
        raise ValueError(f"{name} in the written figures")

    assert json.loads(path.read_text(), parse_constant=refuse)["check"]["runs"]


def test_the_check_run_is_the_committed_one_once_there_is_one(script, check):
    if not script.SAVED.is_file():
        pytest.skip("no benchmarks/ORDER_ARMS.json yet: the invariants are tested above")
    saved = json.loads(script.SAVED.read_text(encoding="utf-8"))
    drift = script.compare(saved["check"], check)
    assert not drift, "\n".join(drift)


def drift_after(script, check: dict, change) -> list[str]:
    """What ``script.compare`` reports of a copy of the committed ``check`` run once ``change``
    has altered its first run; the copy as it is, and with its training seconds doubled
    (machine-dependent, never compared), must first report nothing."""
    fresh = copy.deepcopy(check)
    assert script.compare(check, fresh) == []
    run = fresh["runs"][0]
    run["train_seconds"] *= 2
    assert script.compare(check, fresh) == []
    change(run)
    return script.compare(check, fresh)


def test_drift_in_the_check_run_is_reported(script, check):
    def change(run):
        run["eval_loss"] *= 1 + 10 * script.REL_TOL
        run["flops"] += 1

    drift = drift_after(script, check, change)
    assert any("eval_loss" in line for line in drift)
    assert any("flops" in line for line in drift)


# -- the committed figures (once the full run has been made and committed) ----------------
@pytest.fixture(scope="module")
def saved(script):
    if not script.SAVED.is_file():
        pytest.skip("no benchmarks/ORDER_ARMS.json yet (python benchmarks/order_arms.py "
                    "--workers 2 makes it)")
    return json.loads(script.SAVED.read_text(encoding="utf-8"))


def test_the_committed_figures_are_what_the_issue_asks(script, saved):
    full = saved["full"]
    assert script.invariants(full) == []
    cells = full["cells"]
    assert {(c["arm"], c["schedule"], c["batch"]) for c in cells.values()} == {
        (a, s, b) for a in ("data", "compute") for s in ("cosine", "constant") for b in (8, 64)}
    assert full["unigram_loss"] > 0
    for cell in cells.values():
        for row in cell["orders"].values():
            assert row["eval_loss"]["n"] >= 5 and row["eval_loss"]["half"] is not None
            assert set(row["strata"]) == set(full["strata"])
            assert all("flops" in p for p in row["curve"])
        for name, row in cell["orders"].items():
            if name != "random":
                assert set(row["vs_random"]["strata"]) == set(full["strata"])


def test_every_region_holds_what_the_script_renders(script, saved):
    from _scripts import stale_regions

    stale = stale_regions(script, saved)
    assert not stale, (f"{stale} differ from benchmarks/ORDER_ARMS.json; run python "
                       "benchmarks/order_arms.py --render")


def test_the_plots_are_committed(script, saved):
    for path in script.PLOTS.values():
        assert path.is_file() and path.stat().st_size > 0
