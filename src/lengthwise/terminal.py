"""Text for a terminal: the width the commands' text keeps to, and lines wrapped to it.

Example::

    >>> print(fit_lines(["note: " + "word " * 5, "short"], width=16))
    note: word word
      word word word
    short
"""

from __future__ import annotations

import textwrap

__all__ = ["TEXT_WIDTH", "fit_lines"]

#: the columns a command's text keeps to unless asked for ``--wide`` output
TEXT_WIDTH = 100


def fit_lines(lines: list[str], width: int = TEXT_WIDTH) -> str:
    """``lines`` joined, each line longer than ``width`` wrapped at word boundaries and its
    continuation indented two columns past the line's own indent (lines that fit, tables
    among them, are kept as they are)."""
    out: list[str] = []
    for line in lines:
        for part in line.split("\n"):
            if len(part) <= width:
                out.append(part)
                continue
            lead = len(part) - len(part.lstrip(" "))
            out.extend(textwrap.wrap(part, width, subsequent_indent=" " * (lead + 2),
                                     break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)
