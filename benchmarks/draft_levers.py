"""The draft's training levers, each alone on today's defaults, then those that helped together.

For every arm (``baseline``: today's defaults; one lever switched on; ``combined``: the
levers whose held-out loss was lower than the baseline's, with a 95 % interval below zero) and
every seed, a draft is trained by the recipe (``train_draft``) from a feature cache,
with the same held-out chats for every run (``split_seed``). Each held-out chat is then
evaluated teacher-forced at the same ``EVAL_ANCHORS`` anchors in every run
(:func:`~lengthwise.dflash.teacher_forced.evaluate_blocks`, the target's distributions from the
cache): loss, top-1 accuracy per block position, the acceptance those accuracies imply
(``simulated_acceptance_length``, ``1 + sum_k prod_{j<=k} acc_j``) and the
``expected_acceptance`` at temperature 1 (``alpha_j = 1 - TV``). A lever's effect is the
paired difference with the baseline per held-out chat (same chat, same seed), averaged
over the seeds, with its 95 % t-interval over the chats (:func:`lengthwise.intervals.t_interval`).
The first step's loss and gradient norm of each run come from its step log.

Runs are saved into the JSON as they finish; running the command again resumes after
the (arm, seed) pairs it holds.

Example::

    $ python benchmarks/draft_levers.py --prepared /work/cache/smol/prepared120 \\
          --target /work/cache/smol/target --features /work/cache/smol/fc/features
    $ python benchmarks/draft_levers.py --render   # DRAFT_LEVERS_RESULTS.md from the JSON
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from lengthwise.intervals import t_interval  # noqa: E402

JSON_PATH = HERE / "DRAFT_LEVERS.json"
MD_PATH = HERE / "DRAFT_LEVERS_RESULTS.md"

#: each lever alone, as settings of DFlashTrainConfig over today's defaults
LEVERS: dict[str, dict[str, Any]] = {
    "init_target": {"init": "target"},
    "zero_init_output": {"zero_init_output": True},
    "standardize_features": {"standardize_features": True},
    "target_kl": {"labels": "target_kl"},
}
#: arm settings that are the run's (:class:`~lengthwise.dflash.train_config.RunSettings`), not the
#: draft's: ``train_samples`` (the data-amount arms, ``--train-samples``)
RUN_KEYS = ("train_samples",)
#: the shape of every run (a 2-layer block-8 draft on two target layers)
SHAPE = {"draft_layers": 2, "num_features": 2, "block_size": 8, "max_tokens": 2048,
         "max_len": 2048, "grad_accum": 1, "max_slots": 512, "checkpoint_every": 0,
         "threads": 2}
#: anchors per held-out chat (drawn from seed 0: the same positions in every run)
EVAL_ANCHORS = 32
#: block slots per draft forward of the held-out pass (bounds its dense attention's memory)
SLOTS_PER_FORWARD = 1024
#: the held-out figures, and whether higher is better
FIGURES = {"simulated_acceptance_length": True, "expected_acceptance": True, "accuracy": True,
           "loss": False}


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def train_and_evaluate(arm: dict[str, Any], seed: int, a: argparse.Namespace) -> dict[str, Any]:
    """One draft trained with ``arm``'s settings and ``seed``; its held-out figures per chat."""
    import torch

    from lengthwise.dflash.features import open_features
    from lengthwise.dflash.load import trained_draft
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.target import Target, load_target
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    from experiments.held_out_chats import every_chat, held_out_chats

    torch.set_num_threads(2)
    run_keys = {k: v for k, v in arm.items() if k in RUN_KEYS}
    cfg = DFlashTrainConfig(steps=a.steps, seed=seed, progress=False, **SHAPE,
                            **{k: v for k, v in arm.items() if k not in RUN_KEYS})
    name = "+".join(f"{k}{v}" if k in RUN_KEYS else k for k, v in sorted(arm.items()))
    out = Path(a.work) / f"{name or 'baseline'}_{seed}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    summary = train_draft(cfg, RunSettings(
        target=a.target, data=a.prepared, out=str(out), eval_samples=a.eval_samples,
        eval_every=0, features=a.features, split_seed=a.split_seed, **run_keys),
        progress=False)
    seconds = time.perf_counter() - t0
    log = [json.loads(line) for line in open(summary["log"]) if '"loss"' in line]
    draft, _ = trained_draft(summary["final"])
    if a.heldout_prepared:  # a held-out set of its own: every chat of it
        chats = every_chat(open_prepared(a.heldout_prepared), cfg.max_len)
    else:
        chats = held_out_chats(open_prepared(a.prepared), cfg, a.eval_samples,
                               split_seed=a.split_seed)
    target = Target(load_target(summary["target"]), layers=draft.config.target_layers)
    per = chats.figures(draft, target,
                        open_features(a.heldout_features or a.features, verify=False),
                        ("loss", "accuracy", "simulated_acceptance_length",
                         "expected_acceptance", "slot_accuracy", "alpha"),
                        num_anchors=EVAL_ANCHORS, seed=0, temperature=1.0,
                        head_chunk=cfg.head_chunk, slots_per_forward=SLOTS_PER_FORWARD)
    return {"seconds": seconds, "first_loss": log[0]["loss"],
            "first_grad_norm": log[0].get("grad_norm"), "last_loss": log[-1]["loss"],
            "settings": arm, "train_samples": summary.get("train_samples"), "per_chat": per}


def _paired(res: dict[str, Any], arm: str, figure: str) -> dict[str, Any] | None:
    """Arm minus baseline per held-out chat, averaged over the seeds both ran; its interval."""
    runs, base = res["runs"].get(arm, {}), res["runs"].get("baseline", {})
    seeds = sorted(set(runs) & set(base))
    if not seeds:
        return None
    diffs = np.mean([np.subtract(runs[s]["per_chat"][figure], base[s]["per_chat"][figure])
                     for s in seeds], axis=0)
    iv = t_interval(list(diffs))
    iv["seeds"] = len(seeds)
    return iv


#: the figure whose paired interval decides whether a lever helped (the most sensitive one
#: at this size: accuracies of a few hundred slots per chat are noisy)
DECIDES = "loss"


def helped(res: dict[str, Any], lever: str) -> bool:
    """Whether ``lever`` lowered the held-out loss: its paired 95 % interval lies below zero."""
    iv = _paired(res, lever, DECIDES)
    return iv is not None and iv["hi"] is not None and iv["hi"] < 0


def combined(res: dict[str, Any]) -> dict[str, Any]:
    """The settings of every lever that helped, together (empty when none did)."""
    out: dict[str, Any] = {}
    for lever, settings in LEVERS.items():
        if helped(res, lever):
            out.update(settings)
    return out


def _save(res: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Every (arm, seed) not in the JSON yet, saved as each finishes."""
    path = Path(a.json)
    res = json.loads(path.read_text()) if path.is_file() else {}
    setup = {"prepared": a.prepared, "features": a.features, "steps": a.steps,
             "eval_samples": a.eval_samples, "split_seed": a.split_seed, "shape": SHAPE,
             "eval_anchors": EVAL_ANCHORS}
    if a.heldout_prepared:
        setup.update(heldout_prepared=a.heldout_prepared, heldout_features=a.heldout_features)
    if res.get("setup") not in (None, setup):
        raise SystemExit(f"{path} holds runs of other settings; give another --json")
    res["setup"] = setup
    res.setdefault("runs", {})
    Path(a.work).mkdir(parents=True, exist_ok=True)
    named = {"baseline": {}, **LEVERS}
    arms = [(name, named[name]) for name in a.arms or named]
    arms += list(data_arms(a.train_samples).items())
    for seed in a.seeds:  # every arm of a seed, then their combination, before the next seed
        for name, arm in arms:
            if str(seed) in res["runs"].get(name, {}):
                continue
            _say(f"{name} seed {seed}")
            res["runs"].setdefault(name, {})[str(seed)] = train_and_evaluate(arm, seed, a)
            _save(res, path)
        arm = combined(res)
        res["combined_settings"] = arm
        if len(arm) > 1:  # one lever alone is its own arm already
            for done_seed in a.seeds[: a.seeds.index(seed) + 1]:
                done = res["runs"].get("combined", {}).get(str(done_seed))
                if done is not None and done["settings"] == arm:
                    continue
                _say(f"combined {arm} seed {done_seed}")
                res["runs"].setdefault("combined", {})[str(done_seed)] = train_and_evaluate(
                    arm, done_seed, a)
                _save(res, path)
    _save(res, path)
    return res


def data_arms(counts: list[int] | None) -> dict[str, dict[str, Any]]:
    """The data-amount arms: training on a seeded draw of each count of samples.

    Example::

        >>> data_arms([300])
        {'train_samples=300': {'train_samples': 300}}
    """
    return {f"train_samples={n}": {"train_samples": n} for n in counts or []}


def _ci(iv: dict[str, Any] | None, fmt: str = "+.3f") -> str:
    if iv is None:
        return "-"
    return f"{iv['mean']:{fmt}} [{iv['lo']:{fmt}}, {iv['hi']:{fmt}}]"


def _verdict(iv: dict[str, Any] | None, higher: bool) -> str:
    if iv is None:
        return "-"
    if iv["lo"] <= 0 <= iv["hi"]:
        return "no difference detected at this size"
    return "better" if (iv["mean"] > 0) == higher else "worse"


def render_md(res: dict[str, Any]) -> str:
    """DRAFT_LEVERS_RESULTS.md from the saved figures."""
    s = res["setup"]
    arms = [a for a in ("baseline", *LEVERS, "combined") if a in res["runs"]]
    arms += sorted((a for a in res["runs"] if a not in arms), key=lambda a: int(a.split("=")[1]))
    lines = [
        "# The draft's training levers (SmolLM2-135M-Instruct target, CPU)",
        "",
        "Generated by `python benchmarks/draft_levers.py --render` from DRAFT_LEVERS.json "
        "(measured by `python benchmarks/draft_levers.py --prepared P --target T --features F`).",
        "",
        f"Data: `{s['prepared']}`, features `{s['features']}`. Every run trains a "
        f"{s['shape']['draft_layers']}-layer draft of block {s['shape']['block_size']} on "
        f"{s['shape']['num_features']} target layers for {s['steps']} steps of at most "
        f"{s['shape']['max_tokens']} tokens, today's other defaults. "
        + (f"Every chat of the held-out set `{s['heldout_prepared']}` is measured (chats of "
           "data sets training never sees)." if s.get("heldout_prepared") else
           f"The same {s['eval_samples']} chats are held out in every run (split seed "
           f"{s['split_seed']}).")
        + (" A `train_samples=N` arm trains on a seeded draw of N training chats (a smaller "
           "draw inside a larger one), the baseline on all of them, for the same steps."
           if any(a.startswith("train_samples=") for a in res["runs"]) else ""),
        f"Held-out figures use {s['eval_anchors']} anchors per chat, the same positions in "
        "every run. A difference is the arm minus the "
        "baseline per held-out chat, averaged over the seeds, with its 95 % t-interval over "
        "the chats.",
        "",
        "## Held-out figures (mean over chats and seeds)",
        "",
        "| arm | seeds | simulated acceptance | expected acceptance (T=1) | accuracy | loss | "
        "first-step loss | first-step grad norm |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def mean(arm: str, key: str) -> float:
        return float(np.mean([np.mean(r["per_chat"][key]) for r in res["runs"][arm].values()]))

    def first(arm: str, key: str) -> str:
        vals = [r[key] for r in res["runs"][arm].values() if r.get(key) is not None]
        return f"{np.mean(vals):.1f}" if vals else "-"

    for arm in arms:
        lines.append(
            f"| {arm} | {len(res['runs'][arm])} | {mean(arm, 'simulated_acceptance_length'):.3f}"
            f" | {mean(arm, 'expected_acceptance'):.3f} | {mean(arm, 'accuracy'):.3f} | "
            f"{mean(arm, 'loss'):.3f} | {first(arm, 'first_loss')} | "
            f"{first(arm, 'first_grad_norm')} |")
    lines += ["", "## Paired differences against the baseline (95 % intervals)", "",
              "| arm | simulated acceptance | expected acceptance (T=1) | accuracy | loss | "
              "verdict (simulated acceptance) |", "|---|---|---|---|---|---|"]
    for arm in arms[1:]:
        ivs = {f: _paired(res, arm, f) for f in FIGURES}
        lines.append(f"| {arm} | " + " | ".join(_ci(ivs[f]) for f in FIGURES) + " | "
                     + _verdict(ivs["simulated_acceptance_length"], True) + " |")
    lines += ["", "## Accuracy per block position (mean over chats and seeds)", "",
              "| arm | " + " | ".join(f"k={k}" for k in range(1, s["shape"]["block_size"]))
              + " |", "|---|" + "---|" * (s["shape"]["block_size"] - 1)]
    for arm in arms:
        acc = np.nanmean([np.array(r["per_chat"]["slot_accuracy"], dtype=float)
                          for r in res["runs"][arm].values()], axis=(0, 1))
        lines.append(f"| {arm} | " + " | ".join(f"{x:.3f}" for x in acc) + " |")
    comb = combined(res)
    lines += ["", "Levers that helped (held-out loss lower, its interval below zero): "
              + (", ".join(f"`{k}={v}`" for k, v in comb.items()) if comb else "none") + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prepared", default="/work/cache/smol/prepared120")
    p.add_argument("--target", default="/work/cache/smol/target")
    p.add_argument("--features", default="/work/cache/smol/fc/features")
    p.add_argument("--work", default="/tmp/levers/runs", help="run folders")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--eval-samples", type=int, default=16)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--arms", nargs="+", choices=["baseline", *LEVERS], default=None,
                   help="the arms to run, in this order (default: the baseline and every lever)")
    p.add_argument("--train-samples", type=int, nargs="+", default=None, metavar="N",
                   help="data-amount arms: train on a seeded draw of N training chats each")
    p.add_argument("--heldout-prepared", default=None, metavar="P",
                   help="a prepared set measured whole instead of the split's held-out chats")
    p.add_argument("--heldout-features", default=None, metavar="F",
                   help="the feature cache of --heldout-prepared")
    p.add_argument("--json", default=str(JSON_PATH))
    p.add_argument("--md", default=str(MD_PATH), help="where the Markdown goes")
    p.add_argument("--render", action="store_true", help="only write the Markdown from the JSON")
    a = p.parse_args()
    if bool(a.heldout_prepared) != bool(a.heldout_features):
        p.error("--heldout-prepared and --heldout-features go together")
    res = json.loads(Path(a.json).read_text()) if a.render else run(a)
    Path(a.md).write_text(render_md(res), encoding="utf-8")


if __name__ == "__main__":
    main()
