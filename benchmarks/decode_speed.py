"""Wall-clock new tokens per second at batch 1: plain greedy, prompt lookup, the draft, both.

Usage::

    python benchmarks/decode_speed.py --target T --draft RUN_OR_EXPORT \\
        --prompts heldout_chats.jsonl [--limit 16] [--max-new-tokens 64]

Every prompt is rendered with the target's chat template and decoded greedily, one
prompt at a time, by four paths in the same run, in an order rotated from prompt to
prompt so that each sees the shared machine's load of the same minutes:

- ``greedy``: the target's own ``generate`` (KV cache), the reference;
- ``lookup``: ``generate`` with ``prompt_lookup_num_tokens`` (block size - 1 tokens);
- ``draft``: :func:`~lengthwise.dflash.speculative.speculative_batch` with the draft;
- ``combined``: the same with prompt lookup's proposal where it finds one.

Every path's output must equal greedy's (a run that differs stops). The speedup of a path
is the geometric mean over prompts of greedy's seconds over the path's, with a 95 %
t-interval of the log ratios. The cost ratios behind it, medians of ``--repeats`` timed
calls at the median prompt's length: one cached target step of 1 token, one verification
of a block, and one draft proposal (the draft's forward and its head), each against the
target step. Writes ``benchmarks/DECODE_SPEED.json`` and a generated
``benchmarks/DECODE_SPEED_RESULTS.md``; wall seconds depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "DECODE_SPEED.json"
PATHS = ("greedy", "lookup", "draft", "combined")


def load(target_dir: str, draft_dir: str, threads: int) -> tuple[Any, Any, Any]:
    """The target (as a :class:`Target` reading the draft's layers), the draft, the tokenizer."""
    import torch

    from lengthwise.dflash.load import open_draft
    from lengthwise.dflash.target import Target, load_target, load_tokenizer

    torch.set_num_threads(threads)
    draft, _ = open_draft(draft_dir)
    tokenizer = load_tokenizer(target_dir)
    model = load_target(target_dir, dtype="float32", device=torch.device("cpu"))
    target = Target(model, layers=draft.config.target_layers)
    return target, draft.to(dtype=model.dtype).eval(), tokenizer


def decoders(target: Any, draft: Any, max_new: int, eos: list[int]) -> dict[str, Any]:
    """Each path as ``prompt -> (new tokens, target forwards)``."""
    from lengthwise.dflash.lookup import prompt_lookup, target_generate
    from lengthwise.dflash.speculative import speculative_batch

    block = draft.config.block_size

    def greedy(p: list[int]) -> tuple[list[int], int]:
        tokens = target_generate(target, p, max_new, eos)
        return tokens, len(tokens)

    def lookup(p: list[int]) -> tuple[list[int], int]:
        run = prompt_lookup(target, p, max_new_tokens=max_new, num_tokens=block - 1, eos=eos)
        return run.tokens, run.forwards

    def spec(ngram: int | None) -> Any:
        def go(p: list[int]) -> tuple[list[int], int]:
            g = speculative_batch(draft, target, [p], max_new_tokens=max_new, eos=eos,
                                  lookup_ngram=ngram)[0]
            return g.tokens, g.target_forwards
        return go

    return {"greedy": greedy, "lookup": lookup, "draft": spec(None), "combined": spec(2)}


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def cost_ratios(target: Any, draft: Any, prompt: list[int], repeats: int) -> dict[str, float]:
    """Medians of a 1-token target step, a block's verification and a draft proposal."""
    import torch

    from lengthwise.dflash.blocks import block_attention_mask
    from lengthwise.dflash.loss import block_inputs

    b = draft.config.block_size
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = target.model(input_ids=ids, use_cache=True, output_hidden_states=True)
        cache = out.past_key_values
        feats = torch.cat([out.hidden_states[i + 1] for i in target.layers], dim=-1)
        n = len(prompt)

        def step(width: int) -> float:
            x = ids[:, -width:]
            t0 = time.perf_counter()
            target.model(input_ids=x, past_key_values=cache, use_cache=True,
                         position_ids=torch.arange(n, n + width)[None])
            dt = time.perf_counter() - t0
            cache.crop(-width)  # drop what this step appended
            return dt

        kv = draft.context_keys_values(feats, torch.arange(n)[None])
        lens = torch.tensor([[n]])
        embeds = block_inputs(draft, target, ids[:, -1:], torch.zeros_like(lens), b)
        mask = block_attention_mask(lens, torch.zeros_like(lens), n, b)

        def propose() -> float:
            t0 = time.perf_counter()
            hidden = draft(None, embeds, lens + torch.arange(b), mask, context_kv=kv)
            target.lm_head(hidden).argmax(-1)
            return time.perf_counter() - t0

        times: dict[str, list[float]] = {"step": [], "verify": [], "draft": []}
        for _ in range(repeats):  # interleaved, so the three see the same load
            times["step"].append(step(1))
            times["verify"].append(step(b))
            times["draft"].append(propose())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"target_step_ms": 1e3 * med["step"],
            "verify_over_step": med["verify"] / med["step"],
            "draft_over_step": med["draft"] / med["step"]}


def speedup(base: list[float], mine: list[float]) -> dict[str, float]:
    """Geometric mean of ``base / mine`` over prompts, with a 95 % t-interval."""
    from lengthwise.intervals import t_interval

    iv = t_interval([math.log(a / b) for a, b in zip(base, mine, strict=True)])
    return {"mean": math.exp(iv["mean"]), "low": math.exp(iv["mean"] - iv["half"]),
            "high": math.exp(iv["mean"] + iv["half"]), "n": iv["n"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Decode every prompt by every path; the figures as a dict."""
    from lengthwise.dflash.chat import read_prompt_file, render_prompts
    from lengthwise.dflash.regenerate import stop_ids

    target, draft, tokenizer = load(args.target, args.draft, args.threads)
    eos = stop_ids(tokenizer, target.model.config, target.model.generation_config)
    convs = read_prompt_file(args.prompts)[: args.limit]
    prompts = render_prompts(convs, tokenizer)
    go = decoders(target, draft, args.max_new_tokens, eos)
    go["greedy"](prompts[0])  # warm-up, not counted
    seconds = {k: [] for k in PATHS}
    tokens = {k: [] for k in PATHS}
    forwards = {k: [] for k in PATHS}
    for i, p in enumerate(prompts):
        order = PATHS[i % 4:] + PATHS[: i % 4]
        outs = {}
        for name in order:
            (toks, fwd), dt = timed(go[name], p)
            outs[name] = toks
            seconds[name].append(dt)
            tokens[name].append(len(toks))
            forwards[name].append(fwd)
        differs = [k for k in PATHS if outs[k] != outs["greedy"]]
        if differs:
            raise SystemExit(f"prompt {i}: {differs} differ from greedy decoding")
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{k} {tokens[k][-1] / seconds[k][-1]:.1f} tok/s" for k in PATHS), file=sys.stderr)
    lens = sorted(len(p) for p in prompts)
    rows = {}
    for k in PATHS:
        rows[k] = {"new_tokens": sum(tokens[k]), "seconds": sum(seconds[k]),
                   "tokens_per_second": sum(tokens[k]) / sum(seconds[k]),
                   "acceptance_length": sum(tokens[k]) / sum(forwards[k]),
                   "speedup": speedup(seconds["greedy"], seconds[k])}
    return {"settings": {"target": args.target, "draft": args.draft, "prompts": args.prompts,
                         "limit": len(prompts), "max_new_tokens": args.max_new_tokens,
                         "threads": args.threads, "block_size": draft.config.block_size,
                         "draft_layers": draft.config.num_layers},
            "machine": f"{platform.machine()}, {platform.python_version()}",
            "paths": rows,
            "costs": cost_ratios(target, draft, prompts[len(prompts) // 2]
                                 if lens else prompts[0], args.repeats)}


def render(saved: dict[str, Any]) -> str:
    s, c = saved["settings"], saved["costs"]
    lines = ["# Decoding speed at batch 1: greedy, prompt lookup, the draft, both", "",
             f"Generated by `python benchmarks/decode_speed.py --target {s['target']} --draft "
             f"{s['draft']} --prompts {s['prompts']} --limit {s['limit']} --max-new-tokens "
             f"{s['max_new_tokens']} --threads {s['threads']}`; do not edit by hand.", "",
             f"{s['limit']} prompts, greedy, at most {s['max_new_tokens']} new tokens each, "
             f"one prompt at a time on {s['threads']} thread(s); a draft of "
             f"{s['draft_layers']} layer(s), block {s['block_size']}. Every path's output "
             "equals greedy decoding's. Speedup: the geometric mean over prompts of greedy's "
             "seconds over the path's, with a 95 % interval.", "",
             "| path | new tokens / s | acceptance length | speedup [95 %] |",
             "|---|---:|---:|---:|"]
    for k, r in saved["paths"].items():
        sp = r["speedup"]
        lines.append(f"| {k} | {r['tokens_per_second']:.1f} | {r['acceptance_length']:.2f} | "
                     f"{sp['mean']:.2f} [{sp['low']:.2f}, {sp['high']:.2f}] |")
    lines += ["", f"Costs at the median prompt: a cached target step of 1 token "
              f"{c['target_step_ms']:.1f} ms; a verification of a block "
              f"{c['verify_over_step']:.2f} steps; a draft proposal "
              f"{c['draft_over_step']:.2f} steps.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    saved = run(args)
    args.out.write_text(json.dumps(saved, indent=1) + "\n")
    args.out.with_name(args.out.stem + "_RESULTS.md").write_text(render(saved))
    print(render(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
