"""``lengthwise dflash prepare``: chat data to token ids, an assistant-only loss mask and lengths.

Example::

    $ lengthwise dflash prepare chats.jsonl --target ./Qwen3-8B --out prepared/ --max-len 8192
    $ torchrun --nproc-per-node 8 -m lengthwise dflash prepare sharegpt.parquet \\
          --target ./Qwen3-8B --out prepared/ --regenerate --device cuda --no-enable-thinking
"""

from __future__ import annotations

import argparse


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``prepare`` stage."""
    p = stages.add_parser(
        "prepare",
        help="chat data -> the target's chat template -> token ids, loss mask, lengths",
        description="Render chat conversations (JSONL or Parquet with a messages/conversations "
                    "list in OpenAI role/content or ShareGPT from/value form, or a Hugging Face "
                    "datasets folder) with the target's chat template into token ids and an "
                    "assistant-only loss mask; optionally regenerate the assistant turns with "
                    "the target. Writes Parquet shards, lengths.npy and prepare.json; a rerun "
                    "with the same settings resumes.",
    )
    p.add_argument("source", metavar="DATA", help="chats: .jsonl, .parquet or a datasets folder")
    p.add_argument("--target", required=True, metavar="PATH",
                   help="local Hugging Face model folder (its tokenizer and chat template)")
    p.add_argument("--out", required=True, metavar="FOLDER", help="folder to write")
    p.add_argument("--field", default=None,
                   help="row field holding the messages (default: messages or conversations)")
    p.add_argument("--split", default="train", help="split of a datasets folder (default train)")
    p.add_argument("--min-supervised", type=int, default=32, metavar="N",
                   help="drop samples with fewer assistant tokens (default 32)")
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="longest sample in tokens (default: no limit)")
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="what to do with samples over --max-len (default truncate)")
    p.add_argument("--enable-thinking", dest="enable_thinking", action="store_true",
                   default=None, help="pass enable_thinking=True to the chat template")
    p.add_argument("--no-enable-thinking", dest="enable_thinking", action="store_false",
                   help="pass enable_thinking=False to the chat template")
    p.add_argument("--shard-rows", type=int, default=4096, metavar="N",
                   help="input rows per output shard (the unit of resuming; default 4096)")
    p.add_argument("--regenerate", action="store_true",
                   help="replace every assistant turn by the target's own response")
    p.add_argument("--max-new-tokens", type=int, default=512, metavar="N",
                   help="longest regenerated turn (default 512)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="regeneration temperature (0: greedy, the default)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N",
                   help="most conversations regenerated together (default %(default)s; raise "
                        "it on a GPU)")
    p.add_argument("--max-tokens", type=int, default=16384, metavar="N",
                   help="most rows times their widest prompt plus --max-new-tokens in "
                        "regeneration; a longer conversation goes alone (default %(default)s)")
    p.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto",
                   help="regeneration engine: Hugging Face generate, vLLM, or auto (vLLM when "
                        "installed, on CUDA, in one process; else hf)")
    p.add_argument("--seed", type=int, default=0, help="seed of sampled regeneration")
    p.add_argument("--device", default="cpu", help="device of the regenerating target")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="dtype of the regenerating target (default: float32 on CPU, the "
                        "checkpoint's on CUDA)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Prepare the data and print what was kept and dropped."""
    from lengthwise.dflash.prepare import PrepareConfig, prepare_chats
    from lengthwise.errors import ConfigError
    from lengthwise.train.device import rank_world, setup_distributed

    try:
        cfg = PrepareConfig(
            min_supervised=args.min_supervised, max_len=args.max_len, overlong=args.overlong,
            enable_thinking=args.enable_thinking, field=args.field, split=args.split,
            shard_rows=args.shard_rows, regenerate=args.regenerate,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            batch_size=args.batch_size, max_tokens=args.max_tokens,
            backend=args.backend, seed=args.seed,
            device=args.device, dtype=args.dtype, progress=args.progress)
    except ConfigError as exc:  # the setting's name as the option that gives it
        raise ConfigError(_as_option(str(exc), vars(args))) from None
    if cfg.regenerate:
        from lengthwise.dflash.cost.resident import follow_live_tensors

        follow_live_tensors(cfg.device)
    group = setup_distributed(cfg.device)  # under torchrun: the shards split over the ranks
    rec = prepare_chats(args.source, args.target, args.out, cfg, info=group)
    if rank_world(group)[0] != 0:
        return 0
    c = rec["counts"]
    lines = [f"{args.out}: {c['kept']} of {c['rows']} conversations kept, {c['tokens']} tokens "
             f"({c['supervised_tokens']} supervised) in {len(rec['shards'])} shard(s)"
             + (f", {rec['shards_reused']} reused" if rec["shards_reused"] else ""),
             f"dropped: {c['dropped_few_supervised']} with fewer than {cfg.min_supervised} "
             f"assistant tokens, {c['dropped_too_long']} longer than --max-len; "
             f"truncated: {c['truncated']}",
             f"loss mask from the chat template's {rec['loss_mask_from']}"
             + ("" if rec["enable_thinking"] is None
                else f"; enable_thinking={rec['enable_thinking']}")]
    if cfg.regenerate:
        lines.append(f"regenerated {c['regenerated_turns']} assistant turns "
                     f"(this run: {rec['regenerated_with'] or 'none, all shards reused'}; "
                     f"{c['unfinished_turns']} cut at --max-new-tokens {cfg.max_new_tokens})")
    print("\n".join(lines))
    return 0


def _as_option(message: str, names: dict[str, object]) -> str:
    """``message`` with the setting it starts with (one of ``names``) written as its option.

    Example::

        >>> _as_option("max_len must be an integer >= 2, got 0", {"max_len": 0})
        '--max-len must be an integer >= 2, got 0'
    """
    name = message.split(" ", 1)[0]
    if name not in names:
        return message
    return "--" + name.replace("_", "-") + message[len(name):]
