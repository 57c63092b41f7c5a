"""Per-sample token lengths of a Hugging Face ``datasets.Dataset``.

:func:`compute_lengths` reads an existing length column or token-ids column
directly from Arrow, or tokenizes a text column or a chat ``messages`` column
(through the tokenizer's chat template) with ``Dataset.map`` in parallel. Results
of tokenizing are cached as ``.npy`` files keyed by the data set's fingerprint,
the column, and a hash of the tokenizer (vocabulary, pipeline and chat template),
so a second call returns at once. The cache lives in ``$LENGTHWISE_CACHE``, else
``$XDG_CACHE_HOME/lengthwise``, else ``~/.cache/lengthwise``.

Example::

    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]]})
    >>> compute_lengths(ds).tolist()
    [3, 1]
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.atomic import atomic_open
from lengthwise.cache import cache_dir
from lengthwise.errors import ConfigError, DataError
from lengthwise.hf.ray_lengths import is_ray_dataset, ray_lengths
from lengthwise.planning.lengths import validate_lengths

__all__ = ["LENGTH_COLUMNS", "cache_dir", "compute_lengths"]

#: column names that already hold a length, tried in this order
LENGTH_COLUMNS = ("length", "lengths", "num_tokens", "n_tokens", "token_count",
                  "seq_len", "seq_length", "input_length")
_CACHE_VERSION = "1"
_OUT = "__lengthwise_length__"


def _column_kind(dataset: Any, column: str) -> str:
    """``length``, ``ids``, ``text`` or ``messages``, from the column's Arrow type."""
    import pyarrow as pa

    if column not in dataset.column_names:
        raise KeyError(f"the data set has no column {column!r}; its columns are "
                       f"{dataset.column_names}")
    kind = dataset.features.arrow_schema.field(column).type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "length"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)):
        item = kind.value_type
        if pa.types.is_integer(item):
            return "ids"
        if pa.types.is_struct(item):
            return "messages"
    raise TypeError(f"column {column!r} has type {kind}: expected lengths (integers), token ids "
                    "(lists of integers), text (strings) or chat messages (lists of "
                    "{'role', 'content'})")


def _choose(dataset: Any, tokenizer: Any, column: str | None,
            messages_column: str | None) -> tuple[str, str]:
    """The column to read and how to read it."""
    if column is not None and messages_column is not None:
        raise ConfigError("give column or messages_column, not both")
    if messages_column is not None:
        kind = _column_kind(dataset, messages_column)
        if kind != "messages":
            raise TypeError(f"messages_column {messages_column!r} holds {kind}, not chat "
                            "messages (lists of {'role', 'content'})")
        return messages_column, "messages"
    if column is not None:
        return column, _column_kind(dataset, column)
    names = dataset.column_names
    for name in (*LENGTH_COLUMNS, "input_ids"):
        if name in names:
            kind = _column_kind(dataset, name)
            if kind in ("length", "ids"):
                return name, kind
    if tokenizer is not None:
        for name, want in (("messages", "messages"), ("text", "text")):
            if name in names and _column_kind(dataset, name) == want:
                return name, want
    raise DataError(f"cannot tell which column gives the lengths among {names}: pass "
                    "column= (a length, token-ids or text column) or messages_column= "
                    "(chat messages), with a tokenizer for text and messages")


def _arrow_column(dataset: Any, column: str):
    """The column as a pyarrow ChunkedArray, honouring select/shuffle/filter."""
    return dataset.select_columns([column]).with_format("arrow")[:][column]


def _tokenizer_hash(tokenizer: Any) -> str:
    h = hashlib.sha256(type(tokenizer).__qualname__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "to_str"):
        backend = tokenizer
    if backend is not None:
        h.update(backend.to_str().encode())
    elif hasattr(tokenizer, "get_vocab"):
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    else:
        raise TypeError(f"cannot identify the tokenizer {type(tokenizer).__name__} for the cache; "
                        "pass cache=False")
    for attr in ("name_or_path", "chat_template", "special_tokens_map"):
        h.update(repr(getattr(tokenizer, attr, None)).encode())
    return h.hexdigest()


def _count_text(batch: Mapping[str, list], *, tokenizer: Any, column: str,
                add_special_tokens: bool) -> dict[str, list[int]]:
    texts = batch[column]
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"column {column!r} has a {type(t).__name__} where text was "
                            f"expected (row {i} of a batch)")
    if not callable(tokenizer):  # a bare tokenizers.Tokenizer
        encs = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        return {_OUT: [len(e.ids) for e in encs]}
    ids = tokenizer(texts, add_special_tokens=add_special_tokens, return_attention_mask=False,
                    return_token_type_ids=False)["input_ids"]
    return {_OUT: [len(x) for x in ids]}


def _count_messages(batch: Mapping[str, list], *, tokenizer: Any, column: str,
                    template_kwargs: dict[str, Any]) -> dict[str, list[int]]:
    conversations = batch[column]
    for i, conv in enumerate(conversations):
        if not conv:
            raise DataError(f"column {column!r} has an empty conversation (row {i} of a batch)")
    out = tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=True,
                                        **template_kwargs)
    return {_OUT: [len(x) for x in out["input_ids"]]}


def _check_dataset(dataset: Any):
    import datasets

    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise TypeError(f"got a DatasetDict with splits {list(dataset)}; pass one split, "
                        f"e.g. dataset[{next(iter(dataset), 'train')!r}]")
    if isinstance(dataset, datasets.IterableDataset):
        raise TypeError("got an IterableDataset (streaming): lengths must line up with "
                        "row indices, so load it as a map-style datasets.Dataset")
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"expected a datasets.Dataset, got {type(dataset).__name__}")


def _stored_lengths(dataset: Any, name: str, kind: str) -> np.ndarray:
    """Lengths read from a length column or counted from a token-ids column."""
    if kind == "length":
        values = _arrow_column(dataset, name).to_numpy()
        if values.size == 0:
            return np.zeros(0, dtype=np.int64)
        return validate_lengths(values, what=f"lengths in column {name!r}")
    import pyarrow.compute as pc

    counts = pc.list_value_length(_arrow_column(dataset, name)).to_numpy(zero_copy_only=False)
    if np.isnan(counts.astype(np.float64)).any():
        row = int(np.flatnonzero(np.isnan(counts.astype(np.float64)))[0])
        raise DataError(f"column {name!r}, row {row}: no token ids (null)")
    return counts.astype(np.int64)


def _check_tokenizer(tokenizer: Any, kind: str) -> None:
    """Raise unless ``tokenizer`` can count ``kind`` (text, or messages through a template)."""
    if kind == "messages":
        if not hasattr(tokenizer, "apply_chat_template"):
            raise TypeError(f"{type(tokenizer).__name__} has no apply_chat_template; use a "
                            "transformers tokenizer for chat messages")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("the tokenizer has no chat template: set tokenizer.chat_template")
    elif not (callable(tokenizer) or hasattr(tokenizer, "encode_batch")):
        raise TypeError(f"{type(tokenizer).__name__} is not a tokenizer")


def _cache_key(dataset: Any, name: str, kind: str, tokenizer: Any, add_special_tokens: bool,
               template_kwargs: dict[str, Any]) -> str:
    """Hex digest naming the cached lengths of one column under one tokenizer and settings."""
    return hashlib.sha256("\0".join([
        _CACHE_VERSION, dataset._fingerprint, str(len(dataset)), name, kind,
        _tokenizer_hash(tokenizer), str(add_special_tokens),
        json.dumps(template_kwargs, sort_keys=True, default=repr),
    ]).encode()).hexdigest()


def _tokenized_lengths(dataset: Any, name: str, kind: str, tokenizer: Any,
                       add_special_tokens: bool, template_kwargs: dict[str, Any],
                       batch_size: int, num_proc: int | None, fingerprint: str) -> np.ndarray:
    """Token counts of a text or messages column, tokenized through ``Dataset.map``."""
    if kind == "text":
        fn, fn_kwargs, what = _count_text, {"tokenizer": tokenizer, "column": name,
                                            "add_special_tokens": add_special_tokens}, "text"
    else:
        fn, fn_kwargs, what = _count_messages, {"tokenizer": tokenizer, "column": name,
                                                "template_kwargs": template_kwargs}, "chats"
    environ = os.environ
    try:
        mapped = dataset.select_columns([name]).map(
            fn, batched=True, batch_size=batch_size, num_proc=num_proc, fn_kwargs=fn_kwargs,
            remove_columns=[name], keep_in_memory=True, load_from_cache_file=False,
            new_fingerprint=fingerprint, desc=f"lengthwise: tokenizing {what} in {name!r}")
    finally:
        _keep_environ(environ)
    return _arrow_column(mapped, _OUT).to_numpy().astype(np.int64)


def _keep_environ(environ: Any) -> None:
    """Put ``environ`` back as ``os.environ``, holding what ``os.environ`` holds now.

    ``Dataset.map`` with ``num_proc`` restores the environment by assigning a copy of it to
    ``os.environ``: whoever keeps the real one (``monkeypatch.setenv``, a library that read
    ``os.environ`` at import) would write to a mapping nobody reads any more.
    """
    if os.environ is environ:
        return
    now = dict(os.environ)
    os.environ = environ  # noqa: B003  (the same object back, its contents set below)
    for key in set(environ) - set(now):
        del environ[key]
    environ.update(now)


def compute_lengths(
    dataset: Any,
    tokenizer: Any = None,
    *,
    column: str | None = None,
    messages_column: str | None = None,
    num_proc: int | None = None,
    cache: bool | str | os.PathLike[str] = True,
    add_special_tokens: bool = True,
    batch_size: int = 1000,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Token length of every row of a ``datasets.Dataset``, as ``int64``, aligned with its rows.

    Without ``column``/``messages_column`` the first existing column among
    :data:`LENGTH_COLUMNS`, then ``input_ids``, then (with a tokenizer) ``messages``
    or ``text`` is used. A numeric column is taken as lengths, a list-of-integers
    column is counted, a string column is tokenized (``add_special_tokens``), and
    chat messages go through ``tokenizer.apply_chat_template(..., tokenize=True)``
    with ``chat_template_kwargs``. Tokenizing runs through ``Dataset.map`` with
    ``num_proc`` processes and a progress bar; its result is cached (``cache=False``
    turns this off, a path puts the cache there). A ``ray.data.Dataset`` is tokenized
    on its Ray cluster instead (:func:`lengthwise.hf.ray_lengths.ray_lengths`).

    Example::

        >>> import datasets
        >>> compute_lengths(datasets.Dataset.from_dict({"num_tokens": [7, 2]})).tolist()
        [7, 2]
    """

    if is_ray_dataset(dataset):  # tokenized on the Ray cluster, not cached here
        return ray_lengths(dataset, tokenizer, column=column or "text", batch_size=batch_size,
                           add_special_tokens=add_special_tokens)
    _check_dataset(dataset)
    name, kind = _choose(dataset, tokenizer, column, messages_column)
    if kind in ("length", "ids"):
        return _stored_lengths(dataset, name, kind)
    if tokenizer is None:
        raise ConfigError(f"column {name!r} holds {kind}: pass a tokenizer to count its tokens")
    template_kwargs = dict(chat_template_kwargs or {})
    _check_tokenizer(tokenizer, kind)
    key = path = None
    if cache is not False and getattr(dataset, "_fingerprint", None):
        key = _cache_key(dataset, name, kind, tokenizer, add_special_tokens, template_kwargs)
        folder = cache_dir() if cache is True else Path(cache).expanduser()
        path = folder / f"lengths-{key[:40]}.npy"
        if path.exists():
            cached = np.load(path)
            if cached.shape == (len(dataset),):
                return cached.astype(np.int64, copy=False)
    lengths = _tokenized_lengths(dataset, name, kind, tokenizer, add_special_tokens,
                                 template_kwargs, batch_size, num_proc,
                                 os.urandom(16).hex() if key is None else key[:32])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path) as fh:  # a crash never leaves a cut cache file
            np.save(fh, lengths)
    return lengths
