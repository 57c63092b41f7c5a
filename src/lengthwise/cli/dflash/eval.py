"""``lengthwise dflash eval``: acceptance length and draft accuracy per prompt set.

Example::

    $ lengthwise dflash eval --target models/Qwen3-8B --draft exported/ \\
          --prompts mt_bench.jsonl gsm8k.jsonl --max-new-tokens 256 --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from lengthwise.cli.dflash._settings import DEFAULTS
from lengthwise.dflash.cost.resident import follow_live_tensors
from lengthwise.dflash.load import check_target, open_draft
from lengthwise.dflash.mask_token import check_mask_token
from lengthwise.dflash.table import render_eval
from lengthwise.dflash.target_match import check_draft_target_weights, check_draft_tokenizer
from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_name


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``eval`` stage."""
    p = stages.add_parser(
        "eval",
        help="acceptance length and draft accuracy per prompt set (greedy and sampled)",
        description="Decode prompt sets with the draft proposing and the target verifying "
                    "(batched, with the target's KV cache) and report, per set and "
                    "temperature, the acceptance length (tokens per verifying target "
                    "forward); at temperature 0 also the draft's teacher-forced accuracy on "
                    "the target's outputs (--no-accuracy skips it) and the lossless check "
                    "(every output equal to the target's own greedy generate; --no-check "
                    "skips it). Sampling above 0 keeps the target's distribution "
                    "(speculative sampling). Each row gives the acceptance length as the "
                    "mean over prompts with a 95 % Student-t interval, the conditional "
                    "acceptance of every block position, the expected acceptance from "
                    "1 - TV(p_draft, p_target) of the teacher-forced pass, and the "
                    "prompt-lookup baseline's acceptance length on the same prompts; the "
                    "report names the chat template, the thinking switch, the block size, "
                    "the engine and the dtype.",
    )
    p.add_argument("--target", required=True, metavar="PATH",
                   help="the target: a local Hugging Face causal LM folder with its tokenizer")
    p.add_argument("--draft", required=True, metavar="PATH",
                   help="an exported draft folder, a training run (its final draft, else its "
                        "newest checkpoint), its final/ folder or a checkpoint")
    p.add_argument("--prompts", nargs="+", default=None, metavar="FILE.jsonl",
                   help='prompt sets, one JSON object a line: {"prompt": ...} or '
                        '{"messages": [...]} (default: the small set shipped with lengthwise)')
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0], metavar="T",
                   help="sampling temperatures (default: 0 1)")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                   help="tokens generated per prompt at most; decoding also stops at the "
                        "target's end-of-sequence ids (default: 256)")
    p.add_argument("--batch-size", type=int, default=16, metavar="N",
                   help="prompts decoded together (default: 16)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="at most N prompts of each set")
    p.add_argument("--thinking", choices=["on", "off"], default="off",
                   help="the chat template's thinking switch, where it has one (default: off)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the lossless check (each prompt decoded again by the target's "
                        "own greedy generate)")
    p.add_argument("--no-accuracy", action="store_true",
                   help="skip the draft's teacher-forced accuracy on the target's outputs "
                        "and the expected acceptance it gives at each temperature (with "
                        "--no-check and --no-baseline, eval costs the speculative decoding "
                        "only)")
    p.add_argument("--max-tokens", type=int, default=DEFAULTS["max_tokens"], metavar="N",
                   help="token budget of a batch of the accuracy pass, as in training: "
                        "padded tokens of prompt + output, a longer text cut to it "
                        f"(default: {DEFAULTS['max_tokens']})")
    p.add_argument("--max-slots", type=int, default=DEFAULTS["max_slots"], metavar="N",
                   help="draft slots (anchors x block size) per draft forward of the accuracy "
                        f"pass, as in training (default: {DEFAULTS['max_slots']})")
    p.add_argument("--lookup-tokens", type=int, default=None, metavar="N",
                   help="candidate tokens per forward of the prompt-lookup baseline "
                        "(default: block size - 1, as many as the draft proposes)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the prompt-lookup baseline (transformers generate with "
                        "prompt_lookup_num_tokens on the same prompts)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="the target's and draft's dtype (default: float32 on CPU, the "
                        "target checkpoint's on CUDA)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled runs")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate the draft on every prompt set and print the figures."""
    import torch
    import transformers

    from lengthwise.dflash.chat import (
        bundled_prompts,
        prompt_set_names,
        read_prompt_file,
        render_prompts,
        template_report,
    )
    from lengthwise.dflash.evaluate import evaluate_set
    from lengthwise.dflash.regenerate import stop_ids
    from lengthwise.dflash.target import (
        Target,
        check_causal_lm,
        load_target,
        load_tokenizer,
        max_positions,
        past_positions,
    )

    for name in ("max_new_tokens", "batch_size", "limit", "max_tokens", "max_slots",
                 "lookup_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"{flag_name(name)} must be >= 1, got {value}")
    if any(not (t >= 0 and math.isfinite(t)) for t in args.temperatures):
        raise ConfigError(f"--temperatures must be finite and >= 0, got {args.temperatures}")
    files = args.prompts or [str(bundled_prompts())]
    sets = {name: read_prompt_file(f)  # bad files fail before loading
            for name, f in zip(prompt_set_names(files), files, strict=True)}
    check_causal_lm(args.target)
    device = torch.device(args.device)
    follow_live_tensors(device.type)
    draft, named = open_draft(args.draft)
    tokenizer = load_tokenizer(args.target)
    check_draft_tokenizer(draft.config, tokenizer, draft=args.draft, target=args.target)
    model = load_target(args.target, dtype=args.dtype, device=device)
    check_target(draft.config, model.config)
    check_draft_target_weights(draft.config, model, draft=args.draft, target=args.target)
    check_mask_token(draft.config.mask_token_id, int(model.get_input_embeddings().weight.shape[0]))
    target = Target(model, layers=draft.config.target_layers)
    print(f"lengthwise dflash eval: draft {named}", file=sys.stderr)  # once its checks passed
    draft = draft.to(device=device, dtype=model.dtype)
    eos = stop_ids(tokenizer, model.config, model.generation_config) or None
    block = draft.config.block_size
    lookup = None if args.no_baseline else (args.lookup_tokens or block - 1)
    settings = {**template_report(tokenizer, thinking=args.thinking == "on"),
                "block_size": block, "engine": (  # this package's batched decoding, and where
                    f"lengthwise speculative_batch (transformers {transformers.__version__}, "
                    f"KV cache, {device})"),
                "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    rows: list[dict[str, Any]] = []
    for name, convs in sets.items():
        convs = convs[: args.limit] if args.limit else convs
        prompts = render_prompts(convs, tokenizer, thinking=args.thinking == "on")
        note = past_positions([len(p) + args.max_new_tokens for p in prompts],
                              max_positions(model.config),
                              what=f"prompts of {name} with their --max-new-tokens "
                                   f"{args.max_new_tokens}",
                              advice="the target decodes past the positions it was trained "
                                     "on; shorten them or lower --max-new-tokens")
        if note is not None:
            print(f"lengthwise dflash eval: warning: {note}", file=sys.stderr)
        rows += evaluate_set(draft, target, prompts, name=name, temperatures=args.temperatures,
                             max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                             eos=eos, seed=args.seed, check=not args.no_check,
                             accuracy=not args.no_accuracy, max_tokens=args.max_tokens,
                             max_slots=args.max_slots, progress=not args.no_progress,
                             lookup_tokens=lookup)
    if args.json:
        print(json.dumps(_json_ready([{**r, **settings} for r in rows]), indent=2,
                         allow_nan=False))
    else:
        print(render_eval(rows, settings))
    return 0


def _json_ready(value: Any) -> Any:
    """``value`` with every non-finite float (an undefined figure) as ``None``: strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value
