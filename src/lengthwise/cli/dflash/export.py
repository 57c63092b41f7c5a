"""``lengthwise dflash export``: a trained draft in the format serving engines load.

Example::

    $ lengthwise dflash export runs/draft exported/ --dtype bfloat16 --target models/Qwen3-8B
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lengthwise.dflash.export import export_checkpoint, speculators_converter, to_speculators
from lengthwise.errors import ConfigError


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``export`` stage."""
    p = stages.add_parser(
        "export",
        help="write a trained draft as config.json + model.safetensors (reference dflash layout)",
        description="Write the draft of a training run or checkpoint in the layout the reference "
                    "dflash package and SGLang's DFLASH algorithm load: config.json (a Qwen3 "
                    "config with the DFlashDraftModel architecture, block_size, "
                    "num_target_layers and dflash_config with mask_token_id and "
                    "target_layer_ids) and model.safetensors under the reference names. The "
                    "engine uses the target's embedding and LM head.",
    )
    p.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT",
                   help="a training run folder (its final draft, or its newest checkpoint "
                        "when the run has none), its final/ folder, its checkpoints/ folder "
                        "(newest checkpoint) or one step_N folder")
    p.add_argument("out", metavar="OUT", help="folder to write (created)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="weights' dtype (default: as trained)")
    p.add_argument("--target", default=None, metavar="PATH",
                   help="the target's local Hugging Face folder: checked against the draft "
                        "(width, layers, vocabulary)")
    p.add_argument("--speculators", default=None, metavar="DIR",
                   help="also convert the export to the speculators (vLLM) format in DIR with "
                        "the speculators package's converter (needs --target)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what OUT (and the --speculators DIR) already holds "
                        "(default: refuse a folder that is not empty)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export and print what was written."""
    target_config = tokenizer = None
    if args.speculators is not None and args.target is None:
        raise ConfigError("--speculators needs --target (the converter reads the target)")
    for flag, folder in (("OUT", args.out), ("--speculators", args.speculators)):
        if folder is not None and not args.overwrite and _holds_files(Path(folder)):
            raise ConfigError(f"{flag} {folder}: already exists and is not empty (an earlier "
                              "export?); pass --overwrite to replace it")
    if args.speculators is not None:
        speculators_converter()  # a missing package is named before anything is written
    if args.target is not None:
        from lengthwise.dflash.target import load_tokenizer

        target_config = _target_config(args.target)
        tokenizer = load_tokenizer(args.target)
    out = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype,
                            target_config=target_config, target_tokenizer=tokenizer,
                            target=args.target or "",
                            said=lambda named: print(f"lengthwise dflash export: draft {named}"))
    cfg = json.loads((out / "config.json").read_text())
    d = cfg["dflash_config"]
    print(f"lengthwise dflash export: {out}: {cfg['num_hidden_layers']} layers, hidden "
          f"{cfg['hidden_size']}, block {d['block_size']}, mask token {d['mask_token_id']}, "
          f"target layers {d['target_layer_ids']} of {cfg['num_target_layers']}, "
          f"rope_theta {cfg['rope_theta']:g}, {cfg['dtype']}")
    if args.speculators is not None:
        converted = to_speculators(out, args.speculators, args.target)
        print(f"lengthwise dflash export: speculators format: {converted}")
    return 0


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` exists and is not an empty directory."""
    return folder.exists() and (not folder.is_dir() or any(folder.iterdir()))


def _target_config(path: str) -> object:
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"--target {path}: not a local Hugging Face model (no config.json)")
    import transformers

    from lengthwise.dflash.target import check_causal_lm

    check_causal_lm(path)  # no code of the folder's own
    return transformers.AutoConfig.from_pretrained(path, local_files_only=True)
