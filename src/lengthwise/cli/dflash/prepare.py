"""``lengthwise dflash prepare``: chat data to token ids, an assistant-only loss mask and lengths.

Example::

    $ lengthwise dflash prepare chats.jsonl --target ./Qwen3-8B --out prepared/ --max-len 8192
    $ torchrun --nproc-per-node 8 -m lengthwise dflash prepare sharegpt.parquet \\
          --target ./Qwen3-8B --out prepared/ --regenerate --device cuda --no-enable-thinking
"""

from __future__ import annotations

import argparse

from lengthwise.cli._options import add_config_flags, config_from_args
from lengthwise.dflash.cost.resident import follow_live_tensors
from lengthwise.dflash.prepare_config import PrepareConfig
from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_name


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
    add_config_flags(p, PrepareConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Prepare the data and print what was kept and dropped."""
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.train.device import rank_world, setup_distributed

    try:
        cfg = config_from_args(PrepareConfig, args)
    except ConfigError as exc:  # the setting's name as the option that gives it
        raise ConfigError(_as_option(str(exc), vars(args))) from None
    if cfg.regenerate:
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
    return flag_name(name) + message[len(name):]
