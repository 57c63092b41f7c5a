"""Training throughput per batch order on one GPU: the demo's comparison at full size.

Trains a Llama-style model of about 350 million parameters (``--model-size
large``: 24 layers, width 1024, vocabulary 32,768) in bf16 with SDPA attention
(FlashAttention 2 when ``flash_attn`` is installed), on sequences up to 8,192
tokens, once per order, and prints real (non-pad) tokens per second for each.
Only throughput is measured here; the token ids are random, so the loss means
nothing. The lengths come from a distribution: by default the log-normal with
median 1,050 and sigma 0.5 clipped to [16, 8192] that stands in for the
reference run in docs/metrics.md, or a bundled real one (``--lengths sft_mix``).

The training set is sized so that the timed steps are about one epoch of the
``sorted`` order: sorted batches go from short to long over an epoch, so only a
whole epoch gives its representative throughput. Every order trains
``--warmup-steps`` untimed steps first (CUDA kernels, allocator), then
``--steps`` timed ones.

Writes ``OUT.json`` and ``OUT.md`` (default ``benchmarks/results/gpu_throughput``),
rewritten after every order (a crash loses only the order it happened in; an order
that raises is recorded as failed and the next one runs), and each order's
``train_log.jsonl`` under ``OUT_runs/``. With ``--time-budget SECONDS`` an order that
would end past the budget (judged by the longest order so far) is skipped and
recorded as such.

Usage::

    python benchmarks/gpu_throughput.py                       # one H200: a few minutes
    python benchmarks/gpu_throughput.py --device cpu --smoke  # tiny settings, checks the code
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from order_results import OrderResults  # noqa: E402

ORDERS_DEFAULT = "sorted,random,bucket-random,interleave,stratified,packed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model and data: checks that the script runs (CPU is fine)")
    p.add_argument("--model-size", default="large")
    p.add_argument("--vocab-size", type=int, default=32768)
    p.add_argument("--max-len", type=int, default=8192, help="longest sequence")
    p.add_argument("--max-tokens", type=int, default=16384, help="token budget per micro-batch")
    p.add_argument("--grad-accum", type=int, default=8)
    p.add_argument("--steps", type=int, default=12, help="timed optimizer steps per order")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    p.add_argument("--orders", default=ORDERS_DEFAULT)
    p.add_argument("--lengths", default="lognormal",
                   help="'lognormal' (median 1050, sigma 0.5) or a bundled length set")
    p.add_argument("--attn", default=None,
                   help="attention implementation (default: flash_attention_2 if installed, "
                        "else sdpa)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/gpu_throughput")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="skip (and record as skipped) the orders that would end past this "
                        "many seconds from the start, judged by the longest order so far")
    args = p.parse_args(argv)
    if args.smoke:
        args.model_size, args.vocab_size, args.max_len, args.max_tokens = "tiny", 512, 128, 256
        args.steps, args.warmup_steps, args.grad_accum = 3, 1, 2
        if args.out == p.get_default("out"):
            args.out = str(Path("benchmarks/results/gpu_throughput_smoke"))
    return args


def draw_lengths(name: str, max_len: int, seed: int, size: int = 200_000) -> np.ndarray:
    """Sample lengths (before sizing the training set)."""
    rng = np.random.default_rng(seed)
    if name == "lognormal":
        scale = 1050 * max_len / 8192
        lens = np.exp(rng.normal(np.log(scale), 0.5, size))
        return np.clip(np.round(lens), 16 * max_len // 8192 or 2, max_len).astype(np.int64)
    from lengthwise import load_lengths

    base = np.minimum(load_lengths(name), max_len)
    base = base[base >= 2]
    return rng.permutation(base)


def size_training_set(lengths: np.ndarray, tokens: int) -> np.ndarray:
    """The shortest prefix of ``lengths`` holding at least ``tokens`` tokens."""
    cum = np.cumsum(lengths)
    n = int(np.searchsorted(cum, tokens)) + 1
    if n > lengths.size:
        raise ValueError(f"the length set holds {int(cum[-1])} tokens, fewer than the "
                         f"{tokens} the timed steps need; lower --steps or --max-tokens")
    return lengths[:n]


def pick_attn(requested: str | None, device: str) -> str:
    if requested:
        return requested
    if device.startswith("cuda"):
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def main(argv: list[str] | None = None, *, clock: Callable[[], float] = time.perf_counter,
         ) -> dict:
    """Run every order; ``OUT.json``/``OUT.md`` are rewritten after each one."""
    started = clock()
    args = parse_args(argv)
    import torch

    from lengthwise.demo.config import DemoConfig, parse_orders
    from lengthwise.demo.data import DemoData
    from lengthwise.demo.model import build_model, count_parameters
    from lengthwise.demo.runner import train_orders

    orders = parse_orders(args.orders)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu --smoke to check the script")
    attn = pick_attn(args.attn, args.device)
    # one sorted epoch ~ the timed steps (sorted batches fill ~97 % of the budget)
    tokens = int(0.97 * args.steps * args.grad_accum * args.max_tokens)
    lengths = size_training_set(draw_lengths(args.lengths, args.max_len, args.seed), tokens)
    rng = np.random.default_rng(args.seed + 1)
    train = [rng.integers(1, args.vocab_size, n, dtype=np.int32) for n in lengths]
    held = [rng.integers(1, args.vocab_size, n, dtype=np.int32)
            for n in lengths[: max(2, args.grad_accum)]]
    data = DemoData(train=train, eval=held, vocab_size=args.vocab_size, max_len=args.max_len)
    cfg = DemoConfig(
        steps=args.warmup_steps + args.steps, grad_accum=args.grad_accum,
        max_tokens=args.max_tokens, max_len=args.max_len, model_size=args.model_size,
        warmup=args.warmup_steps, device=args.device,
        dtype=args.dtype if args.device.startswith("cuda") else None, seed=args.seed,
        eval_samples=len(held), timing_warmup=args.warmup_steps, deterministic=False,
        threads=None, attn_implementation=attn)
    params = count_parameters(build_model(args.model_size, vocab_size=args.vocab_size,
                                          max_len=args.max_len, device="meta"))
    device_name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
                   else platform.processor() or "cpu")
    print(f"{device_name}: {args.model_size} model, {params / 1e6:.1f} M parameters, {attn}, "
          f"{args.dtype if args.device.startswith('cuda') else 'fp32'}; {lengths.size} samples "
          f"({int(lengths.sum())} tokens, median {int(np.median(lengths))}, max "
          f"{int(lengths.max())}); {args.steps} timed steps x {args.grad_accum} micro-batches "
          f"of <= {args.max_tokens} tokens", file=sys.stderr)
    header = {
        "device": device_name, "model_size": args.model_size, "parameters": params,
        "attention": attn, "dtype": args.dtype if args.device.startswith("cuda") else "fp32",
        "lengths": args.lengths, "samples": int(lengths.size), "tokens": int(lengths.sum()),
        "max_len": args.max_len, "max_tokens": args.max_tokens, "grad_accum": args.grad_accum,
        "timed_steps": args.steps, "warmup_steps": args.warmup_steps,
        "torch": torch.__version__,
    }
    head = (f"{device_name}, {args.model_size} model ({params / 1e6:.1f} M parameters), "
            f"{attn}, {header['dtype']}, {args.lengths} lengths to {args.max_len}, "
            f"{args.grad_accum} x {args.max_tokens}-token micro-batches per step, "
            f"{args.steps} timed steps per order.\n\n")

    def render(summary: dict) -> str:
        lines = ["| order | tokens_per_second | throughput_vs_sorted | padding_efficiency | "
                 "seconds per step | epochs |", "|---|---:|---:|---:|---:|---:|"]
        for name, r in summary["strategies"].items():
            ratio = r.get("throughput_vs_sorted")
            lines.append(f"| {name} | {r['tokens_per_second']:.0f} | "
                         f"{'-' if ratio is None else format(ratio, '.2f')} | "
                         f"{r['padding_efficiency']:.3f} | {r['seconds_per_step']:.2f} | "
                         f"{r['epochs']:.2f} |")
        return head + "\n".join(lines) + "\n"

    def measure(order: str) -> dict:
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        r = train_orders([order], data, cfg, out=f"{out}_runs", lockstep=False,
                         equal_data=False)[order]
        row = {"tokens_per_second": r.tokens_per_second,
               "padding_efficiency": r.padding_efficiency,
               "seconds_per_step": r.train_seconds / max(r.steps, 1), "epochs": r.epochs}
        if args.device.startswith("cuda"):
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.empty_cache()
        return row

    out = Path(args.out)
    results = OrderResults(out, header, render, budget=args.time_budget, clock=clock,
                           started=started)
    for order in orders:
        results.run(order, measure)
    summary = results.write()
    if args.device.startswith("cuda"):
        summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    rows = summary["strategies"]
    print(f"{'order':<14} {'tokens/s':>10} {'vs sorted':>9} {'pad eff':>7}")
    for name, r in rows.items():
        ratio = r.get("throughput_vs_sorted")
        print(f"{name:<14} {r['tokens_per_second']:>10.0f} "
              f"{'-' if ratio is None else format(ratio, '.2f'):>9} "
              f"{r['padding_efficiency']:>7.3f}")
    for name, why in {**summary["skipped"], **summary["failed"]}.items():
        print(f"{name:<14} {why}")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
