"""``lengthwise dflash``: the DFlash draft recipe, one sub-command per stage.

Each stage (``target``, ``prepare``, ``features``, ``estimate``, ``train``, ``export``,
``eval``) lives in its own module of this package and exposes ``register(subparsers)``,
as the top-level commands do; modules are discovered automatically and listed in
pipeline order.

Example::

    $ lengthwise dflash --help
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

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
    for name in stage_names():
        importlib.import_module(f"{__name__}.{name}").register(stages)
    p.set_defaults(func=lambda args: _no_stage(p))


#: the stages in the order a recipe runs them (``--help`` lists them so; others follow)
PIPELINE = ("target", "prepare", "features", "estimate", "train", "export", "eval")


def stage_names() -> list[str]:
    """The stage modules of this package, in pipeline order.

    Example::

        >>> stage_names()[:7]
        ['target', 'prepare', 'features', 'estimate', 'train', 'export', 'eval']
    """
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return sorted(names, key=lambda n: (PIPELINE.index(n) if n in PIPELINE else len(PIPELINE),
                                        n))


def _no_stage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
