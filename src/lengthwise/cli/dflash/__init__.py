"""``lengthwise dflash``: the DFlash draft recipe, one sub-command per stage.

Each stage (``prepare``, ``train``, ``export``, ``eval``) lives in its own module
of this package and exposes ``register(subparsers) -> None``, as the top-level
commands do; modules are discovered automatically.

Example::

    $ lengthwise dflash --help
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``dflash`` command and its stages."""
    p = subparsers.add_parser(
        "dflash",
        help="train a DFlash speculative-decoding draft: prepare, train, export, eval",
        description="The DFlash draft recipe: chat data and a local target model in, a draft "
                    "that serving engines load out.",
    )
    stages = p.add_subparsers(dest="stage", metavar="STAGE")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"{__name__}.{info.name}").register(stages)
    p.set_defaults(func=lambda args: _no_stage(p))


def _no_stage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
