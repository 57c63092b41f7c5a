"""Command-line flags generated from a settings dataclass: each option declared once.

A field with ``metadata={"help": ...}`` (:func:`~lengthwise.flag_field.flag_field`) becomes
``--field-name``; its type comes from ``metadata["type"]`` (a parser whose ``ValueError``
becomes a one-line usage error) or its default's type, ``metadata["choices"]`` and
``metadata["metavar"]`` (else ``N``, ``X`` or ``NAME``) pass on to argparse, and the help ends
with the field's default (``metadata["none"]`` says what ``None`` means). A ``bool`` field
becomes a ``--name``/``--no-name`` pair. :func:`config_from_args` builds the dataclass back
from the parsed flags, so a flag's default is the field's default.

Example::

    >>> import argparse
    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class Pass:
    ...     max_tokens: int = field(default=8192, metadata={"help": "tokens per batch"})
    ...     last_hidden: bool = field(default=True, metadata={"help": "keep the last state"})
    >>> p = argparse.ArgumentParser()
    >>> add_config_flags(p, Pass)
    >>> config_from_args(Pass, p.parse_args(["--max-tokens", "64", "--no-last-hidden"]))
    Pass(max_tokens=64, last_hidden=False)
    >>> p.format_help().count("(default: 8192)")
    1
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from lengthwise.flag_field import flag_name

__all__ = ["add_config_flags", "config_from_args", "field_type"]


def _parser(kind: Any) -> Any:
    """``kind`` with its ``ValueError`` (a ``ConfigError``, say) as argparse's usage error."""
    if kind in (int, float, str):
        return kind  # argparse's own message: "invalid int value: 'abc'"

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def field_type(f: dataclasses.Field, default: Any = None) -> Any:
    """What the flag of field ``f`` parses: ``metadata["type"]``, else the type of its
    ``default`` for a command, else of its own (``str`` when neither is given)."""
    if f.metadata.get("type") is not None:
        return f.metadata["type"]
    known = [v for v in (default, f.default) if v not in (None, dataclasses.MISSING)]
    return type(known[0]) if known else str


def add_config_flags(parser: Any, cls: type, *, skip: tuple[str, ...] = (),
                     only: tuple[str, ...] | None = None, exclusive: tuple[str, ...] = (),
                     defaults: dict[str, Any] | None = None, given_only: bool = False) -> None:
    """Add a flag to ``parser`` (or an argument group) for every field of ``cls`` that has
    help (see the module), but those named in ``skip``, or only those named in ``only``.

    The flags of the fields named in ``exclusive`` cannot be given together; ``defaults``
    replaces the defaults of some fields for this command (its help shows them).
    ``given_only``: a flag left out is left out of the parsed namespace too (settings
    merged from other sources, such as a YAML file, keep theirs); its help still shows
    the default.
    """
    group = parser.add_mutually_exclusive_group() if exclusive else None
    for f in dataclasses.fields(cls):
        text = f.metadata.get("help")
        if text is None or f.name in skip or (only is not None and f.name not in only):
            continue
        default = (defaults or {}).get(f.name, f.default)
        kind = field_type(f, default)
        shown = {True: "on", False: "off", None: f.metadata.get("none", "none")}.get(
            default, default) if isinstance(default, bool | None) else default
        if default is not dataclasses.MISSING:
            text = f"{text} (default: {shown})"
        parsed = argparse.SUPPRESS if given_only or default is dataclasses.MISSING else default
        if kind is bool:
            parser.add_argument(flag_name(f.name), dest=f.name, default=parsed,
                                action=argparse.BooleanOptionalAction, help=text)
            continue
        choices = f.metadata.get("choices")
        metavar = f.metadata.get("metavar") or (
            None if choices else {int: "N", float: "X"}.get(kind, "NAME"))
        where = group if f.name in exclusive else parser
        where.add_argument(flag_name(f.name), dest=f.name, default=parsed, type=_parser(kind),
                           choices=choices, metavar=metavar, help=text)


def config_from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """``cls`` built from the parsed flags of its fields (others keep their defaults)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
             if hasattr(args, f.name)}
    return cls(**{**given, **extra})
