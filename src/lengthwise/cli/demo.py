"""``lengthwise demo``: train a small real model once per batch order and compare.

Offline and self-contained: the text is the Python standard library's
docstrings, the tokenizer is trained locally. ``--task lm`` (the default)
trains a randomly initialised Llama-style model per order; ``--task dflash``
trains a DFlash draft per order against a frozen target (a small target trained
locally and cached, or ``--target PATH``), on responses the target
regenerated, and measures its acceptance length with real speculative
decoding. Prints one row per order and writes every run's
``train_log.jsonl``, ``summary.json`` and ``loss_curves.png`` under ``--out``
(``lengthwise-demo/lm`` or ``lengthwise-demo/dflash`` by default); ``--task lm``
also writes each order's ``micro_log.jsonl``, one micro-batch's loss per line (rank 0
of the steps' micro-batches spread over 8 simulated ranks).

Example::

    $ lengthwise demo                       # every order, writes under lengthwise-demo/lm
    $ lengthwise demo --task dflash         # every order, writes under lengthwise-demo/dflash
    $ lengthwise demo --epochs 2 --model-size small --json
    $ torchrun --nproc_per_node 2 -m lengthwise demo --orders random,stratified
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from lengthwise.demo.config import DemoConfig, DFlashDemoConfig, parse_orders
from lengthwise.errors import ConfigError
from lengthwise.finite_json import finite_json_text
from lengthwise.flag_field import flag_name

HELP = "train a small model once per batch order and compare (offline)"


def _defaults() -> dict[str, dict[str, Any]]:
    return {"lm": {f.name: f.default for f in fields(DemoConfig)},
            "dflash": {f.name: f.default for f in fields(DFlashDemoConfig)}}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command; defaults come from the tasks' config classes."""
    d = _defaults()

    def both(name: str, fmt: str = "{}") -> str:
        lm, df = d["lm"][name], d["dflash"][name]
        if lm == df:
            return f"(default: {fmt.format(lm)})"
        return f"(default: {fmt.format(lm)}; with --task dflash: {fmt.format(df)})"

    def one(name: str, fmt: str = "{}") -> str:
        return f"(default: {fmt.format(d['dflash'][name])})"

    def lm(name: str, fmt: str = "{}") -> str:
        return f"(default: {fmt.format(d['lm'][name])})"

    p = subparsers.add_parser(
        "demo", help=HELP,
        description=__doc__.split("\n\n")[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["lm", "dflash"], default="lm",
                   help="lm: a causal LM from scratch; dflash: a DFlash draft against a frozen "
                        "target (default: lm)")
    p.add_argument("--epochs", type=_positive,
                   help=f"lm: epochs per order over the same samples; each order takes its own "
                        f"plan's steps {lm('epochs')}")
    p.add_argument("--steps", type=_positive, help=f"dflash: optimizer steps per order "
                                                   f"{one('steps')}")
    p.add_argument("--orders", default="all",
                   help="comma-separated orders: sorted, random, bucket-random, interleave, "
                        "stratified, packed, or 'all' (default: all)")
    p.add_argument("--model-size", default=None,
                   choices=["tiny", "small", "base", "medium", "large"],
                   help="model width and depth (lm task; tiny trains quickly on CPU) "
                        "(default: tiny)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--out", default=None,
                   help="folder for the logs, summary.json and loss_curves.png "
                        f"(default: {default_out('lm')}; with --task dflash: "
                        f"{default_out('dflash')})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model, data split, plans (default: 0)")
    p.add_argument("--grad-accum", type=_positive,
                   help=f"micro-batches per optimizer step, the same for every order "
                        f"{both('grad_accum')}")
    p.add_argument("--max-tokens", type=_positive,
                   help=f"token budget per micro-batch (rows x padded length) "
                        f"{both('max_tokens')}")
    p.add_argument("--max-len", type=_positive,
                   help=f"samples are truncated to this many tokens {both('max_len')}")
    p.add_argument("--lr", type=float, help=f"peak learning rate (AdamW) {both('lr')}")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps (default: 10%% of each order's steps; with --task "
                        "dflash: --warmup-ratio of --steps)")
    p.add_argument("--warmup-ratio", type=float,
                   help=f"dflash: warm-up as a share of --steps {one('warmup_ratio')}")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"],
                   help=f"learning rate after warm-up {both('schedule')}")
    p.add_argument("--buckets", default="auto",
                   help="bucket count or 'auto' (padding-optimal) (default: auto)")
    p.add_argument("--eval-samples", type=_positive,
                   help=f"held-out samples, the same for every order {both('eval_samples')}")
    p.add_argument("--max-samples", type=_positive, default=None,
                   help="train on a random subset of this many samples (default: all)")
    p.add_argument("--data", default=None,
                   help="your own text: a JSON-lines file with a 'text' field, or a Hugging "
                        "Face dataset saved with save_to_disk (default: standard-library "
                        "docstrings)")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer.json to use instead of training one")
    p.add_argument("--vocab-size", type=_positive, default=2048,
                   help="vocabulary of the locally trained tokenizer (default: 2048)")
    p.add_argument("--cache-dir", default=None,
                   help="where the corpus, tokenizer and dflash target are cached "
                        "(default: $LENGTHWISE_CACHE or ~/.cache/lengthwise)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process on CPU, 0 for torch's default (default: 1)")
    p.add_argument("--dtype", default=None,
                   help="fp32, bf16 or fp16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save a checkpoint every N steps under OUT/<order>/checkpoints "
                        "(default: 0, never)")
    p.add_argument("--resume", action="store_true",
                   help="continue each order from its newest checkpoint")
    p.add_argument("--sequential", action="store_true",
                   help="train the orders one after another instead of in lock-step")
    p.add_argument("--json", action="store_true",
                   help='print {"strategies": {name: figures}} as JSON instead of the table')
    p.add_argument("--no-plot", action="store_true", help="do not write loss_curves.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--wide", action="store_true",
                   help="one row per order however wide, and lines left unwrapped; without it "
                        "the text fits 100 columns (a wide table turns to one row per figure)")
    g = p.add_argument_group("dflash task")
    g.add_argument("--target", default=None,
                   help="a local Hugging Face causal-LM checkpoint to draft for (e.g. a Qwen3 "
                        "model; bf16 on CUDA) (default: a small target trained locally on the "
                        "corpus and cached)")
    g.add_argument("--block-size", type=_positive, help=f"draft block size {one('block_size')}")
    g.add_argument("--draft-layers", type=_positive,
                   help=f"draft decoder layers {one('draft_layers')}")
    g.add_argument("--num-anchors", type=_positive,
                   help=f"blocks per sample per step {one('num_anchors')}")
    g.add_argument("--eval-prompts", type=_positive,
                   help=f"prompts decoded speculatively per order {one('eval_prompts')}")
    g.add_argument("--max-new-tokens", type=_positive,
                   help=f"tokens generated per prompt {one('max_new_tokens')}")
    p.set_defaults(func=run)


_COMMON = {"grad_accum": "grad_accum", "max_tokens": "max_tokens",
           "max_len": "max_len", "lr": "lr", "lr_schedule": "schedule",
           "eval_samples": "eval_samples"}
#: packages of the ``dflash`` extra that the dflash task needs beyond the ``demo`` extra: imported
#: before any work, so that a missing one stops the command at once with its install line
DFLASH_NEEDS = ("pyarrow",)
#: the run length of each task: epochs of the same samples (lm), optimizer steps (dflash)
_LM = {"epochs": "epochs"}
_DFLASH = {"steps": "steps", "warmup_ratio": "warmup_ratio", "block_size": "block_size",
           "draft_layers": "draft_layers", "num_anchors": "num_anchors",
           "eval_prompts": "eval_prompts", "max_new_tokens": "max_new_tokens"}


def _config_kwargs(args: argparse.Namespace, table: dict[str, str]) -> dict[str, Any]:
    return {field: getattr(args, arg) for arg, field in table.items()
            if getattr(args, arg) is not None}


def default_out(task: str) -> str:
    """The folder a task writes under when ``--out`` is not given: one per task.

    Example::

        >>> default_out("dflash")
        'lengthwise-demo/dflash'
    """
    return f"lengthwise-demo/{task}"


def _check_folder(option: str, path: str | None) -> None:
    """A folder the demo writes into: it may not exist yet, but nothing on its path is a file."""
    if path is None:
        return
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option} {path}: exists and is not a folder")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{option} {path}: {parent} is not a folder")


def _check_task_options(args: argparse.Namespace) -> None:
    """An option of the other task is an error, not silently ignored."""
    if args.task == "dflash":
        if args.model_size is not None:
            raise ConfigError("--model-size is for --task lm; the dflash task's target is "
                              "--target PATH or a small one trained here")
        if args.epochs is not None:
            raise ConfigError("--epochs is for --task lm; the dflash task trains --steps steps")
        return
    if args.steps is not None:
        raise ConfigError("--steps is for --task dflash; the lm task trains --epochs epochs of "
                          "the same samples, each order in its own steps")
    for name in ("target", *_DFLASH):
        if getattr(args, name) is not None:
            raise ConfigError(f"{flag_name(name)} needs --task dflash")


def _starting(task: str) -> None:
    """The first line, once the options are checked and before torch and the corpus load
    (rank 0 of a ``torchrun`` job only: its process group does not exist yet)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"lengthwise demo: the {task} task; loading torch, then the corpus and tokenizer "
              "(cached after the first run)", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print the comparison; returns the exit code."""

    buckets: int | str = args.buckets
    if isinstance(buckets, str) and buckets != "auto":
        try:
            buckets = int(buckets)
        except ValueError:
            raise ConfigError(
                f"--buckets must be a count or 'auto', got {args.buckets!r}") from None
    if args.out is None:
        args.out = default_out(args.task)  # each task its own folder: neither overwrites the other
    _check_folder("--out", args.out)
    _check_folder("--cache-dir", args.cache_dir)
    orders = parse_orders(args.orders)
    common = dict(warmup=args.warmup, seed=args.seed, buckets=buckets, device=args.device,
                  dtype=args.dtype, checkpoint_every=args.checkpoint_every,
                  resume=args.resume, progress=not args.no_progress,
                  threads=args.threads or None, max_samples=args.max_samples,
                  **_config_kwargs(args, _COMMON))
    _check_task_options(args)
    if args.task == "dflash":
        for module in DFLASH_NEEDS:  # not after the target is trained and its data written
            importlib.import_module(module)
        from lengthwise.demo.config import DFlashDemoConfig
        from lengthwise.demo.dflash import render_dflash, run_dflash_demo

        cfg = DFlashDemoConfig(**common, **_config_kwargs(args, _DFLASH))
        _starting(args.task)
        summary = run_dflash_demo(cfg, orders=orders, out=args.out, target=args.target,
                                  data=args.data, tokenizer=args.tokenizer,
                                  cache_dir=args.cache_dir, vocab_size=args.vocab_size,
                                  lockstep=not args.sequential, plot=not args.no_plot)
        text = render_dflash
    else:
        from lengthwise.demo.config import DemoConfig

        cfg = DemoConfig(model_size=args.model_size or "tiny", **common,
                         **_config_kwargs(args, _LM))
        _starting(args.task)
        from lengthwise.demo.main import render, run_demo

        summary = run_demo(cfg, orders=orders, out=args.out, data=args.data,
                           tokenizer=args.tokenizer, cache_dir=args.cache_dir,
                           vocab_size=args.vocab_size, lockstep=not args.sequential,
                           plot=not args.no_plot)
        text = render
    from lengthwise.train.device import is_main

    if not is_main():
        return 0
    if args.json:
        print(finite_json_text(summary, indent=2))
    else:
        print(text(summary, wide=args.wide))
    sys.stdout.flush()
    return 0
