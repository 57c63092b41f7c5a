"""The doctor against labelled real logs: agreement per log, with no options and with config ones.

Each ``labels.json`` beside the logs (``../shared/data/real_logs..real_logs5``;
a folder without one is skipped) records,
from the run's own configuration, what the doctor should find: a period (and the
period in steps a log shows), a clean verdict, checkpoint-associated cliffs,
restarts and epoch step-downs, ``null`` where the configuration does not settle
it. Labels record restarts and a loss that does not move apart from ``clean``
("clean after the restarts"), so ``clean`` is compared with the verdict less
its input causes (restarts, resumes, a second writer, rows out of order) and
the ``not_learning`` cause. A log agrees when every label that is not ``null``
agrees; a step-down at
3 or more epoch starts is accepted for a labelled period of one epoch
(a label of no period is judged by the period finding alone). "Config options"
are the options its configuration justifies: ``--steps-per-epoch`` (the
recorded epoch length), ``--batch-size`` (per-device batch x gradient
accumulation), ``--world-size`` and ``--checkpoint-every`` (``save_steps``).

Run::

    PYTHONPATH=src python benchmarks/doctor_labels.py [--data ../shared/data] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lengthwise.doctor import diagnose

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETS = ("real_logs", "real_logs2", "real_logs3", "real_logs4", "real_logs5")
#: a found period agrees with the labelled one within this fraction
PERIOD_TOLERANCE = 0.1


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float) and value > 0:
        return int(value)
    return None


def config_options(label: dict[str, Any]) -> dict[str, Any]:
    """The doctor options a log's recorded configuration justifies (numbers only)."""
    opts: dict[str, Any] = {}
    spe = label.get("epoch_steps")
    if isinstance(spe, int | float) and not isinstance(spe, bool) and spe > 0:
        opts["steps_per_epoch"] = float(spe)
    per_device, accum = _int(label.get("per_device_batch_size")), _int(label.get("grad_accum"))
    if per_device:
        opts["batch_size"] = per_device * (accum or 1)
    world = _int(label.get("world_size")) or _int(label.get("n_gpu"))
    if world:
        opts["world_size"] = world
    save = _int(label.get("save_steps"))
    if save and save < (_int(label.get("steps")) or 0):
        opts["checkpoint_every"] = save
    return opts


#: causes the labels record apart from ``clean``
APART = frozenset({"restarts", "resumes", "duplicate_writer", "out_of_order", "not_learning"})


def findings(report: Any) -> dict[str, Any]:
    """What the doctor said, in the labels' terms."""
    causes = {c.name for c in report.verdict.causes}
    clean = report.verdict.clean
    if clean is False and causes <= APART:
        clean = None if report.verdict.untested else True
    staircase = None
    if report.epochs.found and len(report.epochs.starts) >= 3:
        staircase = report.context.steps_per_epoch
    return {
        "periodic": report.periodicity.period is not None,
        "period": report.periodicity.period,
        "staircase": staircase,
        "clean": clean,
        "checkpoint_associated_cliffs": bool(report.checkpoint_association.associated),
        "restart": bool(report.input.restart_count) or "resumes" in causes,
        "duplicate_writer": bool(report.input.duplicate_rows),
        "epoch_boundaries": report.epochs.found,
    }


def disagreements(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """The labels (not null) the doctor's findings contradict."""
    out = []
    if expected.get("periodic") and not found["periodic"] and found["staircase"]:
        found = {**found, "periodic": True, "period": found["staircase"]}
    for key in ("periodic", "clean", "checkpoint_associated_cliffs", "restart",
                "epoch_boundaries", "duplicate_writer"):
        want = expected.get(key)
        if isinstance(want, str):  # a described restart/epoch label: present
            want = None if "uncertain" in want else True
        if want is None:
            continue
        got = found[key]
        if bool(want) != bool(got):
            out.append(f"{key} {got} (label {want})")
    period = expected.get("expected_period")
    if expected.get("periodic") and period and found["period"] is not None and abs(
        found["period"] - period
    ) > PERIOD_TOLERANCE * period:
        out.append(f"period {found['period']:g} (label {period:g})")
    return out


def rows(data: Path) -> list[dict[str, Any]]:
    """One row per labelled log: its disagreements with no options and with config options."""
    out = []
    for name in SETS:
        labels = data / name / "labels.json"
        if not labels.is_file():
            continue
        for label in json.loads(labels.read_text()):
            path = data / name / label["file"]
            opts = config_options(label)
            row: dict[str, Any] = {"log": f"{name}/{label['file']}", "options": opts}
            for key, kw in (("plain", {}), ("config", opts)):
                try:
                    r = diagnose(path, **kw)
                    f = findings(r)
                    row[key] = disagreements(label["expected"], f)
                    row[key + "_period"] = f["period"]
                except Exception as exc:  # noqa: BLE001 - a crash is a disagreement, shown
                    row[key] = [f"error: {exc}"]
                    row[key + "_period"] = None
            out.append(row)
    return out


def table(result: list[dict[str, Any]]) -> str:
    """Markdown table of the rows and the agreement counts."""
    lines = ["| log | config options | no options | with config options |",
             "|---|---|---|---|"]
    for r in result:
        opts = ", ".join(f"{k}={v:g}" for k, v in r["options"].items()) or "-"
        plain = "agrees" if not r["plain"] else "; ".join(r["plain"])
        conf = "agrees" if not r["config"] else "; ".join(r["config"])
        lines.append(f"| {r['log']} | {opts} | {plain} | {conf} |")
    n = len(result)
    a = sum(not r["plain"] for r in result)
    b = sum(not r["config"] for r in result)
    lines.append("")
    lines.append(f"Agreement: {a} of {n} with no options, {b} of {n} with config options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA),
                        help="folder holding real_logs..real_logs5")
    parser.add_argument("--out", default=None, help="write the table to this markdown file")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not any((data / s / "labels.json").is_file() for s in SETS):
        print(f"doctor_labels: no labels.json under {data}/real_logs..real_logs5",
              file=sys.stderr)
        return 2
    text = table(rows(data))
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
