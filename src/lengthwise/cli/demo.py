"""``lengthwise demo``: train a small real model once per batch order and compare.

Offline and self-contained: the text is the Python standard library's
docstrings, the tokenizer is trained locally, the model is a randomly
initialised Llama-style ``transformers`` model. Prints one row per order
(throughput, padding, loss roughness, held-out loss, the doctor's verdict) and
writes every run's ``train_log.jsonl``, ``summary.json`` and
``loss_curves.png`` under ``--out``.

Example::

    $ lengthwise demo                       # about 5 minutes on two CPU cores
    $ lengthwise demo --steps 600 --model-size small --json
    $ torchrun --nproc_per_node 2 -m lengthwise demo --orders random,stratified
"""

from __future__ import annotations

import argparse
import sys

DEFAULTS_NOTE = (
    "Defaults: tiny model, 200 optimizer steps of 8 micro-batches of at most 512 tokens "
    "(samples truncated to 256), single-threaded on CPU."
)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo", help="train a small model once per batch order and compare (offline)",
        description=__doc__.split("\n\n")[0].replace("``", "") + " " + DEFAULTS_NOTE,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=_positive, default=200, help="optimizer steps per order")
    p.add_argument("--orders", default="all",
                   help="comma-separated orders: sorted, random, bucket-random, interleave, "
                        "stratified, packed (when the packed layout is installed), or 'all'")
    p.add_argument("--model-size", default="tiny",
                   choices=["tiny", "small", "base", "medium", "large"],
                   help="model width and depth (tiny trains quickly on CPU)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--out", default="lengthwise-demo",
                   help="folder for the logs, summary.json and loss_curves.png")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, data split, plans")
    p.add_argument("--grad-accum", type=_positive, default=8,
                   help="micro-batches per optimizer step (the same for every order)")
    p.add_argument("--max-tokens", type=_positive, default=512,
                   help="token budget per micro-batch (rows x padded length)")
    p.add_argument("--max-len", type=_positive, default=256,
                   help="samples are truncated to this many tokens")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps (default: 10%% of --steps)")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                   help="learning rate after warm-up")
    p.add_argument("--buckets", default="auto",
                   help="bucket count or 'auto' (padding-optimal)")
    p.add_argument("--eval-samples", type=_positive, default=256,
                   help="held-out samples (the same for every order)")
    p.add_argument("--max-samples", type=_positive, default=None,
                   help="train on a random subset of this many samples")
    p.add_argument("--data", default=None,
                   help="your own text: a JSON-lines file with a 'text' field, or a Hugging "
                        "Face dataset saved with save_to_disk")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer.json to use instead of training one")
    p.add_argument("--vocab-size", type=_positive, default=2048,
                   help="vocabulary of the locally trained tokenizer")
    p.add_argument("--cache-dir", default=None,
                   help="where the corpus and tokenizer are cached "
                        "(default: $LENGTHWISE_CACHE or ~/.cache/lengthwise)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process on CPU (0: torch's default)")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: bf16 on CUDA)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save a checkpoint every N steps under OUT/<order>/checkpoints")
    p.add_argument("--resume", action="store_true",
                   help="continue each order from its newest checkpoint")
    p.add_argument("--sequential", action="store_true",
                   help="train the orders one after another instead of in lock-step")
    p.add_argument("--json", action="store_true",
                   help='print {"strategies": {name: figures}} as JSON instead of the table')
    p.add_argument("--no-plot", action="store_true", help="do not write loss_curves.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print the comparison; returns the exit code."""
    from lengthwise.demo.main import parse_orders, render, run_demo
    from lengthwise.demo.run import DemoConfig, Dist

    buckets: int | str = args.buckets
    if isinstance(buckets, str) and buckets != "auto":
        try:
            buckets = int(buckets)
        except ValueError:
            raise ValueError(f"--buckets must be a count or 'auto', got {args.buckets!r}") from None
    orders = parse_orders(args.orders)
    cfg = DemoConfig(
        steps=args.steps, grad_accum=args.grad_accum, max_tokens=args.max_tokens,
        max_len=args.max_len, model_size=args.model_size, lr=args.lr, warmup=args.warmup,
        schedule=args.lr_schedule, seed=args.seed, buckets=buckets,
        eval_samples=args.eval_samples, max_samples=args.max_samples, device=args.device,
        dtype=args.dtype, checkpoint_every=args.checkpoint_every, resume=args.resume,
        progress=not args.no_progress, threads=args.threads or None)
    summary = run_demo(cfg, orders=orders, out=args.out, data=args.data,
                       tokenizer=args.tokenizer, cache_dir=args.cache_dir,
                       vocab_size=args.vocab_size, lockstep=not args.sequential,
                       plot=not args.no_plot)
    if not Dist.from_env().is_main:
        return 0
    if args.json:
        import json

        print(json.dumps(summary, indent=2))
    else:
        print(render(summary))
    sys.stdout.flush()
    return 0
