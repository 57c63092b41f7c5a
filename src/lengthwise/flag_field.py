"""A settings field declared with its command-line help: the field is the option, declared once
(:func:`lengthwise.cli._options.add_config_flags` makes it a flag).

Example::

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Pass:
    ...     max_tokens: int = flag_field(2048, "padded tokens per batch")
    >>> Pass.__dataclass_fields__["max_tokens"].metadata
    mappingproxy({'help': 'padded tokens per batch'})
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def flag_field(default: Any, text: str, **meta: Any) -> Any:
    """A dataclass field with its default, its one-line help ``text`` and the rest of its
    flag's metadata (``type``, ``choices``, ``metavar``, ``none``: what a default of ``None``
    means)."""
    return field(default=default, metadata={"help": text, **meta})


def flag_name(name: str) -> str:
    """The command-line flag of the settings field ``name``.

    >>> flag_name("max_new_tokens")
    '--max-new-tokens'
    """
    return "--" + name.replace("_", "-")
