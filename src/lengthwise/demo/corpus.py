"""Real text for the demo: docstrings of the Python standard library, or your own data.

Every machine with Python has the standard library's source. One function,
class or module docstring is one sample; that gives tens of thousands of
samples of English technical prose and code with a wide, long-tailed length
distribution (one-line summaries to module guides of several thousand words).
Files are read in sorted path order and duplicates are dropped (first wins), so
the corpus is the same on every run of the same Python version.

``--data`` swaps in your own text: a JSON-lines file with a ``text`` field, or a
Hugging Face dataset saved with ``save_to_disk``.

Example::

    >>> texts = stdlib_docstrings(limit_files=20)
    >>> len(texts) > 10 and all(isinstance(t, str) and t for t in texts)
    True
    >>> texts == stdlib_docstrings(limit_files=20)
    True
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

from lengthwise.atomic import atomic_open
from lengthwise.errors import DataError, MissingDependencyError
from lengthwise.planning.jsonl import jsonl_field

__all__ = ["corpus_fingerprint", "load_corpus", "load_texts", "stdlib_docstrings"]

#: folders below the standard library that hold third-party packages, not the library
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_root() -> Path:
    """Folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _source_files(root: Path) -> list[Path]:
    files = [path for path in root.rglob("*.py")
             if not _SKIP_DIRS.intersection(path.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _docstrings(source: bytes) -> Iterator[str]:
    """Docstrings of a module and of every class and function in it, in source order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in old test files
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, _DOC_NODES):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                yield doc.strip()


def stdlib_docstrings(root: str | Path | None = None, *, limit_files: int | None = None,
                      ) -> list[str]:
    """Unique docstrings of the standard library (or of the ``.py`` files below ``root``).

    Files that do not parse (deliberately broken test inputs) are skipped.
    ``limit_files`` reads only the first files in path order (for quick tests).

    Example::

        >>> docs = stdlib_docstrings(limit_files=5)
        >>> len(docs) == len(set(docs))
        True
    """
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise FileNotFoundError(f"no source folder at {base}")
    files = _source_files(base)
    if limit_files is not None:
        files = files[:limit_files]
    docs: list[str] = []
    for path in files:
        try:
            docs += list(_docstrings(path.read_bytes()))
        except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
            continue
    out = list(dict.fromkeys(docs))
    if not out:
        raise DataError(f"found no docstrings in the .py files below {base}")
    return out


def _jsonl_texts(path: Path, field: str) -> list[str]:
    out = []
    for number, value in jsonl_field(path, field):
        if not isinstance(value, str):
            raise DataError(f"{path}, line {number}: field {field!r} must be a string, "
                            f"got {type(value).__name__}")
        out.append(value)
    return out


def _dataset_texts(path: Path, field: str) -> list[str]:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError("reading a saved dataset needs the datasets package: "
                                     "pip install datasets") from exc
    try:
        data = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:  # a folder that save_to_disk did not write
        raise DataError(f"{path}: not a Hugging Face dataset saved with save_to_disk "
                        f"({' '.join(str(exc).split())})") from None
    if isinstance(data, datasets.DatasetDict):
        split = "train" if "train" in data else next(iter(data))
        data = data[split]
    if field not in data.column_names:
        raise DataError(f"{path}: the dataset has no {field!r} column "
                        f"(columns: {data.column_names})")
    return [str(t) for t in data[field]]


def load_texts(source: str | Path, *, field: str = "text") -> list[str]:
    """Texts from a JSON-lines file (one object per line) or a dataset saved on disk.

    Empty texts are dropped and duplicates removed (first wins), as for the
    standard-library corpus.

    Example::

        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.jsonl"
        >>> _ = p.write_text('{"text": "a b"}\\n{"text": "a b"}\\n{"text": "c"}\\n')
        >>> load_texts(p)
        ['a b', 'c']
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"--data {path}: no such file or folder")
    texts = _dataset_texts(path, field) if path.is_dir() else _jsonl_texts(path, field)
    out = list(dict.fromkeys(t for t in texts if t.strip()))
    if not out:
        raise DataError(f"--data {path}: no non-empty {field!r} texts")
    return out


def corpus_fingerprint(texts: list[str]) -> str:
    """A short hex digest of the texts, to key caches on.

    Example::

        >>> corpus_fingerprint(["a", "b"]) == corpus_fingerprint(["a", "b"])
        True
        >>> corpus_fingerprint(["a", "b"]) == corpus_fingerprint(["ab"])
        False
    """
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:16]


def load_corpus(data: str | Path | None = None, *, cache_dir: str | Path | None = None,
                ) -> list[str]:
    """The demo's texts: ``data`` when given, else the standard library's docstrings.

    With ``cache_dir`` the standard-library corpus is cached there as JSON (it
    takes some seconds to parse every file), keyed by the library's location
    and the Python version.

    Example::

        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "mine.jsonl"
        >>> _ = p.write_text('{"text": "one"}\\n{"text": "two"}\\n')
        >>> load_corpus(p)
        ['one', 'two']
    """
    if data is not None:
        return load_texts(data)
    if cache_dir is None:
        return stdlib_docstrings()
    root = stdlib_root()
    key = hashlib.sha256(f"{root}|{sys.version}".encode()).hexdigest()[:12]
    path = Path(cache_dir) / f"stdlib-docstrings-{key}.json"
    if path.is_file():
        try:
            texts = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
                return texts
        except (OSError, ValueError):
            pass  # rebuilt below
    texts = stdlib_docstrings(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8") as fh:
        json.dump(texts, fh)
    return texts
