"""``run_demo``: data, tokenizer, one training run per order, and the comparison.

Example::

    >>> import tempfile
    >>> from lengthwise.demo.corpus import stdlib_docstrings
    >>> texts = stdlib_docstrings(limit_files=40)
    >>> cfg = DemoConfig(max_samples=40, grad_accum=2, max_tokens=256, max_len=128,
    ...                  eval_samples=8, progress=False)
    >>> out = tempfile.mkdtemp()
    >>> summary = run_demo(cfg, orders=["random", "stratified"], out=out, texts=texts,
    ...                    cache_dir=out, plot=False, vocab_size=300)
    >>> sorted(summary["strategies"])
    ['random', 'stratified']
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lengthwise.atomic import atomic_open
from lengthwise.demo.config import DemoConfig, parse_orders
from lengthwise.demo.corpus import corpus_fingerprint, load_corpus
from lengthwise.demo.data import DemoData
from lengthwise.demo.model import build_model, count_parameters
from lengthwise.demo.report import (
    JSON_KEYS,
    add_ratios,
    diagnose_runs,
    format_markdown,
    format_table,
    plot_runs,
    summary_json,
)
from lengthwise.demo.runner import train_orders
from lengthwise.demo.tokenizer import default_cache_dir, get_tokenizer
from lengthwise.doctor import verdict_for
from lengthwise.doctor.numeric import counted
from lengthwise.errors import ConfigError
from lengthwise.pytorch.dist import GroupInfo
from lengthwise.terminal import TEXT_WIDTH, fit_lines
from lengthwise.train.device import barrier, rank_world, say, setup_distributed

__all__ = ["check_targets", "prepare_data", "run_demo"]


def prepare_data(cfg: DemoConfig, *, data: str | Path | None = None,
                 tokenizer: str | Path | None = None, cache_dir: str | Path | None = None,
                 vocab_size: int = 2048, texts: list[str] | None = None,
                 group: GroupInfo | None = None) -> tuple[DemoData, dict[str, Any]]:
    """Corpus, tokenizer and tokenised split; rank 0 builds the caches, the others wait."""

    main = rank_world(group)[0] == 0
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    info: dict[str, Any] = {}
    for turn in (0, 1):  # rank 0 first (it fills the caches), then every other rank
        if (turn == 0) == main:
            if texts is None:
                texts = load_corpus(data, cache_dir=cache)
            tok = get_tokenizer(texts, path=tokenizer, cache_dir=cache, vocab_size=vocab_size,
                                fingerprint=corpus_fingerprint(texts))
        barrier(group)
    assert texts is not None
    info["corpus"] = str(data) if data is not None else "python standard library docstrings"
    info["texts"] = len(texts)
    info["tokenizer"] = str(tokenizer) if tokenizer is not None else f"BPE {vocab_size} (local)"
    demo_data = DemoData.build(texts, tok, max_len=cfg.max_len, eval_samples=cfg.eval_samples,
                               seed=cfg.seed, max_samples=cfg.max_samples)
    info.update(demo_data.describe())
    return demo_data, info


def check_targets(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The comparisons the demo is about, as plain booleans (``None``: not measurable).

    Example::

        >>> rows = {"stratified": {"flops": 6.0, "eval_loss": 4.0, "real_tokens": 9},
        ...         "random": {"flops": 10.0, "eval_loss": 4.2, "real_tokens": 9}}
        >>> checks = check_targets(rows)
        >>> checks["same_data_every_order"], checks["stratified_compute_below_random"]
        (True, True)
    """
    def get(order: str, key: str) -> Any:
        return rows.get(order, {}).get(key)

    def cmp(a: Any, b: Any, op: str) -> bool | None:
        if a is None or b is None:
            return None
        return bool(a <= b) if op == "<=" else bool(a >= b)

    def scaled(value: Any, by: float) -> Any:
        return None if value is None else value * by

    tokens = [row.get("real_tokens") for row in rows.values()]
    return {
        "same_data_every_order": None if len(tokens) < 2 or None in tokens
        else len(set(tokens)) == 1,
        "stratified_compute_below_random": cmp(get("stratified", "flops"),
                                               scaled(get("random", "flops"), 0.8), "<="),
        "stratified_throughput_near_sorted": cmp(get("stratified", "throughput_vs_sorted"),
                                                 0.9, ">="),
        "random_throughput_far_below_sorted": cmp(get("random", "throughput_vs_sorted"), 0.7,
                                                  "<="),
        "stratified_as_smooth_as_random": cmp(get("stratified", "roughness_ratio"), 1.2, "<="),
        "sorted_eval_worse_than_stratified": cmp(get("sorted", "eval_loss"),
                                                 get("stratified", "eval_loss"), ">="),
        "stratified_eval_no_worse_than_random": cmp(get("stratified", "eval_loss"),
                                                    get("random", "eval_loss"), "<="),
    }


def run_demo(cfg: DemoConfig, *, orders: list[str] | str | None = None,
             out: str | Path = "lengthwise-demo/lm", data: str | Path | None = None,
             tokenizer: str | Path | None = None, cache_dir: str | Path | None = None,
             vocab_size: int = 2048, lockstep: bool = True, plot: bool = True,
             texts: list[str] | None = None) -> dict[str, Any]:
    """Train every order, compare them, write ``out/summary.json`` and the loss plot.

    Returns the summary (``{"strategies": {order: figures}, ...}``) on rank 0 and an
    empty dict on the other ranks of a ``torchrun`` job.
    """
    started = time.perf_counter()
    order_list = parse_orders(orders)
    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device}: torch sees no CUDA device here")
    out = Path(out)
    group = setup_distributed(cfg.device)
    rank, world = rank_world(group)
    demo_data, info = prepare_data(cfg, data=data, tokenizer=tokenizer, cache_dir=cache_dir,
                                   vocab_size=vocab_size, texts=texts, group=group)

    params = count_parameters(build_model(cfg.model_size, vocab_size=demo_data.vocab_size,
                                          max_len=cfg.max_len, device="meta"))
    info.update(model_size=cfg.model_size, parameters=params, world_size=world)
    say(group, f"lengthwise demo: {info['train_samples']} training samples "
               f"({info['train_tokens']} tokens, median {info['length_p50']}, "
               f"p99 {info['length_p99']}, max {info['length_max']}), "
               f"{info['eval_samples']} held out; {cfg.model_size} model with {params:,} "
               f"parameters; {counted(cfg.epochs, 'epoch')} per order, each in its own steps of "
               f"{cfg.grad_accum} micro-batches of <= {cfg.max_tokens} tokens x {world} "
               f"rank(s); orders: {', '.join(order_list)}")
    results = train_orders(order_list, demo_data, cfg, out=out, info=group, lockstep=lockstep)
    if rank != 0:
        return {}
    logs = {name: r.log_path for name, r in results.items()}
    rows = _order_rows(results, diagnose_runs(logs))
    meta = {
        "checks": check_targets(rows),
        "config": _config_dict(cfg),
        "data": info,
        "wall_seconds": None,  # set last
    }
    out.mkdir(parents=True, exist_ok=True)
    if plot:
        regions = {n: tuple(rows[n]["stable_region"]) for n in rows}
        path = plot_runs({n: r.loss for n, r in results.items()}, out, region=regions,
                         roughness={n: rows[n]["loss_roughness"] for n in rows},
                         title=_title(cfg, info), group=group)
        if path is not None:
            meta["plot"] = path
    meta["wall_seconds"] = time.perf_counter() - started
    text = summary_json(rows, **meta)
    for name, content in (("summary.json", text), ("summary.md", format_markdown(rows))):
        with atomic_open(out / name, "w", encoding="utf-8") as fh:
            fh.write(content + "\n")
    return json.loads(text)


def _order_rows(results: dict[str, Any], doctor: dict[str, dict[str, Any]],
                ) -> dict[str, dict[str, Any]]:
    """One row of figures per order: the run's own, the doctor's, and the ratios between orders."""
    rows: dict[str, dict[str, Any]] = {}
    for name, r in results.items():
        rows[name] = {
            "tokens_per_second": r.tokens_per_second,
            "padding_efficiency": r.padding_efficiency,
            "loss_roughness": doctor[name]["loss_roughness"],
            "excess": doctor[name]["excess"],
            "eval_loss": r.eval_loss,
            "verdict": doctor[name]["verdict"],
            "corrected_roughness": doctor[name]["corrected_roughness"],
            "real_tokens_per_step": r.tokens_per_step,
            "step_cv_ratio": r.extra.get("step_cv_ratio"),
            "final_loss": r.final_loss,
            "steps": r.steps,
            "epochs": r.epochs,
            "real_tokens": r.real_tokens,
            "flops": r.extra.get("flops"),
            "stable_region": doctor[name]["stable_region"],
            "padded_tokens": r.padded_tokens,
            "train_seconds": r.train_seconds,
            "timed_steps": r.extra.get("timed_steps"),
            "log": r.log_path,
            **_micro_figures(r.extra.get("micro_log"), r.extra.get("micro_world")),
        }
    add_ratios(rows)
    return {n: {**{k: row[k] for k in JSON_KEYS}, **row} for n, row in rows.items()}


def _micro_figures(path: str | None, world: int | None) -> dict[str, Any]:
    """Where an order's per-micro-batch log is, the simulated ranks it is rank 0 of, and the
    doctor's verdict on it (no log: ``{}``)."""
    if path is None:
        return {}

    return {"micro_log": path, "micro_world": world,
            "micro_verdict": verdict_for(path, timing=False).summary}


def _config_dict(cfg: DemoConfig) -> dict[str, Any]:
    out = asdict(cfg)
    out["warmup"] = cfg.warmup_steps
    return out


def _title(cfg: DemoConfig, info: dict[str, Any]) -> str:
    return (f"{cfg.model_size} model ({info['parameters']:,} params), "
            f"{counted(cfg.epochs, 'epoch')} of "
            f"{info['train_samples']:,} samples, steps of {cfg.grad_accum} micro-batches of "
            f"<= {cfg.max_tokens} tokens, seed {cfg.seed}")


#: what one run can and cannot say, and where the comparison over several seeds is
ORDER_EXPERIMENT_NOTE = (
    "This is one seed. One seed cannot tell whether a difference in held-out loss would "
    "hold over other seeds. benchmarks/order_arms.py trains 5 paired seeds at equal data "
    "and at equal compute (benchmarks/ORDER_ARMS.json; README 'Does the order change the "
    "model?').")

#: what a check that did not hold means, printed under the table
CHECK_NOTES = {
    "same_data_every_order": (
        "same_data_every_order asks whether every order trained the same real tokens. Under "
        "torchrun a plan may repeat or drop a few samples to even out the ranks; a resumed "
        "run counts only the steps its log holds."),
    "stratified_compute_below_random": (
        "stratified_compute_below_random asks whether stratified's counted FLOPs are at most "
        "0.8x random's for the same data. It does not hold when the lengths vary little, so "
        "that random batches pad little."),
    "stratified_throughput_near_sorted": (
        "stratified_throughput_near_sorted asks whether stratified trains at least 0.9x "
        "sorted's tokens per second. The load of a shared machine moves throughput by "
        "several percent; rerun before reading much into it."),
    "random_throughput_far_below_sorted": (
        "random_throughput_far_below_sorted asks whether random trains at most 0.7x sorted's "
        "tokens per second (its padding). It does not hold when the lengths vary little, so "
        "that random batches pad little."),
    "stratified_as_smooth_as_random": (
        "stratified_as_smooth_as_random asks whether stratified's loss_roughness is at most "
        "1.2x random's. Each order's steps hold different tokens, so their sampling noise "
        "differs; excess in --json divides it out."),
    "sorted_eval_worse_than_stratified": (
        "sorted_eval_worse_than_stratified asks whether sorted's held-out loss is at least "
        "stratified's; both take about the same steps for the same data. One seed cannot tell "
        "whether a small difference holds; benchmarks/order_arms.py compares 5 paired seeds."),
    "stratified_eval_no_worse_than_random": (
        "stratified_eval_no_worse_than_random asks whether stratified's held-out loss is at "
        "most random's after the same data. Random pads more, so it takes more optimizer steps "
        "for that data (the steps column): more updates, at more FLOPs."),
}


def render(summary: dict[str, Any], *, wide: bool = False) -> str:
    """The table and the checks, as the command prints them: within
    :data:`~lengthwise.terminal.TEXT_WIDTH` columns unless ``wide``."""
    rows = summary["strategies"]
    lines = [format_table(rows, width=None if wide else TEXT_WIDTH), ""]
    tokens = {row.get("real_tokens") for row in rows.values()}
    same = (f"the same {tokens.pop():,} real tokens" if len(tokens) == 1 and None not in tokens
            else "the real tokens shown")
    epochs = summary.get("config", {}).get("epochs")
    lines.append(f"Every order trained {same}"
                 + (f" ({counted(epochs, 'epoch')})" if epochs else "")
                 + ", in its own plan's steps; flops counts the micro-batches trained, padding "
                 "included.")
    lines.append("loss_roughness and the verdicts are what `lengthwise doctor --no-timing "
                 "OUT/<order>/train_log.jsonl` says: each log over its own stable region "
                 "(stable_region in --json), without the step times a loaded machine moves.")
    checks = summary.get("checks", {})
    if checks:
        lines.append("checks: " + ", ".join(
            f"{k} {'yes' if v else 'no' if v is not None else '-'}" for k, v in checks.items()))
        for key, value in checks.items():
            if value is False and key in CHECK_NOTES:
                lines.append(f"note: {CHECK_NOTES[key]}")
    if summary.get("plot"):
        lines.append(f"loss curves: {summary['plot']}")
    micro = {name: row for name, row in rows.items() if row.get("micro_log")}
    if micro:
        first = next(iter(micro.values()))
        lines.append(f"per-micro-batch logs (one micro-batch's loss per line: rank 0 of the "
                     f"steps' micro-batches spread over {first['micro_world']} simulated ranks): "
                     f"{Path(first['micro_log']).parent.parent}/<order>/micro_log.jsonl; the "
                     "doctor on them:")
        lines.extend(f"  {name}: {row['micro_verdict']}" for name, row in micro.items())
    lines.append(ORDER_EXPERIMENT_NOTE)
    lines.append(f"wall time {summary.get('wall_seconds', 0.0):.0f} s")
    return "\n".join(lines) if wide else fit_lines(lines)
