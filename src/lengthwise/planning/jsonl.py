"""Reading the records, or one field of every record, of a JSON-lines file (plain or ``.gz``).

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.jsonl"
    >>> _ = path.write_text('{"n": 3}\\n\\n{"n": 5}\\n')
    >>> list(jsonl_field(path, "n"))
    [(1, 3), (3, 5)]
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["check_text", "json_record", "jsonl_field", "jsonl_records"]


def jsonl_records(path: str | os.PathLike[str], *,
                  error: type[ValueError] = ValueError) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, record)`` for every non-blank line; each record must be an object.

    A line that is not JSON or not an object raises ``error`` naming the file and the line.
    """
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            yield lineno, json_record(line, path, lineno, error=error)


def json_record(line: str | bytes, path: str | os.PathLike[str], lineno: int, *,
                error: type[ValueError] = ValueError) -> dict[str, Any]:
    """One JSON-lines record, which must be an object; ``error`` names the file and the line.

    Example::

        >>> json_record('{"n": 1}', "a.jsonl", 3)
        {'n': 1}
        >>> json_record("[1]", "a.jsonl", 3)
        Traceback (most recent call last):
        ...
        ValueError: a.jsonl, line 3: not a JSON object
        >>> json_record('{"n": ' + "[" * 10**5 + "]" * 10**5 + "}", "a.jsonl", 4)
        Traceback (most recent call last):
        ...
        ValueError: a.jsonl, line 4: JSON nested too deeply to read (more than about ...
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:  # the decoder recurses once per level of nesting
        raise error(f"{path}, line {lineno}: JSON nested too deeply to read (more than about "
                    f"{sys.getrecursionlimit()} levels of lists or objects)") from None
    if not isinstance(record, dict):
        raise error(f"{path}, line {lineno}: not a JSON object")
    return record


#: a ``\uD800``-``\uDFFF`` escape: half of a surrogate pair, or a lone one (no character)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_text(line: str, record: Any, where: str, *,
               error: type[ValueError] = ValueError) -> None:
    r"""Raise ``error`` if ``record`` (parsed from ``line``) holds a string UTF-8 cannot encode.

    JSON may escape half of a surrogate pair alone (``"\ud800"``): it parses to a
    string no tokenizer or file format takes. Only lines with such an escape are
    checked, so the common case costs one scan of the line.

    Example::

        >>> check_text('{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}, "a.jsonl, line 1")
        >>> line = '{"a": "x\\ud800"}'
        >>> check_text(line, json.loads(line), "a.jsonl, line 2")
        Traceback (most recent call last):
        ...
        ValueError: a.jsonl, line 2: the escape \ud800 is half of a surrogate pair, not a ...
    """
    if _SURROGATE.search(line) is None:
        return
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(exc.object[exc.start])
        raise error(f"{where}: the escape \\u{code:04x} is half of a surrogate pair, not a "
                    "character (no text encoding holds it alone); fix or remove the line"
                    ) from None


def jsonl_field(path: str | os.PathLike[str], field: str, *,
                error: type[ValueError] = ValueError) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, record[field])`` for every non-blank line.

    A line that is not JSON, not an object, or lacks ``field`` raises ``error``
    naming the file, the line and the fields the line has.
    """
    for lineno, record in jsonl_records(path, error=error):
        if field not in record:
            there = ", ".join(repr(k) for k in list(record)[:12])
            more = f" and {len(record) - 12} more" if len(record) > 12 else ""
            raise error(f"{path}, line {lineno}: no field {field!r} (its fields: "
                        f"{there or 'none'}{more})")
        yield lineno, record[field]
