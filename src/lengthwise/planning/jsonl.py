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
from collections.abc import Iterator
from typing import Any


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
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise error(f"{path}, line {lineno}: not a JSON object")
    return record


def jsonl_field(path: str | os.PathLike[str], field: str, *,
                error: type[ValueError] = ValueError) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, record[field])`` for every non-blank line.

    A line that is not JSON, not an object, or lacks ``field`` raises ``error``
    naming the file and the line.
    """
    for lineno, record in jsonl_records(path, error=error):
        if field not in record:
            raise error(f"{path}, line {lineno}: no field {field!r}")
        yield lineno, record[field]
