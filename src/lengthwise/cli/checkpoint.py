"""``lengthwise checkpoint convert``: rewrite checkpoints of the old pickle format as JSON.

Example::

    $ lengthwise checkpoint convert runs/a --trust-legacy-checkpoint
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``checkpoint`` sub-command."""
    p = subparsers.add_parser(
        "checkpoint",
        help="convert checkpoints of older lengthwise versions to the current format",
        description=(
            "Checkpoints of lengthwise before format version 3 keep their training state as a "
            "Python pickle, which can run code when read; lengthwise no longer loads them. "
            "`convert` rewrites them (a step_N folder, a checkpoints folder or a run folder) "
            "with the state as JSON, reading the old state with an unpickler that builds only "
            "plain data, NumPy arrays and tensors. Convert only checkpoints you wrote."
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = actions.add_parser("convert", help="rewrite old-format checkpoints in place")
    c.add_argument("path", metavar="PATH", help="a step_N folder, a checkpoints or a run folder")
    c.add_argument("--trust-legacy-checkpoint", action="store_true",
                   help="required: you wrote these checkpoints and trust their files")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Convert the old-format checkpoints under ``args.path``; print what was converted."""
    from lengthwise.train.checkpoint.legacy import convert_legacy_checkpoint

    done = convert_legacy_checkpoint(args.path, trust=args.trust_legacy_checkpoint)
    for folder in done:
        print(f"converted {folder}")
    if not done:
        print(f"{args.path}: no checkpoint of the old format, nothing converted")
    return 0
