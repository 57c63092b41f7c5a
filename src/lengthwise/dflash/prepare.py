"""Chat data to DFlash training data: token ids, an assistant-only loss mask, lengths.

:func:`prepare_chats` reads conversations (:mod:`lengthwise.dflash.chat`),
optionally has the target regenerate every assistant turn, renders each
conversation with the target's chat template, truncates or drops samples over
``max_len`` and drops samples with fewer than ``min_supervised`` assistant
tokens; every drop is counted. It writes a folder (read back by
:func:`lengthwise.dflash.prepared.open_prepared`):

- ``data-00000.parquet``, ...: columns ``input_ids`` (list<int32>), ``loss_mask``
  (list<int8>, 1 = assistant token to learn), ``length`` (int32) and
  ``source_row`` (int64, the input row); shard ``k`` holds input rows
  ``k * shard_rows ..``; each is written atomically, and a rerun with the same
  settings skips the shards already there;
- ``lengths.npy`` (int64, in row order, for ``lengthwise.load_lengths`` and the planner);
- ``prepare.json``: target, vocabulary size, tokenizer and chat-template hashes (checked
  by ``dflash train``), thinking switch, counts kept and dropped, and ``shard_seconds``:
  the seconds this run (its rank 0) spent on the shards it prepared (regenerating them,
  with ``--regenerate``; 0 when every shard was reused).

A rerun after the target's tokenizer or chat template changed prepares the shards
again (and says so); shards from other data or settings are refused. The folder's
lock is held from the start (:func:`~lengthwise.dflash.out_lock.sole_writer`): a second
prepare into the same ``--out`` stops before writing anything.

Example::

    $ lengthwise dflash prepare chats.jsonl --target ./Qwen3-8B --out prepared/
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lengthwise.atomic import atomic_open, atomic_path
from lengthwise.dflash.chat import TEMPLATE_ERRORS, ChatRenderer, normalise
from lengthwise.dflash.chat_files import ChatSource
from lengthwise.dflash.out_lock import sole_writer
from lengthwise.dflash.prepare_config import PrepareConfig
from lengthwise.dflash.regenerate import TurnGenerator, TurnLog, turns_to_write
from lengthwise.dflash.target_match import tokenizer_record
from lengthwise.disk import full_disk_error
from lengthwise.errors import ConfigError, DataError
from lengthwise.progress import progress
from lengthwise.train.device import barrier, rank_world, say

__all__ = ["PrepareCounts", "prepare_chats", "shard_name"]

FORMAT = 2
_META_KEY = b"lengthwise.prepare"
#: settings of how a run computes, not of what it writes: left out of the shards' fingerprint
_UNRECORDED = ("progress", "device", "dtype")


@dataclass
class PrepareCounts:
    """What happened to the input rows (summed over shards)."""

    rows: int = 0
    kept: int = 0
    dropped_few_supervised: int = 0
    dropped_too_long: int = 0
    truncated: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    most_supervised: int = 0  # the largest supervised count seen (for the all-dropped error)
    regenerated_turns: int = 0
    unfinished_turns: int = 0  # regenerated turns cut at max_new_tokens

    def add(self, other: PrepareCounts) -> None:
        for name, value in asdict(other).items():
            if name == "most_supervised":
                self.most_supervised = max(self.most_supervised, value)
            else:
                setattr(self, name, getattr(self, name) + value)


def turn_log_name(k: int) -> str:
    """File name of the turns regeneration finished in shard ``k`` (removed once it is written).

    Example::

        >>> turn_log_name(3)
        'regenerated-00003.jsonl'
    """
    return f"regenerated-{k:05d}.jsonl"


def shard_name(k: int) -> str:
    """File name of shard ``k``.

    Example::

        >>> shard_name(3)
        'data-00003.parquet'
    """
    return f"data-{k:05d}.parquet"


def _fingerprint(source: Path, target: Path, cfg: PrepareConfig) -> str:
    """The data and settings a shard was prepared from (the tokenizer is recorded apart)."""
    st = source.stat()
    settings = {k: v for k, v in asdict(cfg).items() if k not in _UNRECORDED}
    parts = {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             "target": str(target.resolve()), "settings": settings, "format": FORMAT}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _tokenizer_key(tokens: dict[str, Any]) -> str:
    """One hash of the tokenizer and template a shard was rendered with."""
    return hashlib.sha256(json.dumps(tokens, sort_keys=True).encode()).hexdigest()[:24]


def _shard_meta(path: Path) -> dict[str, Any] | None:
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:  # an unreadable shard (a crash mid-copy) is prepared again
        return None
    raw = meta.get(_META_KEY)
    return json.loads(raw) if raw else None


def _write_shard(path: Path, ids: list[list[int]], masks: list[list[int]], rows: list[int],
                 meta: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    table = pa.table({
        "input_ids": pa.array(ids, type=pa.list_(pa.int32())),
        "loss_mask": pa.array(masks, type=pa.list_(pa.int8())),
        "length": pa.array([len(x) for x in ids], type=pa.int32()),
        "source_row": pa.array(rows, type=pa.int64()),
    }).replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
    with _named_os_errors(path), atomic_path(path) as tmp:
        pq.write_table(table, tmp, write_page_checksum=True)


@contextmanager
def _named_os_errors(path: Path) -> Iterator[None]:
    """A full disk as a :class:`~lengthwise.errors.DiskFullError` naming ``path``; any other
    ``OSError`` that names no file re-raised naming it."""
    try:
        yield
    except OSError as exc:
        full = full_disk_error(exc, path.parent, what=f"writing {path.name}")
        if full is not None:
            raise full from None
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, f"cannot be written ({' '.join(str(exc).split())})",
                      str(path)) from None


class _Shard:
    """Render (and optionally regenerate) the conversations of one shard."""

    def __init__(self, renderer: ChatRenderer, cfg: PrepareConfig, generator: Any) -> None:
        self.renderer, self.cfg, self.generator = renderer, cfg, generator

    def run(self, items: list[tuple[int, str, Any]], k: int, log: Any = None,
            ) -> Generator[int, None, tuple[list[list[int]], list[list[int]], list[int],
                                            PrepareCounts]]:
        """Yields once per regenerated turn; returns the shard's ids, masks, rows and counts.

        ``log``: the shard's :class:`~lengthwise.dflash.regenerate.TurnLog` (turns an
        interrupted run finished are taken from it, new ones added to it).
        """
        cfg = self.cfg
        convs = [normalise(raw, where=where, allow_empty_assistant=cfg.regenerate)
                 for _, where, raw in items]
        counts = PrepareCounts(rows=len(items))
        written: list[Any] = [None] * len(convs)
        if cfg.regenerate:
            for (_, where, _), conv in zip(items, convs, strict=True):
                _render_or_name(lambda conv=conv: self.renderer.text(conv), where)
            done = log.read() if log is not None else {}
            if log is not None:
                log.start(done)
            written, counts.regenerated_turns, counts.unfinished_turns = (
                yield from self.generator.regenerate(
                    convs, seed=cfg.seed + k, done=done,
                    record=log.append if log is not None else None))
        ids_out, masks_out, rows_out = [], [], []
        for (row, where, _), conv, got in zip(items, convs, written, strict=True):
            r = got if got is not None else _render_or_name(
                lambda conv=conv: self.renderer.render(conv), where)
            ids, mask = r.input_ids, r.loss_mask
            if cfg.max_len is not None and len(ids) > cfg.max_len:
                if cfg.overlong == "drop":
                    counts.dropped_too_long += 1
                    continue
                ids, mask = ids[: cfg.max_len], mask[: cfg.max_len]
                counts.truncated += 1
            supervised = int(sum(mask))
            counts.most_supervised = max(counts.most_supervised, supervised)
            if supervised < cfg.min_supervised:
                counts.dropped_few_supervised += 1
                continue
            counts.kept += 1
            counts.tokens += len(ids)
            counts.supervised_tokens += supervised
            ids_out.append(ids)
            masks_out.append(mask)
            rows_out.append(row)
        return ids_out, masks_out, rows_out, counts


def _render_or_name(render: Any, where: str) -> Any:
    """``render()``, a template's refusal of the conversation re-raised naming ``where``."""
    try:
        return render()
    except TEMPLATE_ERRORS as exc:  # the template refused this conversation
        raise DataError(f"{where}: the chat template cannot render it "
                        f"({' '.join(str(exc).split())[:200]})") from None


def prepare_chats(source: str | Path, target: str | Path, out: str | Path,
                  cfg: PrepareConfig | None = None, *, tokenizer: Any = None,
                  info: Any = None) -> dict[str, Any]:
    """Prepare ``source`` for DFlash training with ``target``'s chat template into ``out``.

    ``tokenizer`` (a fast Hugging Face tokenizer with a chat template) replaces the
    one in the ``target`` folder. Under ``torchrun`` (``info``: the process group),
    rank ``r`` prepares shards ``r, r + world, ...`` and rank 0 writes the lengths and
    the record once every shard is there.

    Returns what ``prepare.json`` records. Raises :class:`DataError` when no sample
    is kept (never an empty data set) and for malformed conversations (row and
    field named); :class:`ConfigError` for a target without a usable chat template.
    """
    from lengthwise.dflash.target import load_tokenizer

    cfg = cfg or PrepareConfig()
    source, target, out = Path(source), Path(target), Path(out)
    if not source.exists():
        raise DataError(f"{source}: no such file or folder")
    tok = tokenizer if tokenizer is not None else load_tokenizer(target)
    renderer = ChatRenderer(tok, enable_thinking=cfg.enable_thinking, name=f"--target {target}")
    chats = ChatSource(source, field=cfg.field, split=cfg.split)
    if len(chats) == 0:
        raise DataError(f"{source}: no conversations")
    with sole_writer(out, "dflash prepare", info):
        return _prepare(chats, target, out, cfg, tok, renderer, info)


def _prepare(chats: ChatSource, target: Path, out: Path, cfg: PrepareConfig, tok: Any,
             renderer: ChatRenderer, info: Any) -> dict[str, Any]:
    """:func:`prepare_chats` with ``out``'s lock held."""

    source = chats.path
    rank, world = rank_world(info)
    fp = _fingerprint(source, target, cfg)
    tokens = tokenizer_record(tok)
    key = _tokenizer_key(tokens)
    total = len(chats)
    nshards = -(-total // cfg.shard_rows)
    done, stale = _finished_shards(out, nshards, fp, key)
    if stale:
        say(info, f"lengthwise dflash prepare: {stale} shard(s) in {out} were prepared with "
                  "another tokenizer or chat template of the target: prepared again")
    barrier(info)  # every rank has seen what an earlier run finished before any writes
    todo = [k for k in range(rank, nshards, world) if k not in done]
    generator = None
    work_seconds = 0.0  # this process's shards (what the regeneration estimate predicts)
    if todo:
        if cfg.regenerate:
            generator = TurnGenerator(target, renderer, cfg, info=info)
        shard = _Shard(renderer, cfg, generator)
        out.mkdir(parents=True, exist_ok=True)

        def work() -> Iterator[int]:
            """Prepare the shards to do; yields once per shard (per turn, regenerating)."""
            for k in todo:
                lo, hi = k * cfg.shard_rows, min(total, (k + 1) * cfg.shard_rows)
                log = (TurnLog(out / turn_log_name(k), {"fingerprint": fp, "tokenizer": key})
                       if cfg.regenerate else None)
                ids, masks, rows, c = yield from shard.run(list(chats.rows(lo, hi)), k, log)
                _write_shard(out / shard_name(k), ids, masks, rows,
                             {"fingerprint": fp, "tokenizer": key, "rows": [lo, hi],
                              "counts": asdict(c)})
                if log is None:
                    yield k
                else:
                    log.path.unlink(missing_ok=True)

        if cfg.regenerate:
            turns = sum(turns_to_write(normalise(raw, where=where, allow_empty_assistant=True))
                        for k in todo for _, where, raw in chats.rows(
                            k * cfg.shard_rows, min(total, (k + 1) * cfg.shard_rows)))
            bar = {"desc": "dflash prepare: the target writes", "unit": "turn", "total": turns}
        else:
            bar = {"desc": "dflash prepare", "unit": "shard", "total": len(todo)}
        started = time.perf_counter()
        for _ in progress(work(), enable=cfg.progress and rank == 0, **bar):
            pass
        work_seconds = time.perf_counter() - started
    barrier(info)
    counts = PrepareCounts()
    for k in range(nshards):
        meta = _shard_meta(out / shard_name(k))
        if meta is None:
            raise DataError(f"--out {out}: {shard_name(k)} is missing or unreadable after "
                            "preparing; run again to prepare it")
        counts.add(PrepareCounts(**meta["counts"]))
    if counts.kept == 0:
        why = (f"every one of the {counts.rows} samples was dropped: "
               f"{counts.dropped_few_supervised} have fewer than --min-supervised "
               f"{cfg.min_supervised} assistant tokens (the most any has is "
               f"{counts.most_supervised})")
        if counts.dropped_too_long:
            why += f", {counts.dropped_too_long} are longer than --max-len {cfg.max_len}"
        raise DataError(f"{source}: {why}; lower --min-supervised or check the data")
    record = {
        "format": FORMAT, "source": str(source), "target": str(target),
        "chat_template_sha256": renderer.template_sha256,
        "tokenizer_sha256": tokens["tokenizer_sha256"],
        "enable_thinking": cfg.enable_thinking, "thinking_switch": renderer.has_thinking,
        "loss_mask_from": ("generation marks" if renderer.uses_generation_marks
                           else "whole-conversation rendering"),
        "mask_token_id": getattr(tok, "mask_token_id", None),
        "vocab_size": len(tok),
        "settings": {k: v for k, v in asdict(cfg).items() if k != "progress"},
        "shards": [shard_name(k) for k in range(nshards)], "shards_reused": len(done),
        "processes": world,
        "regenerated_with": generator.backend if generator is not None else None,
        "shard_seconds": round(work_seconds, 3),
        "counts": asdict(counts),
        "fingerprint": fp,
    }
    if rank == 0:
        lengths = _gather_lengths(out, nshards)
        with _named_os_errors(out / "lengths.npy"), atomic_open(out / "lengths.npy") as fh:
            np.save(fh, lengths)
        with (_named_os_errors(out / "prepare.json"),
              atomic_open(out / "prepare.json", "w", encoding="utf-8") as fh):
            fh.write(json.dumps(record, indent=2) + "\n")
        _say_past_positions(lengths, target, info)
    barrier(info)
    return record


def _say_past_positions(lengths: np.ndarray, target: Path, info: Any) -> None:
    """Say how many samples the target's ``max_position_embeddings`` cannot hold whole."""
    from lengthwise.dflash.target import max_positions, past_positions
    from lengthwise.train.device import say

    try:
        config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a tokenizer given without a model folder: nothing to say
        return
    limit = max_positions(config) if isinstance(config, dict) else None
    note = past_positions(lengths, limit, what="samples", advice=(
        f"they are kept whole; give --max-len {limit} here, or to dflash train, to cut them"))
    if note is not None:
        say(info, f"lengthwise dflash prepare: warning: {note}")


def _finished_shards(out: Path, nshards: int, fp: str, key: str) -> tuple[set[int], int]:
    """Shards an earlier run with the same settings (fingerprint ``fp``) and tokenizer (``key``)
    finished, and how many it finished with another tokenizer (prepared again); other files
    there, and shards that record no tokenizer (an older lengthwise's), are refused."""
    names = {shard_name(k): k for k in range(nshards)}
    done = set()
    stale = 0
    for path in sorted(out.glob("data-*.parquet")) if out.is_dir() else []:
        if path.name not in names:
            raise ConfigError(f"--out {out}: {path.name} is not one of this run's shards; "
                              "use an empty folder")
        meta = _shard_meta(path)
        if meta is None:
            continue  # unreadable: prepared again
        if "tokenizer" not in meta:
            raise ConfigError(f"--out {out}: {path.name} was prepared by an older lengthwise (it "
                              "records no tokenizer), which this version does not reuse; use an "
                              "empty folder")
        if meta.get("fingerprint") != fp:
            raise ConfigError(f"--out {out}: {path.name} was prepared from other data or "
                              "settings; use an empty folder (or the same settings to resume)")
        if meta.get("tokenizer") != key:
            stale += 1
            continue
        done.add(names[path.name])
    return done, stale


def _gather_lengths(out: Path, nshards: int) -> np.ndarray:
    import pyarrow.parquet as pq

    parts = [pq.read_table(out / shard_name(k), columns=["length"]).column("length")
             .to_numpy().astype(np.int64) for k in range(nshards)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
