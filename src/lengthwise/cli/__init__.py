"""The ``lengthwise`` command line.

Each sub-command lives in its own module of this package and exposes ``HELP``
(its line in ``lengthwise --help``) and ``register(subparsers) -> None``, which adds
its parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and
returning an exit code). Modules are discovered automatically, so adding a command
means adding a file. A module imports what its command needs (NumPy, torch,
transformers, pyarrow) in ``register`` or when it runs, not when it is imported, so
that ``lengthwise --help`` lists the commands without loading them.

Example::

    $ lengthwise plan sft_mix --compare
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys
import traceback
from typing import NoReturn

from lengthwise import __version__
from lengthwise.errors import LengthwiseError


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr (status 2), pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} "
                     f"(see {self.prog} --help)\n")


def commands() -> list[str]:
    """The sub-commands, one module of this package each."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__)
                  if not info.name.startswith("_"))


def build_parser(only: str | None = None, *, listed: bool = False) -> argparse.ArgumentParser:
    """Return the top-level parser with every sub-command registered, or only the command
    ``only`` (so that ``lengthwise plan`` does not import what ``demo`` or ``dflash`` need
    to describe their options); ``listed``: every command by its ``HELP`` alone, without its
    options (``lengthwise --help``, which then imports none of them)."""
    parser = _Parser(
        prog="lengthwise",
        description="Plan length-aware batches, feed training, and diagnose loss curves.",
    )
    parser.add_argument("--version", action="version", version=f"lengthwise {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in commands() if only is None else [only]:
        module = importlib.import_module(f"{__name__}.{name}")
        if listed:
            subparsers.add_parser(name, help=module.HELP)
        else:
            module.register(subparsers)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names when its first word is one, else ``None``."""
    first = argv[0] if argv else ""
    return first if first in commands() else None


#: ``OSError`` types about the files a user names (missing, unreadable, a folder, taken)
USER_OS_ERRORS: tuple[type[OSError], ...] = (
    FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError,
)


def is_user_error(exc: BaseException) -> bool:
    """Whether the command line prints ``exc`` as one line (exit 2) rather than as a bug (exit 1).

    User errors are the :class:`~lengthwise.errors.LengthwiseError` family (a bad
    option, file content, log or checkpoint, a missing extra); the file-system
    errors of :data:`USER_OS_ERRORS` (a missing file, no permission, a folder
    where a file was expected or the other way round, a file already there),
    whether the system raised them or a check of lengthwise did; and any other
    ``OSError`` that names its file (a full disk, a failing drive). An optional
    package that is not installed is one line too (:func:`missing_extra`). Anything
    else, a plain ``ValueError``, ``KeyError`` or ``TypeError`` or an ``OSError``
    naming no file included, is a bug of lengthwise.

    Example::

        >>> from lengthwise.errors import ConfigError
        >>> is_user_error(ConfigError("max_tokens must be positive")), is_user_error(KeyError("x"))
        (True, False)
        >>> is_user_error(OSError(28, "No space left on device", "plan.npz"))
        True
    """

    if isinstance(exc, (LengthwiseError, *USER_OS_ERRORS)):
        return True
    return isinstance(exc, OSError) and exc.filename is not None


#: optional packages a command imports when it runs, and the extra that installs each
EXTRAS: dict[str, str] = {
    "torch": "torch", "torchdata": "torch", "transformers": "hf", "tokenizers": "hf",
    "datasets": "hf", "accelerate": "hf", "matplotlib": "plots", "pyarrow": "io",
    "tqdm": "progress", "ray": "ray", "wandb": "wandb", "orjson": "fast",
}


def missing_extra(exc: BaseException, command: str | None = None) -> str | None:
    """The one-line message for an optional package that is not installed, else ``None``.

    Example::

        >>> missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"), "demo")
        'torch is not installed: pip install -e ".[demo]" (from a checkout of lengthwise)'
        >>> missing_extra(ModuleNotFoundError("x", name="lengthwise.nothing")) is None
        True
    """
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    if top not in EXTRAS:
        return None  # a module of lengthwise itself, or of a required package: a bug
    extra = command if command in ("demo", "dflash") else EXTRAS[top]
    return f'{top} is not installed: pip install -e ".[{extra}]" (from a checkout of lengthwise)'


def join_negative_lists(argv: list[str]) -> list[str]:
    """``--opt -5,100`` as ``--opt=-5,100``: argparse takes a value that starts with ``-`` and
    is not a plain number for an option, and says the option "expected one argument".

    Example::

        >>> join_negative_lists(["plan", "x.npy", "--buckets", "-5,100"])
        ['plan', 'x.npy', '--buckets=-5,100']
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if (token.startswith("--") and "=" not in token and "," in nxt
                and re.fullmatch(r"-\d[\d.]*(,\s*-?[\d.]*)+", nxt)):
            out.append(f"{token}={nxt}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lengthwise`` console script.

    Exit status: 0 done, 2 a user error (one line on stderr, see
    :func:`is_user_error`; usage errors too), 1 a bug of lengthwise (its
    traceback, then a line saying it is a bug and how to report it), 130
    interrupted (Ctrl-C: one line, no traceback).
    """
    argv = join_negative_lists(sys.argv[1:] if argv is None else list(argv))
    parser = build_parser(_command_of(argv), listed=not set(argv) & set(commands()))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
        device = sys.modules.get("lengthwise.train.device")  # loaded by any command that
        if code == 0 and device is not None:  # joined a torchrun group: leave it together
            device.leave_group(wait=True)
        return code
    except BrokenPipeError:  # the reader stopped early (``| head``): not an error
        _silence_stdout()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the user stopped it, one line and the shell's 130
        print(f"\nlengthwise {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        missing = missing_extra(exc, "dflash" if getattr(args, "task", None) == "dflash"
                                else args.command)
        if is_user_error(exc) or missing:
            print(f"lengthwise {args.command}: error: {missing or error_line(exc)}",
                  file=sys.stderr)
            return 2
        traceback.print_exc()
        print(f"lengthwise {args.command}: internal error: {type(exc).__name__} above is a bug "
              f"in lengthwise {__version__}, not in your input; please report it with the "
              "traceback and the command you ran", file=sys.stderr)
        return 1


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
