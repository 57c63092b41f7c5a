"""The ``lengthwise`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func`` (a
callable taking the parsed ``argparse.Namespace`` and returning an exit code).
Modules are discovered automatically, so adding a command means adding a file.

Example::

    $ lengthwise plan sft_mix --compare
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from lengthwise import __version__


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="lengthwise",
        description="Plan length-aware batches, feed training, and diagnose loss curves.",
    )
    parser.add_argument("--version", action="version", version=f"lengthwise {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lengthwise`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"lengthwise {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
