"""The DFlash run-time estimate against the real run, on a real target (CPU, float32).

For each shape of :data:`SHAPES` it runs, each in its own process, ``lengthwise dflash
estimate --time`` (the plan of one epoch priced by a profile it times on the run's
first steps: :mod:`lengthwise.dflash.cost.timing`) and then ``lengthwise dflash train
--epochs 1`` with the same settings, and compares the predicted seconds of the epoch's
steps (its held-out evaluations included) with the seconds the training log records,
and the predicted whole run (its start included) with the command's wall time. The
data: long chats made of the OpenAI evals registry's user turns (every sample fills a
micro-batch, as in ``benchmarks/memory_estimate.py``) and chats of mixed lengths, each
registry user turn answered by another (many samples per micro-batch)::

    python benchmarks/time_estimate.py --real-target ./SmolLM2-135M-Instruct \\
        --wheel evals-3.0.1.post1-py3-none-any.whl --docs

Regeneration (``--stage regenerate``, or ``all``): for each shape of :data:`REGEN_SHAPES`,
``lengthwise dflash estimate --stage regenerate --time`` on chats of registry user turns
(one or two questions each, the second after another text as the earlier answer), then
``lengthwise dflash prepare --regenerate`` with the same settings; the predicted seconds of
its shards (the decoding and rendering the prompts) against the seconds
``prepare.json`` records for them (``shard_seconds``), and the predicted whole (loading
the target included) against the command's wall time.

With ``--docs`` the tables go into the ``dflash-run-time`` and ``dflash-regenerate-time``
regions of docs/dflash.md. Times depend on the machine and its load: run it on an
otherwise idle machine. ``--render`` writes both regions' text again around the tables they
hold (the committed figures), running nothing::

    python benchmarks/time_estimate.py --render
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import memory_estimate as mem  # noqa: E402

#: (data set, settings of ``dflash train``): one epoch each
SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("long", {"max_tokens": 512, "block_size": 8, "draft_layers": 2, "num_anchors": 64,
              "eval_every": 10}),
    ("long", {"max_tokens": 1024, "block_size": 4, "draft_layers": 1, "num_anchors": 32,
              "grad_accum": 2, "eval_every": 5}),
    ("mixed", {"max_tokens": 512, "block_size": 8, "draft_layers": 1, "num_anchors": 16,
               "eval_every": 20}),
]
#: held-out samples of every run (the long set has 24 samples)
EVAL_SAMPLES = 4
#: (chats, settings of ``dflash prepare --regenerate``)
REGEN_SHAPES: list[tuple[int, dict[str, Any]]] = [
    (96, {"batch_size": 8, "max_new_tokens": 64}),
    (96, {"batch_size": 16, "max_new_tokens": 96}),
    (64, {"batch_size": 4, "max_new_tokens": 128}),
]


def regen_chats(wheel: Path, work: Path, n: int) -> Path:
    """``n`` chats to regenerate: each asks one registry user turn; every third asks a second
    one after another registry text as the earlier answer (two rounds)."""
    import real_target_dflash as real

    path = work / f"regen_{n}.jsonl"
    if not path.is_file():
        chats, _ = real.registry_chats(wheel, per_file=1, max_chars=1600)
        texts = [m["content"] for c in chats for m in c["messages"] if m["role"] == "user"]
        rows = []
        for i in range(n):
            msgs = [{"role": "user", "content": texts[(5 * i) % len(texts)]}]
            if i % 3 == 0:
                msgs += [{"role": "assistant", "content": texts[(5 * i + 1) % len(texts)]},
                         {"role": "user", "content": texts[(5 * i + 2) % len(texts)]}]
            rows.append({"messages": msgs})
        real._jsonl(path, rows)
    return path


def compare_regenerate(target: Path, chats: Path, shape: dict[str, Any],
                       work: Path) -> dict[str, Any]:
    """Predicted and measured seconds of ``dflash prepare --regenerate`` of ``chats``."""
    common = ["--target", str(target), "--device", "cpu", *_flags(shape)]
    load = [os.getloadavg()[0]]
    started = time.perf_counter()
    est = subprocess.run(mem._lengthwise("dflash", "estimate", "--stage", "regenerate",
                                         "--data", chats, *common, "--time", "--json"),
                         env=mem._env(), capture_output=True, text=True, check=False)
    est_s = time.perf_counter() - started
    if est.returncode:
        raise RuntimeError(f"dflash estimate --stage regenerate --time: exit "
                           f"{est.returncode}\n{est.stderr[-3000:]}")
    pred = json.loads(est.stdout)
    out = work / ("regen_" + "_".join(str(v) for v in shape.values()))
    shutil.rmtree(out, ignore_errors=True)  # a rerun would reuse its shards
    load.append(os.getloadavg()[0])
    started = time.perf_counter()
    subprocess.run(mem._lengthwise("dflash", "prepare", chats, "--out", out, "--regenerate",
                                   "--min-supervised", 1, "--no-progress", *common),
                   env=mem._env(), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    rec = json.loads((out / "prepare.json").read_text(encoding="utf-8"))
    t, prof = pred["time"], pred["profile"]
    render = prof["fit"]["render_seconds"]
    return {"responses": t["responses"], "steps": t["steps"],
            "predicted_work_s": t["generate_seconds"] + render,
            "measured_work_s": rec["shard_seconds"],
            "predicted_run_s": t["total_seconds"], "measured_run_s": wall,
            "estimate_s": est_s, "timed_conversations": prof["fit"]["conversations"],
            "fit_error": prof["fit"]["steps_median_relative_error"],
            "cut_share": t["cut_share"], "load": max(load),
            "written": rec["counts"]["regenerated_turns"],
            "unfinished": rec["counts"]["unfinished_turns"]}


def regen_table(rows: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> list[str]:
    """The markdown table of :func:`compare_regenerate`'s figures."""
    lines = ["| chats | shape | responses | decode steps | predicted s | measured s | error | "
             "predicted command s | measured command s | error | estimate s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, shape, r in rows:
        e1 = r["predicted_work_s"] / r["measured_work_s"] - 1
        e2 = r["predicted_run_s"] / r["measured_run_s"] - 1
        label = ", ".join(f"{k} {v}" for k, v in shape.items())
        lines.append(f"| {n} | {label} | {r['responses']} | {r['steps']} | "
                     f"{r['predicted_work_s']:.0f} | {r['measured_work_s']:.0f} | "
                     f"{100 * e1:+.1f} % | {r['predicted_run_s']:.0f} | "
                     f"{r['measured_run_s']:.0f} | {100 * e2:+.1f} % | {r['estimate_s']:.0f} |")
    return lines


def mixed_data(target: Path, wheel: Path, work: Path, n: int = 120) -> Path:
    """``n`` chats of mixed lengths prepared for ``target``: each asks with one user turn of
    the evals registry and is answered by another (its texts as they are: a few tokens to a
    few hundred)."""
    import real_target_dflash as real

    prepared = work / "mixed_prepared"
    if not (prepared / "prepare.json").is_file():
        chats, _ = real.registry_chats(wheel, per_file=1, max_chars=1600)
        texts = [m["content"] for c in chats for m in c["messages"] if m["role"] == "user"]
        rows = [{"messages": [{"role": "user", "content": texts[i % len(texts)]},
                              {"role": "assistant", "content": texts[(7 * i + 3) % len(texts)]}]}
                for i in range(n)]
        real._jsonl(work / "mixed.jsonl", rows)
        subprocess.run(mem._lengthwise("dflash", "prepare", work / "mixed.jsonl",
                                       "--target", target, "--out", prepared,
                                       "--min-supervised", 2, "--no-progress"),
                       env=mem._env(), check=True, stdout=subprocess.DEVNULL)
    return prepared


def _flags(shape: dict[str, Any]) -> list[str]:
    return [x for k, v in shape.items() for x in ("--" + k.replace("_", "-"), str(v))]


def compare(target: Path, data: Path, shape: dict[str, Any], work: Path) -> dict[str, Any]:
    """Predicted and measured seconds of one epoch of ``shape`` on ``data``."""
    common = ["--target", str(target), "--data", str(data), "--device", "cpu", "--epochs", "1",
              "--eval-samples", str(EVAL_SAMPLES), *_flags(shape)]
    started = time.perf_counter()
    est = subprocess.run(mem._lengthwise("dflash", "estimate", *common, "--time", "--json"),
                         env=mem._env(), capture_output=True, text=True, check=False)
    est_s = time.perf_counter() - started
    if est.returncode:
        raise RuntimeError(f"dflash estimate --time: exit {est.returncode}\n{est.stderr[-3000:]}")
    pred = json.loads(est.stdout)
    out = work / ("run_" + "_".join(str(v) for v in shape.values()))
    started = time.perf_counter()
    subprocess.run(mem._lengthwise("dflash", "train", *common, "--out", out, "--overwrite",
                                   "--checkpoint-every", 0, "--no-progress"),
                   env=mem._env(), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines() if x]
    steps = [r for r in log if "seconds" in r and "event" not in r]
    t = pred["time"]
    return {"steps": len(steps), "predicted_steps": t["steps"],
            "predicted_epoch_s": t["epoch_seconds"][0], "measured_epoch_s":
                sum(r["seconds"] for r in steps),
            "predicted_run_s": t["total_seconds"], "measured_run_s": wall,
            "estimate_s": est_s, "fit_error": pred["profile"]["fit"]["median_relative_error"]}


def table(rows: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[str]:
    """The markdown table of :func:`compare`'s figures."""
    lines = ["| data | shape | steps | predicted epoch s | measured epoch s | error | "
             "predicted run s | measured command s | error | estimate s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, shape, r in rows:
        e1 = r["predicted_epoch_s"] / r["measured_epoch_s"] - 1
        e2 = r["predicted_run_s"] / r["measured_run_s"] - 1
        label = ", ".join(f"{k} {v}" for k, v in shape.items())
        lines.append(f"| {name} | {label} | {r['steps']} | {r['predicted_epoch_s']:.0f} | "
                     f"{r['measured_epoch_s']:.0f} | {100 * e1:+.1f} % | "
                     f"{r['predicted_run_s']:.0f} | {r['measured_run_s']:.0f} | "
                     f"{100 * e2:+.1f} % | {r['estimate_s']:.0f} |")
    return lines


def regenerate_docs(about: str, load: float, lines: list[str]) -> list[str]:
    """The lines of the ``dflash-regenerate-time`` region: what was run and measured (the
    highest load average before a command: ``load``), then the table ``lines``."""
    return [about, "",
            "Predicted: `dflash estimate --stage regenerate --time`, its profile fitted on the "
            "forwards of 32 of the chats regenerated after a warm-up (the default), the "
            "continuous batch replayed. Measured: the seconds `dflash prepare --regenerate` "
            "spent on its shards, and the command's wall time. The shards' seconds are "
            "`shard_seconds` in `prepare.json`: the decoding, rendering and writing. Chats: "
            "registry user turns, every third with a second "
            "question (two rounds). The 1-minute load average before each command was at most "
            f"{load:.2f} (the benchmark's own previous command included).", "",
            "Written by `python benchmarks/time_estimate.py --stage regenerate --real-target "
            "PATH --wheel WHL --docs`:", "", *lines]


def run_docs(about: str, lines: list[str]) -> list[str]:
    """The lines of the ``dflash-run-time`` region: what was run and measured, then the table
    ``lines``."""
    return [about, "",
            f"One epoch each, {EVAL_SAMPLES} held-out samples. Predicted: `dflash estimate "
            "--time`, its profile timed on the run's first 6 steps in its own process. "
            "Measured: the steps' seconds in the training log (held-out evaluations included) "
            "and the wall time of the `dflash train` command (loading the target included).", "",
            "- data `long`: 24 chats that each fill a micro-batch;",
            "- data `mixed`: 120 chats of a few to a few hundred tokens, registry user turns "
            "answered by others.", "",
            "Written by `python benchmarks/time_estimate.py --real-target PATH --wheel WHL "
            "--docs`:", "", *lines]


#: the highest load average a ``dflash-regenerate-time`` region quotes, read back by ``--render``
LOAD = re.compile(r"load average before each command (?:was )?at most (\d+\.\d+)")


def render() -> None:
    """Rewrite both regions around the tables they hold."""
    body, about, lines = mem.saved_region("dflash-regenerate-time")
    load = LOAD.search(body)
    if load is None:
        raise SystemExit("docs/dflash.md: region dflash-regenerate-time quotes no load average")
    mem.write_region("dflash-regenerate-time", regenerate_docs(about, float(load[1]), lines))
    _, about, lines = mem.saved_region("dflash-run-time")
    mem.write_region("dflash-run-time", run_docs(about, lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-target", metavar="PATH",
                   help="a target folder (e.g. from `lengthwise dflash target FILE.gguf`)")
    p.add_argument("--wheel", metavar="WHL",
                   help="the evals registry wheel (pip download --no-deps "
                        "evals==3.0.1.post1)")
    p.add_argument("--work", metavar="DIR", help="folder for the runs (default: temporary)")
    p.add_argument("--stage", choices=("train", "regenerate", "all"), default="all",
                   help="the estimates compared (default all)")
    p.add_argument("--docs", action="store_true", help="write the docs/dflash.md regions")
    p.add_argument("--render", action="store_true",
                   help="rewrite the regions' text around their tables; run nothing")
    args = p.parse_args(argv)
    if args.render:
        render()
        return 0
    if not (args.real_target and args.wheel):
        p.error("--real-target and --wheel are required (or --render)")
    target, wheel = Path(args.real_target), Path(args.wheel)
    about = mem.about_config(target, vocabulary=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        if args.stage in ("regenerate", "all"):
            regen = []
            for n, shape in REGEN_SHAPES:
                regen.append((n, shape, compare_regenerate(target, regen_chats(wheel, work, n),
                                                           shape, work)))
                print(regen_table(regen)[-1], flush=True)
            lines = regen_table(regen)
            print("\n".join(lines))
            if args.docs:
                mem.write_region("dflash-regenerate-time", regenerate_docs(
                    about, max(r["load"] for _, _, r in regen), lines))
        if args.stage == "regenerate":
            return 0
        sets = {"long": mem.real_data(target, wheel, work)["prepared"],
                "mixed": mixed_data(target, wheel, work)}
        rows = []
        for name, shape in SHAPES:
            r = compare(target, sets[name], shape, work)
            rows.append((name, shape, r))
            print(table(rows)[-1], flush=True)
    lines = table(rows)
    print("\n".join(lines))
    if args.docs:
        mem.write_region("dflash-run-time", run_docs(about, lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
