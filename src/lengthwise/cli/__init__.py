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
import os
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
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
        return code
    except BrokenPipeError:  # the reader stopped early (``| head``): not an error
        _silence_stdout()
        return 0
    except (ValueError, OSError, KeyError) as exc:  # user input: files, values, options
        print(f"lengthwise {args.command}: error: {error_line(exc)}", file=sys.stderr)
        return 2


def error_line(exc: BaseException) -> str:
    """An exception as one line of text (an ``OSError`` with its file name).

    Example::

        >>> error_line(KeyError("no column 'loss'  in   log"))
        "no column 'loss' in log"
        >>> error_line(FileNotFoundError(2, "No such file or directory", "x.npy"))
        'x.npy: No such file or directory'
    """
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _silence_stdout() -> None:
    """Point stdout at the null device so the interpreter's final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
