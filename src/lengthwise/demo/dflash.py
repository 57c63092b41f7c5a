"""``lengthwise demo --task dflash``: a DFlash draft trained once per batch order, then decoded.

Steps: the corpus and tokenizer of the causal-LM demo; a target (a small
Llama-style model trained here and cached, or ``--target PATH``); prompts from
the corpus and responses the target regenerates (cached); then, per order, a
draft trained from the same seed on the same data with lengthwise's loop
(:mod:`lengthwise.dflash.train`), its teacher-forced accuracy per block slot on
held-out samples (``simulated_acceptance_length``), and real speculative
decoding of held-out prompts (``acceptance_length``: tokens per verifying
target forward; ``lossless``: the output equals the target's greedy output).
Each order's draft is then exported (``OUT/ORDER/export``, the reference
``dflash`` layout) and the export, loaded back, goes through the recipe's eval
stage (:func:`~lengthwise.dflash.evaluate.evaluate_set` on the held-out prompts
at temperatures 0 and 1): its rows are the summary's ``eval_stage``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.atomic import atomic_open
from lengthwise.demo.config import DFlashDemoConfig
from lengthwise.demo.dflash_data import prepare
from lengthwise.demo.report import (
    add_ratios,
    common_region,
    diagnose_runs,
    format_columns,
    format_markdown,
    format_verdicts,
    plot_runs,
    summary_json,
)
from lengthwise.demo.results import read_log, summarise
from lengthwise.dflash.export import export_draft
from lengthwise.dflash.load import load_exported
from lengthwise.dflash.mask_token import grow_vocabulary
from lengthwise.dflash.objective import target_layer_ids
from lengthwise.dflash.table import render_eval
from lengthwise.pytorch.dist import GroupInfo
from lengthwise.terminal import TEXT_WIDTH, fit_lines
from lengthwise.train.device import (
    autocast_dtype,
    configure_torch,
    pick_device,
    rank_world,
    say,
    setup_distributed,
)

__all__ = ["DFLASH_KEYS", "DFlashOrderRun", "dflash_markdown",
           "render_dflash", "run_dflash_demo"]

#: per-order keys of ``--json`` (and the table's columns), in this order
DFLASH_KEYS: tuple[str, ...] = (
    "tokens_per_second", "throughput_vs_sorted", "padding_efficiency", "loss_roughness",
    "excess", "accuracy_first", "accuracy_final", "simulated_acceptance_length",
    "acceptance_length", "lossless", "verdict",
)


#: the speed table's columns (the printed table and ``summary.md``)
SPEED_KEYS: tuple[str, ...] = ("tokens_per_second", "throughput_vs_sorted", "padding_efficiency",
                               "loss_roughness", "excess", "skipped_steps")
#: the draft table's columns
DRAFT_KEYS: tuple[str, ...] = ("accuracy_first", "accuracy_final", "simulated_acceptance_length",
                               "acceptance_length", "lossless")


class DFlashOrderRun:
    """One order's draft: built from the seed, trained by the shared loop, then evaluated."""

    def __init__(self, order: str, data: Any, target: Any, cfg: DFlashDemoConfig, *,
                 out: str | Path, info: GroupInfo | None, meta: dict[str, Any]) -> None:
        from lengthwise.dflash.recipe import new_draft
        from lengthwise.dflash.train import DFlashTask
        from lengthwise.train.loop import TrainLoop

        self.order, self.data, self.target, self.cfg, self.info = order, data, target, cfg, info
        self.meta, self.run_dir = meta, Path(out) / order
        device = target.device
        draft = new_draft(target, cfg, mask_token_id=meta["mask_token_id"],
                          samples=(data.sample(i)["input_ids"][: cfg.max_len]
                                   for i in range(len(data.lengths))))
        self.task = DFlashTask(draft, target, cfg, order=order,
                               amp=autocast_dtype(cfg.dtype, device))
        self.loop = TrainLoop(self.task, order, data.lengths, data.sample, cfg,
                              run_dir=self.run_dir, device=device, info=info)

    def finish(self) -> dict[str, Any]:
        """Evaluate (rank 0), close the log, return the order's figures."""
        from lengthwise.dflash.speculative import acceptance
        from lengthwise.dflash.teacher_forced import evaluate_blocks, held_out_batches

        loop, cfg = self.loop, self.cfg
        main = rank_world(self.info)[0] == 0
        figures: dict[str, Any] = {}
        try:
            if main:
                started = time.perf_counter()
                # the training budgets: held-out batches of at most max_tokens tokens and
                # max_slots draft slots, the LM head in chunks of head_chunk
                ev = evaluate_blocks(self.task.model, self.target,
                                     held_out_batches(self.data.held_samples(),
                                                      max_tokens=cfg.max_tokens),
                                     num_anchors=cfg.eval_anchors or cfg.num_anchors,
                                     seed=cfg.seed, amp=self.task.amp,
                                     head_chunk=cfg.head_chunk, max_slots=cfg.slot_budget,
                                     max_tokens=cfg.max_tokens)
                dec = acceptance(self.task.model, self.target,
                                 self.data.held_prompts(cfg.eval_prompts),
                                 max_new_tokens=cfg.max_new_tokens, eos=self.meta["eos"])
                figures = {"eval_loss": ev.loss, "eval_accuracy": ev.accuracy,
                           "slot_accuracy": ev.slot_accuracy,
                           "simulated_acceptance_length": ev.simulated_acceptance_length,
                           **dec, **self.eval_stage(),
                           "eval_seconds": time.perf_counter() - started}
                loop.logger.event("eval", step=loop.step_count,
                                  **{k: v for k, v in figures.items()
                                     if k not in ("slot_accuracy", "eval_stage")})
        finally:
            loop.close()
        if not main:
            return {}
        records = read_log(loop.log_path)
        res = summarise(self.order, records, loop.log_path, figures["eval_loss"],
                        train_samples=len(self.data.lengths),
                        timing_warmup=cfg.timing_warmup, resumed_from=loop.resumed_from)
        acc = [r.get("accuracy") for r in records]
        tenth = max(1, len(acc) // 10)
        return {**res.to_dict(curves=True), **figures,
                "accuracy_first": _mean(acc[:tenth]), "accuracy_final": _mean(acc[-tenth:]),
                "accuracy": acc, "skipped_steps": sum(bool(r.get("skipped")) for r in records)}

    def eval_stage(self) -> dict[str, Any]:
        """Export the draft, load the export back and run the recipe's eval stage on it."""
        from lengthwise.dflash.evaluate import evaluate_set

        cfg = self.cfg
        folder = export_draft(self.task.model, self.run_dir / "export")
        served = load_exported(folder).to(self.target.device)
        rows = evaluate_set(served, self.target, self.data.held_prompts(cfg.eval_prompts),
                            name=self.order, temperatures=(0.0, 1.0),
                            max_new_tokens=cfg.max_new_tokens, eos=self.meta["eos"],
                            seed=cfg.seed, max_tokens=cfg.max_tokens, max_slots=cfg.slot_budget,
                            head_chunk=cfg.head_chunk)
        return {"export": str(folder), "eval_stage": rows}

    def close(self) -> None:
        self.loop.close()


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def run_dflash_demo(cfg: DFlashDemoConfig, *, orders: list[str], out: str | Path,
                    target: str | Path | None = None, data: str | Path | None = None,
                    tokenizer: str | Path | None = None, cache_dir: str | Path | None = None,
                    vocab_size: int = 2048, lockstep: bool = True,
                    plot: bool = True) -> dict[str, Any]:
    """Train and evaluate a draft per order; write ``out/summary.json``; the summary (rank 0)."""
    from lengthwise.demo.runner import run_lockstep
    from lengthwise.dflash.target import Target

    started = time.perf_counter()
    out = Path(out)
    group = setup_distributed(cfg.device)
    rank, world = rank_world(group)
    device = pick_device(cfg.device, group)
    configure_torch(device, threads=cfg.threads, deterministic=cfg.deterministic)
    model, ds, meta = prepare(cfg, target=target, data=data, tokenizer=tokenizer,
                              cache_dir=cache_dir, vocab_size=vocab_size, info=group,
                              device=device)
    n_layers = model.config.num_hidden_layers
    # the mask token: the id after the tokenizer's vocabulary (what adding <|MASK|> gives it),
    # one more row of the target's embedding
    mask_id = int(model.get_input_embeddings().weight.shape[0])
    grow_vocabulary(model, mask_id + 1)
    meta["mask_token_id"] = mask_id
    tgt = Target(model.to(device),
                 layers=target_layer_ids(n_layers, cfg.num_features or cfg.draft_layers))
    meta.update(target_layers=tgt.layers, world_size=world)
    say(group, f"lengthwise demo --task dflash: target {meta['target']} "
                f"({sum(p.numel() for p in model.parameters()):,} parameters, layers "
                f"{tgt.layers} feed the draft); {meta['train_samples']} training samples "
                f"({meta['train_tokens']} tokens, median {meta['length_p50']}, max "
                f"{meta['length_max']}) with responses the target wrote; {cfg.steps} steps x "
                f"{cfg.grad_accum} micro-batches of <= {cfg.max_tokens} tokens x {world} "
                f"rank(s); orders: {', '.join(orders)}")
    results = run_lockstep(
        orders, lambda o: DFlashOrderRun(o, ds, tgt, cfg, out=out, info=group, meta=meta),
        steps=cfg.steps, progress=cfg.progress and rank == 0, lockstep=lockstep)
    if rank != 0:
        return {}
    summary = _summarise(results, cfg, meta, out, plot)
    summary["wall_seconds"] = time.perf_counter() - started

    text = summary_json(summary.pop("strategies"), **summary)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "summary.json", "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    result = json.loads(text)
    with atomic_open(out / "summary.md", "w", encoding="utf-8") as fh:
        fh.write(dflash_markdown(result) + "\n")
    return result


def dflash_markdown(summary: dict[str, Any]) -> str:
    """The DFlash demo's tables as Markdown (``summary.md``): speed, then the draft's quality."""

    rows = summary["strategies"]
    return (format_markdown(rows, SPEED_KEYS) + "\n\n"
            + format_markdown(rows, ("accuracy_first", "accuracy_final", "eval_loss",
                                     *DRAFT_KEYS[2:])))


def _summarise(results: dict[str, dict[str, Any]], cfg: DFlashDemoConfig,
               meta: dict[str, Any], out: Path, plot: bool) -> dict[str, Any]:
    logs = {name: r["log_path"] for name, r in results.items()}
    region = common_region(logs)
    doctor = diagnose_runs(logs, region=region)
    rows: dict[str, dict[str, Any]] = {}
    for name, r in results.items():
        d = doctor[name]
        rows[name] = {
            "tokens_per_second": r["tokens_per_second"],
            "padding_efficiency": r["padding_efficiency"],
            "loss_roughness": d["loss_roughness"], "excess": d.get("excess"),
            "accuracy_first": r["accuracy_first"], "accuracy_final": r["accuracy_final"],
            "simulated_acceptance_length": r["simulated_acceptance_length"],
            "acceptance_length": r["acceptance_length"], "lossless": r["lossless"],
            "verdict": d["verdict"], "eval_loss": r["eval_loss"],
            "eval_accuracy": r["eval_accuracy"], "slot_accuracy": r["slot_accuracy"],
            "final_loss": r["final_loss"], "steps": r["steps"], "epochs": r["epochs"],
            "real_tokens": r["real_tokens"], "padded_tokens": r["padded_tokens"],
            "train_seconds": r["train_seconds"], "eval_seconds": r["eval_seconds"],
            "skipped_steps": r["skipped_steps"], "verify_forwards": r["verify_forwards"],
            "log": r["log_path"], "export": r["export"], "eval_stage": r["eval_stage"],
        }
    add_ratios(rows)
    rows = {n: {**{k: row.get(k) for k in DFLASH_KEYS}, **row} for n, row in rows.items()}
    summary: dict[str, Any] = {"strategies": rows, "task": "dflash",
                               "stable_region": list(region),
                               "config": {**asdict(cfg), "warmup": cfg.warmup_steps},
                               "data": meta}
    if plot:
        path = plot_runs({n: r["loss"] for n, r in results.items()}, out, region=region,
                         roughness={n: rows[n]["loss_roughness"] for n in rows},
                         title=f"DFlash draft (block {cfg.block_size}), {cfg.steps} steps x "
                               f"{cfg.grad_accum} micro-batches of <= {cfg.max_tokens} tokens")
        if path is not None:
            summary["plot"] = path
    return summary


def render_dflash(summary: dict[str, Any], *, wide: bool = False) -> str:
    """The DFlash demo's tables, as the command prints them: within
    :data:`~lengthwise.terminal.TEXT_WIDTH` columns unless ``wide``."""

    rows = summary["strategies"]
    width = None if wide else TEXT_WIDTH
    speed = format_columns(rows, SPEED_KEYS, width=width)
    draft = format_columns(rows, DRAFT_KEYS, width=width)
    lo, hi = summary.get("stable_region", [None, None])
    lines = [speed, "", draft, "", format_verdicts(rows), "",
             f"loss_roughness over steps {lo}-{hi}; excess: roughness / the order's own "
             "sampling floor; acceptance_length: tokens per verifying target forward "
             "(speculative decoding of held-out prompts); lossless: the output equals the "
             "target's greedy output; skipped_steps: updates SpikeGuard skipped."]
    stage = [r for row in rows.values() for r in row.get("eval_stage") or []]
    if stage:
        lines += ["", "eval stage (each order's exported draft, held-out prompts; set: the "
                      "order):", render_eval(stage)]
    if summary.get("plot"):
        lines.append(f"loss curves: {summary['plot']}")
    lines.append(f"wall time {summary.get('wall_seconds', 0.0):.0f} s")
    return "\n".join(lines) if wide else fit_lines(lines)

