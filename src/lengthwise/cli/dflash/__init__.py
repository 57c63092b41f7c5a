"""``lengthwise dflash``: the DFlash draft recipe, one sub-command per stage.

Each stage (``target``, ``prepare``, ``features``, ``estimate``, ``train``, ``export``,
``eval``) lives in its own module of this package and exposes ``register(subparsers)``,
as the top-level commands do; :data:`PIPELINE` lists them in the order a recipe runs them.

Example::

    $ lengthwise dflash --help
"""

from __future__ import annotations

import argparse
import importlib

HELP = ("train a DFlash speculative-decoding draft: target, prepare, features, estimate, train, "
        "export, eval")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``dflash`` command and its stages."""
    p = subparsers.add_parser(
        "dflash", help=HELP,
        description="The DFlash draft recipe: chat data and a local target model in, a draft "
                    "that serving engines load out.",
    )
    stages = p.add_subparsers(dest="stage", metavar="STAGE")
    for name in PIPELINE:
        importlib.import_module(f"{__name__}.{name}").register(stages)
    p.set_defaults(func=lambda args: _no_stage(p))


#: the stage modules in the order a recipe runs them (``--help`` lists them so)
PIPELINE = ("target", "prepare", "features", "estimate", "train", "export", "eval")


def _no_stage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
