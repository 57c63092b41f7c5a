"""``lengthwise dflash features``: the target's features of every prepared sample, computed once.

Example::

    $ lengthwise dflash features prepared/ --target ./SmolLM2 --out features/
    $ torchrun --nproc-per-node 8 -m lengthwise dflash features prepared/ --target ./Qwen3-8B \
          --out features/ --device cuda
    $ lengthwise dflash train --target ./SmolLM2 --data prepared/ --features features/
"""

from __future__ import annotations

import argparse

from lengthwise.cli._options import add_config_flags, config_from_args
from lengthwise.dflash.cost.resident import follow_live_tensors
from lengthwise.dflash.features import FeaturesConfig, write_features
from lengthwise.disk import format_bytes
from lengthwise.train.device import rank_world, setup_distributed


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``features`` stage."""
    p = stages.add_parser(
        "features",
        help="run the target once over prepared data and cache its features for `dflash train "
             "--features`",
        description="Run the frozen target once over every sample of a `dflash prepare` folder "
                    "and store the hidden states the draft reads (memory-mapped shards with "
                    "checksums). `dflash train --features` then trains with no target forward "
                    "in the step. The size is printed first; a disk without room is refused "
                    "before any work; an interrupted pass resumes when run again.")
    p.add_argument("data", metavar="PREPARED", help="folder written by `dflash prepare`")
    p.add_argument("--target", metavar="PATH", required=True,
                   help="local Hugging Face causal LM folder (the one the data was prepared with)")
    p.add_argument("--out", metavar="CACHE", required=True, help="folder of the cache")
    add_config_flags(p, FeaturesConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the cache (each ``torchrun`` rank its share of the shards); print its summary."""
    cfg = config_from_args(FeaturesConfig, args)
    follow_live_tensors(cfg.device)  # freed activations go back: resident memory follows them
    group = setup_distributed(cfg.device)
    rec = write_features(args.data, args.target, args.out, cfg, info=group)
    if rank_world(group)[0] != 0:
        return 0
    s = rec["settings"]
    print(f"{args.out}: features of {rec['data']['samples']} samples ({rec['data']['tokens']:,} "
          f"tokens) at target layers {s['layers']}"
          + (" with the last hidden state" if s["last_hidden"] else "")
          + f", {s['dtype']}, {format_bytes(rec['bytes'])} in {len(rec['shards'])} shard(s)")
    return 0
