"""``lengthwise dflash train``: train a DFlash draft on prepared data, flags or a YAML file.

Settings come from the defaults below, then ``--config run.yaml`` (keys named as
the flags, with ``_`` or ``-``), then the flags given on the command line.

Example::

    $ lengthwise dflash train --target ./Qwen3-8B --data prepared/ --out run/
    $ torchrun --nproc-per-node 8 -m lengthwise dflash train --config run.yaml --device cuda
    $ lengthwise dflash train --config run.yaml --resume
    $ lengthwise dflash train --config run.yaml --device cuda --estimate --device-memory h200

``--estimate`` prints the predicted peak memory of the run (per GPU on CUDA, the process's
resident memory on CPU) instead of training
(:func:`lengthwise.cli.dflash.estimate.report`: the target's ``config.json`` only, no
weights, no data; nothing is written and ``--out`` is not touched). Under ``torchrun`` it
is printed once, by rank 0, and every rank exits with its verdict; no process group is
joined for it. ``--estimate --time`` adds the run's predicted time, from its plan on
``--data`` and a few training steps timed in a temporary folder
(:mod:`lengthwise.dflash.cost.timing`), or a ``--device-profile`` measured elsewhere.
"""

from __future__ import annotations

import argparse

from lengthwise.cli.dflash._settings import DEFAULTS, add_run_flags, read_yaml, settings
from lengthwise.cli.dflash.estimate import REPORT_FLAGS, add_report_flags, report
from lengthwise.dflash.cost.resident import follow_live_tensors
from lengthwise.errors import ConfigError
from lengthwise.finite_json import finite_json_text
from lengthwise.flag_field import flag_name

__all__ = ["DEFAULTS", "read_yaml", "register", "run", "settings"]


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``train`` stage."""
    p = stages.add_parser(
        "train",
        help="train a DFlash draft for a local target on data from `dflash prepare`",
        description="Train a DFlash draft on lengthwise's loop (planned micro-batches, AdamW, "
                    "warm-up then cosine, checkpoints with exact resume, DDP under torchrun), "
                    "with a periodic held-out evaluation in the step log. Settings: defaults, "
                    "then --config YAML, then flags.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", metavar="YAML", help="run settings (keys named as the flags)")
    add_run_flags(p)
    p.add_argument("--estimate", action="store_true",
                   help="print the run's predicted peak memory (per GPU on CUDA, the process's "
                        "resident memory on CPU), its parts and whether "
                        "it fits the device, from the target's config.json alone (no weights, "
                        "no data), and exit without training or writing to --out; with --time "
                        "also the run's time (reads --data and times a few steps). It takes "
                        "the options of `lengthwise dflash estimate` (--rows, --world, "
                        "--device-memory, --json, --time, --profile-steps, --device-profile, "
                        "--save-profile): see its --help")
    add_report_flags(p, listed=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train and print the run's summary (rank 0); with ``--estimate``, print its memory."""
    from lengthwise.dflash.recipe import train_draft

    given = vars(args)
    if given.pop("estimate", False):
        return report(given)
    stray = [k for k in REPORT_FLAGS if k in given]
    if stray:
        raise ConfigError(f"{', '.join(map(flag_name, stray))}: read with --estimate only")
    cfg, run_settings, progress = settings(given)
    follow_live_tensors(cfg.device)
    summary = train_draft(cfg, run_settings, progress=progress)
    if summary:
        print(finite_json_text(summary, indent=2))
    return 0
