"""The report's context lines say what the log holds: epochs, counts and sizes as they are."""

from __future__ import annotations

import numpy as np

from lengthwise.doctor import diagnose
from lengthwise.doctor.report import render_text


def _rows(n: int = 120, *, epoch: bool, evals: int = 0) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for s in range(1, n + 1):
        row = {"step": s, "loss": 3.0 + 2.0 / s + 0.05 * rng.standard_normal(),
               "lr": 1e-3, "samples": 28.69, "loss_sample_std": 1.5}
        if epoch:
            row["epoch"] = 0  # the run is shorter than one epoch
        rows.append(row)
    for k in range(evals):
        rows.append({"step": 60 + k, "eval_loss": 3.1})
    return rows


def test_an_epoch_field_that_never_changes_is_named_not_asked_for():
    text = render_text(diagnose(_rows(epoch=True), timing=False))
    context = next(line for line in text.splitlines() if line.lstrip().startswith("context"))
    assert "the logged `epoch` spans less than one whole epoch" in context
    assert "log `epoch`" not in context
    text = render_text(diagnose(_rows(epoch=False), timing=False))
    assert "log `epoch` or pass --steps-per-epoch" in text


def test_one_evaluation_is_singular():
    report = diagnose(_rows(epoch=False, evals=1), timing=False)
    assert report.eval_gap.note == "not tested: 1 evaluation inside the training log (need 4)"


def test_samples_per_step_carry_no_false_digits():
    report = diagnose(_rows(epoch=False), timing=False)
    assert report.noise is not None
    assert "sampling noise of 29 samples per step" in report.noise.summary


def test_a_missing_schedule_says_what_to_record():
    report = diagnose(_rows(epoch=False), timing=False)
    assert "`learning_rate` and `warmup_steps` in a training_args.json" in report.schedule.note


def test_the_plot_title_holds_two_lines_of_the_verdict_and_the_mean_only_whole_windows():
    """The row's title is the run's name and at most two lines of the verdict; the running
    mean is drawn where its 51-point window is whole, never from a half window at the ends."""
    import pytest

    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from lengthwise.doctor.plot import _loss_panel

    report = diagnose(_rows(300, epoch=False), timing=False)
    ax = Figure().add_subplot()
    _loss_panel(ax, "run", report)
    title = ax.get_title(loc="left").splitlines()
    assert title[0] == "run" and 1 <= len(title) - 1 <= 2
    mean = next(line for line in ax.get_lines() if line.get_label() == "running mean (51)")
    steps = mean.get_xdata()
    assert steps[0] == report.series.step[25] and steps[-1] == report.series.step[-26]


def test_no_timing_leaves_the_step_times_out(tmp_path, capsys):
    """``--no-timing`` is the report without the step times a loaded machine moves: a log
    whose steps slow down is a slow-step finding by default and none with it."""
    import json

    from lengthwise.cli import main

    rows = _rows(300, epoch=False)
    for row in rows:
        if "loss" in row:
            row["seconds"] = 5.0 if row["step"] % 50 == 0 else 0.5
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["doctor", "--json", str(log)]) == 0
    timed = json.loads(capsys.readouterr().out)
    assert main(["doctor", "--json", "--no-timing", str(log)]) == 0
    untimed = json.loads(capsys.readouterr().out)
    assert "slow step" in timed["verdict"]["summary"]
    assert "slow step" not in untimed["verdict"]["summary"]
    assert untimed["step_time"]["note"].startswith("not analysed")
