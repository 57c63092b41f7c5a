"""Target features computed once: the cache ``dflash features`` writes, ``train --features`` reads.

A DFlash draft reads the frozen target's hidden states at a few layers. Training
online runs the whole target for every micro-batch of every epoch; a feature
cache runs it once per sample and stores, per token, those layers (and, by
default, the target's last hidden state, from which the target's distribution is
one matmul through its LM head). A training run then reads the rows it needs.

Layout of a cache folder:

- ``features_NNNNN.npy`` (tokens, layers, hidden) and ``last_NNNNN.npy`` (tokens,
  hidden): the shards, plain ``.npy`` files memory-mapped when read (``bfloat16`` is
  stored as its raw 16 bits);
- ``index.npy``: per prepared sample its shard, first row and stored length;
- ``features.json``: the record, written last: the target's weights record, layers,
  dtype, the prepared data's fingerprint and tokenizer, and every shard's size and
  SHA-256. A folder without it is a pass still under way (``pass.json``, and a
  ``done_NNNNN.json`` beside each shard written whole): running the pass again
  resumes after its finished shards.

The pass (:func:`write_features`) sorts the samples by length, longest first (a
batch that does not fit the memory fails at once), cuts them into batches of at
most ``max_tokens`` padded tokens with the planner's own rule, and writes a shard
at a time, each whole or not at all. Its size is known before it starts, and a
disk without room for it is refused before any work.

Example::

    $ lengthwise dflash features prepared/ --target ./SmolLM2 --out features/
    $ lengthwise dflash train --target ./SmolLM2 --data prepared/ --features features/
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.atomic import atomic_open, atomic_path
from lengthwise.dflash.objective import target_layer_ids
from lengthwise.dflash.prepared import open_prepared
from lengthwise.dflash.target_match import (
    TOKENIZER_FIELDS,
    check_tokenizer,
    differs,
    weights_record,
)
from lengthwise.disk import format_bytes, reporting_full_disk
from lengthwise.errors import ConfigError, DataError
from lengthwise.flag_field import flag_field
from lengthwise.planning.batching import greedy_batches, row_limit
from lengthwise.progress import progress
from lengthwise.train.device import barrier, configure_torch, pick_device, rank_world, say

__all__ = ["DTYPES", "CachedRows", "FeatureCache", "FeaturesConfig", "PassPlan", "cache_bytes",
           "open_features", "plan_pass", "write_features"]

FORMAT = "lengthwise-dflash-features"
VERSION = 1
RECORD = "features.json"
PASS = "pass.json"
INDEX = "index.npy"
#: stored dtypes and the NumPy dtype of their bytes on disk (bfloat16 as its raw bits)
DTYPES = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32}
FLOAT16_MAX = 65504.0


@dataclass
class FeaturesConfig:
    """Settings of a feature pass (the flags of ``lengthwise dflash features``)."""

    num_features: int = flag_field(
        5, "target layers to store, spread over the target as `dflash train` spreads them; a "
        "run reads any subset of the stored layers")
    layers: str | None = flag_field(
        None, "the target layers to store, as comma-separated ids (instead of --num-features)",
        type=str, metavar="IDS")
    dtype: str = flag_field("float16", "dtype of the stored features", choices=tuple(DTYPES))
    last_hidden: bool = flag_field(
        True, "also store the target's last hidden state (its own distribution, for the "
        "held-out evaluation without a target forward)")
    max_tokens: int = flag_field(
        2048, "padded tokens per batch of the target (on a CPU larger batches run slower a "
        "token; on a GPU raise it)")
    max_len: int | None = flag_field(None, "tokens stored per sample", none="all", type=int)
    shard_mib: int = flag_field(256, "MiB per shard (the part an interrupted pass redoes)")
    device: str = flag_field("cpu", "device of the target")
    target_dtype: str | None = flag_field(
        None, "dtype of the target's weights: float32, bfloat16 or float16",
        none="float32 on CPU, the checkpoint's on CUDA", type=str)
    threads: int | None = flag_field(None, "torch threads on CPU", none="torch's own", type=int)
    overwrite: bool = flag_field(False, "replace a cache of other settings, or a finished one, "
                                        "in --out")
    progress: bool = flag_field(True, "a progress bar")

    def __post_init__(self) -> None:
        for name in ("num_features", "max_tokens", "shard_mib", "max_len", "threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.layers is not None:
            self.layer_list()

    def layer_list(self) -> list[int] | None:
        """``layers`` as sorted distinct ids (``None`` when not given).

        Example::

            >>> FeaturesConfig(layers="8, 1,14").layer_list()
            [1, 8, 14]
        """
        if self.layers is None:
            return None
        try:
            ids = sorted({int(x) for x in str(self.layers).split(",") if x.strip()})
        except ValueError:
            raise ConfigError(f"layers must be comma-separated layer ids, got "
                              f"{self.layers!r}") from None
        if not ids or ids[0] < 0:
            raise ConfigError(f"layers must be layer ids >= 0, got {self.layers!r}")
        return ids


def cache_bytes(tokens: int, layers: int, hidden: int, dtype: str, last_hidden: bool) -> int:
    """Bytes of the shards for ``tokens`` stored tokens (headers aside).

    Example::

        >>> cache_bytes(1000, 5, 576, "float16", True)   # (5 + 1) * 576 * 2 per token
        6912000
    """
    per = (layers + int(last_hidden)) * hidden * np.dtype(DTYPES[dtype]).itemsize
    return int(tokens) * per


@dataclass
class PassPlan:
    """The batches and shards of a pass: ``order`` of the samples, ``batches`` (offsets into
    ``order``), ``shards`` (offsets into the batches) and each sample's ``index`` row
    ``(shard, first row, stored length)``."""

    order: np.ndarray
    batches: np.ndarray
    shards: np.ndarray
    index: np.ndarray

    def shard_tokens(self, s: int) -> int:
        """Rows of shard ``s``."""
        return int(self.index[self.order[self.batches[self.shards[s]]:
                                         self.batches[self.shards[s + 1]]], 2].sum())


def plan_pass(stored: np.ndarray, *, max_tokens: int, shard_tokens: int) -> PassPlan:
    """Batches of the pass over samples of ``stored`` lengths, longest first, and their shards.

    A batch holds at most ``max_tokens`` padded tokens (a longer sample alone); a shard
    closes at the first batch that brings it to ``shard_tokens`` rows.

    Example::

        >>> p = plan_pass(np.array([3, 8, 5, 2]), max_tokens=10, shard_tokens=9)
        >>> p.order.tolist(), p.batches.tolist(), p.shards.tolist()
        ([1, 2, 0, 3], [0, 1, 3, 4], [0, 2, 3])
        >>> p.index.tolist()
        [[0, 13, 3], [0, 0, 8], [0, 8, 5], [1, 0, 2]]
    """

    stored = np.asarray(stored, dtype=np.int64)
    order = np.argsort(-stored, kind="stable")
    _, batches = greedy_batches(order, stored, row_limit(max_tokens=max_tokens))
    index = np.zeros((stored.size, 3), dtype=np.int64)
    cuts, shard, rows = [0], 0, 0
    for b in range(batches.size - 1):
        members = order[batches[b]:batches[b + 1]]
        n = stored[members]
        index[members, 0] = shard
        index[members, 1] = rows + np.concatenate([[0], np.cumsum(n)[:-1]])
        index[members, 2] = n
        rows += int(n.sum())
        if rows >= shard_tokens:
            cuts.append(b + 1)
            shard, rows = shard + 1, 0
    if cuts[-1] != batches.size - 1:
        cuts.append(batches.size - 1)
    return PassPlan(order, batches, np.asarray(cuts, dtype=np.int64), index)


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _shard_names(s: int, last_hidden: bool) -> list[str]:
    return [f"features_{s:05d}.npy"] + ([f"last_{s:05d}.npy"] if last_hidden else [])


def _to_stored(x: Any, dtype: str, where: str) -> np.ndarray:
    """A float tensor as the bytes stored for ``dtype`` (float16 out of range refused)."""
    import torch

    if dtype == "float32":
        return x.float().cpu().numpy()
    if dtype == "bfloat16":
        return x.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
    top = float(x.abs().max()) if x.numel() else 0.0
    if top > FLOAT16_MAX:
        raise DataError(f"{where}: the target's hidden states reach {top:.4g}, beyond "
                        f"float16's range ({FLOAT16_MAX:g}); give --dtype bfloat16 or float32")
    return x.to(torch.float16).cpu().numpy()


def _from_stored(a: np.ndarray, dtype: str) -> Any:
    """Stored rows as a float32 tensor."""
    import torch

    t = torch.from_numpy(np.array(a, copy=True))
    if dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    return t.float()


def write_features(data: str | Path, target: str | Path, out: str | Path,
                   cfg: FeaturesConfig, *, info: Any = None) -> dict[str, Any]:
    """Run the target once over every sample of prepared ``data``; write the cache to ``out``.

    Returns the record (``features.json``). A finished cache of the same settings is
    left as it is; a pass under way resumes after its finished shards; another cache in
    ``out`` is refused unless ``cfg.overwrite``. A disk without room is refused first.
    ``info``: the ``torchrun`` group; rank ``r`` of ``w`` writes the shards ``s`` with
    ``s % w == r`` into ``out``, a folder every rank sees.
    """

    from lengthwise.dflash.target import Target, load_target, load_tokenizer
    from lengthwise.pytorch.collate import PadCollator

    out = Path(out)
    rank, world = rank_world(info)
    prepared = open_prepared(data)
    check_tokenizer(prepared.info, load_tokenizer(target), data=str(data), target=str(target))
    device = pick_device(cfg.device, info)
    configure_torch(device, threads=cfg.threads, deterministic=False)
    model = load_target(target, dtype=cfg.target_dtype, device=device)
    n_layers = int(model.config.num_hidden_layers)
    layers = cfg.layer_list() or target_layer_ids(n_layers, cfg.num_features)
    if layers[-1] >= n_layers:
        raise ConfigError(f"--layers {cfg.layers}: the target has layers 0 to {n_layers - 1}")
    tgt = Target(model, layers=layers)
    hidden = int(model.config.hidden_size)
    lengths = np.asarray(prepared.lengths, dtype=np.int64)
    stored = lengths if cfg.max_len is None else np.minimum(lengths, cfg.max_len)
    per_token = cache_bytes(1, len(layers), hidden, cfg.dtype, cfg.last_hidden)
    plan = plan_pass(stored, max_tokens=cfg.max_tokens,
                     shard_tokens=max(1, cfg.shard_mib * 2**20 // per_token))
    identity = {
        "format": FORMAT, "version": VERSION,
        "settings": {"layers": layers, "dtype": cfg.dtype, "last_hidden": cfg.last_hidden,
                     "max_len": cfg.max_len, "hidden_size": hidden,
                     "num_hidden_layers": n_layers, "max_tokens": cfg.max_tokens,
                     "shard_mib": cfg.shard_mib},
        "target": {"path": str(target), "weights": weights_record(model),
                   "dtype": str(model.dtype).removeprefix("torch.")},
        "data": {"folder": str(data), "samples": int(lengths.size),
                 "tokens": int(stored.sum()), "fingerprint": prepared.fingerprint(),
                 "tokenizer": {k: prepared.info[k] for k in TOKENIZER_FIELDS
                               if prepared.info.get(k) is not None}}}
    state = _start(out, identity, cfg.overwrite)  # every rank checks, then rank 0 acts
    barrier(info)
    if state != "complete" and rank == 0:
        _open_pass(out, identity, state)
    barrier(info)
    if state == "complete":
        say(info, f"lengthwise dflash features: {out} already holds this cache; nothing to do")
        return json.loads((out / RECORD).read_text(encoding="utf-8"))
    n_shards = plan.shards.size - 1
    done = _finished(out, n_shards)
    total = cache_bytes(int(stored.sum()), len(layers), hidden, cfg.dtype, cfg.last_hidden)
    left = sum(cache_bytes(plan.shard_tokens(s), len(layers), hidden, cfg.dtype,
                           cfg.last_hidden) for s in range(n_shards) if s not in done)
    free = shutil.disk_usage(out).free
    say(info, f"lengthwise dflash features: {lengths.size} samples, {int(stored.sum()):,} "
              f"tokens; layers {layers}" + (" and the last hidden state" if cfg.last_hidden
                                            else "")
              + f" of a {hidden}-wide target in {cfg.dtype}: {format_bytes(total)} in "
              f"{n_shards} shard(s) ({format_bytes(per_token)} a token)"
              + (f", {len(done)} done, {format_bytes(left)} to write" if done else "")
              + f"; {format_bytes(free)} free")
    if left > free:
        raise ConfigError(f"--out {out}: the cache needs {format_bytes(left)} more and the "
                          f"disk there has {format_bytes(free)} free; free space or give "
                          "--out on another disk")
    if rank == 0:
        with atomic_path(out / INDEX) as tmp:
            np.save(tmp, plan.index, allow_pickle=False)
    shard_of = np.repeat(np.arange(n_shards), np.diff(plan.shards))
    collate = PadCollator(pad_token_id=0, pad_multiple=1)
    mine = np.flatnonzero((shard_of % world == rank) & ~np.isin(shard_of, list(done)))
    writer: _ShardWriter | None = None
    try:
        for b in progress(mine.tolist(), desc="dflash features", unit="batch",
                          total=int(mine.size), enable=cfg.progress and rank == 0):
            s = int(shard_of[b])
            if writer is None:
                writer = _ShardWriter(out, s, plan.shard_tokens(s), len(layers), hidden, cfg)
            members = plan.order[plan.batches[b]:plan.batches[b + 1]]
            n = stored[members]
            batch = collate([{"input_ids": prepared.sample(i)["input_ids"][:k]}
                             for i, k in zip(members.tolist(), n.tolist(), strict=True)])
            f, h = tgt.features_and_output(batch["input_ids"].to(device),
                                           attention_mask=batch["attention_mask"].to(device))
            for r, i in enumerate(members.tolist()):
                k = int(n[r])
                writer.put(int(plan.index[i, 1]), [f[r, :k].reshape(k, len(layers), hidden),
                                                   h[r, :k]], f"sample {i} of --data {data}")
            if b + 1 == plan.shards[s + 1]:
                mark = writer.close()
                writer = None
                with atomic_open(out / _mark_name(s), "w", encoding="utf-8") as fh:
                    json.dump(mark, fh)  # after the shard's files: a mark means a whole shard
    except BaseException as exc:
        if writer is not None:  # its files are removed, never renamed
            writer.files.__exit__(type(exc), exc, exc.__traceback__)
        raise
    barrier(info)
    done = _finished(out, n_shards)
    if rank == 0:
        missing = [s for s in range(n_shards) if s not in done]
        if missing:
            raise DataError(f"--out {out}: shards {missing[:5]} were not written by any rank; "
                            "run the pass again to finish them")
        record = {**identity, "complete": True, "bytes": total, "width": len(layers) * hidden,
                  "shards": [{"files": _shard_names(s, cfg.last_hidden), **done[s]}
                             for s in range(n_shards)],
                  "index_sha256": _sha256(out / INDEX)}
        with atomic_open(out / RECORD, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record, indent=1) + "\n")
        for s in range(n_shards):
            (out / _mark_name(s)).unlink(missing_ok=True)
        (out / PASS).unlink(missing_ok=True)
    barrier(info)
    return json.loads((out / RECORD).read_text(encoding="utf-8"))


def _mark_name(s: int) -> str:
    return f"done_{s:05d}.json"


def _finished(out: Path, n_shards: int) -> dict[int, dict[str, Any]]:
    """The shards of the pass under way in ``out`` that are written whole: their marks."""
    done = {}
    for s in range(n_shards):
        try:
            done[s] = json.loads((out / _mark_name(s)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return done


class _ShardWriter:
    """One shard's files, written under temporary names and renamed whole by :meth:`close`."""

    def __init__(self, out: Path, s: int, rows: int, layers: int, hidden: int,
                 cfg: FeaturesConfig) -> None:
        from lengthwise.atomic import atomic_path

        self.out, self.dtype = out, cfg.dtype
        self.names = _shard_names(s, cfg.last_hidden)
        self.files = contextlib.ExitStack()
        need = cache_bytes(rows, layers, hidden, cfg.dtype, cfg.last_hidden)
        self.files.enter_context(reporting_full_disk(out, needed=need,
                                                     what=f"writing shard {s}"))
        shapes = [(rows, layers, hidden), (rows, hidden)]
        self.arrays = [np.lib.format.open_memmap(
            self.files.enter_context(atomic_path(out / name)), mode="w+",
            dtype=DTYPES[cfg.dtype], shape=shape) for name, shape in zip(self.names, shapes,
                                                                         strict=False)]
        self.rows = rows

    def put(self, first: int, parts: list[Any], where: str) -> None:
        """Rows of one sample from row ``first``: its features, then its last hidden states."""
        for array, part in zip(self.arrays, parts, strict=False):
            array[first:first + part.shape[0]] = _to_stored(part, self.dtype, where)

    def close(self) -> dict[str, Any]:
        """Flush, rename the files to their names; their rows and SHA-256."""
        for array in self.arrays:
            array.flush()
        self.arrays.clear()
        self.files.close()
        return {"tokens": self.rows,
                "sha256": {name: _sha256(self.out / name) for name in self.names}}


def _start(out: Path, identity: dict[str, Any], overwrite: bool) -> str:
    """What ``out`` holds for a pass of ``identity``: ``"complete"`` (this cache, finished),
    ``"resume"`` (this pass under way), ``"new"``, or ``"replace"`` (another cache, with
    ``overwrite``); anything else there is refused. Reads only."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file, not a folder")
    found = None
    for name in (RECORD, PASS):
        if (out / name).is_file():
            try:
                found = json.loads((out / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                found = {}
            break
    if found is None:
        if out.is_dir() and any(out.iterdir()):
            raise ConfigError(f"--out {out} is a folder with other files in it, not a feature "
                              "cache: give an empty or new folder")
        return "new"
    if not overwrite and _what(found) == _what(identity):
        return "complete" if found.get("complete") else "resume"
    if not overwrite:
        raise ConfigError(f"--out {out} holds a feature cache of other settings, target or "
                          "data: give --overwrite to replace it, or another --out")
    return "replace"


def _what(record: dict[str, Any]) -> dict[str, Any]:
    """What a pass computes: its identity without the folders it was read from (a moved
    target or data folder holds the same weights and samples).

    Example::

        >>> _what({"target": {"path": "a", "weights": 1}, "data": {"folder": "b", "n": 2}})
        {'target': {'weights': 1}, 'data': {'n': 2}}
    """
    out = {k: v for k, v in record.items() if k not in ("complete", "shards", "bytes", "width",
                                                         "index_sha256")}
    for key, path in (("target", "path"), ("data", "folder")):
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k != path}
    return out


def _open_pass(out: Path, identity: dict[str, Any], state: str) -> None:
    """Make ``out`` ready for the pass (``state`` from :func:`_start`); one rank does it."""

    from lengthwise.atomic import atomic_open

    if state == "replace":
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.tmp.*"):
        stale.unlink()  # a shard whose writer was killed
    with atomic_open(out / PASS, "w", encoding="utf-8") as fh:
        json.dump(identity, fh)


class FeatureCache:
    """A finished feature cache, memory-mapped: ``features(i, layers)`` and ``last(i)``.

    ``record`` is its ``features.json``; ``layers`` the stored target layers.
    """

    def __init__(self, folder: Path, record: dict[str, Any], index: np.ndarray,
                 shards: list[list[np.ndarray]]) -> None:
        self.folder, self.record, self.index, self._shards = folder, record, index, shards
        settings = record["settings"]
        self.layers: list[int] = list(settings["layers"])
        self.dtype: str = settings["dtype"]
        self.has_last: bool = bool(settings["last_hidden"])
        self.hidden: int = int(settings["hidden_size"])

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def stored_length(self, i: int) -> int:
        """Tokens stored of sample ``i``."""
        return int(self.index[i, 2])

    def features(self, i: int, layers: list[int], n: int | None = None) -> Any:
        """The first ``n`` (default: all stored) tokens' features of sample ``i`` at
        ``layers`` (a subset of the stored ones), ``(n, len(layers) * hidden)`` float32."""
        shard, first, k = (int(x) for x in self.index[i])
        n = k if n is None else n
        if n > k:
            raise DataError(f"{self.folder}: sample {i} has {k} tokens stored, {n} asked for; "
                            "make the cache with a larger --max-len")
        rows = self._shards[shard][0][first:first + n]
        pick = [self.layers.index(x) for x in layers]
        if pick != list(range(len(self.layers))):
            rows = rows[:, pick]
        return _from_stored(rows, self.dtype).reshape(n, len(layers) * self.hidden)

    def last(self, i: int, n: int | None = None) -> Any:
        """The target's last hidden states of sample ``i``'s first ``n`` tokens ``(n, hidden)``."""
        if not self.has_last:
            raise DataError(f"{self.folder}: made with --no-last-hidden")
        shard, first, k = (int(x) for x in self.index[i])
        return _from_stored(self._shards[shard][1][first:first + (k if n is None else n)],
                            self.dtype)

    def check(self, *, weights: dict[str, Any], layers: list[int], fingerprint: str,
              tokenizer: dict[str, Any], max_len: int, data: str) -> None:
        """Refuse a cache of another target, other layers, data or tokenizer, or one cut
        shorter than ``max_len`` (a :class:`DataError` naming the difference)."""

        where = f"--features {self.folder}"
        if differs(self.record["target"]["weights"], weights):
            raise DataError(f"{where}: made from another target's weights than --target's; "
                            "make the cache again with this target")
        missing = [x for x in layers if x not in self.layers]
        if missing:
            raise DataError(f"{where}: holds target layers {self.layers}, not {missing}, "
                            f"which the run reads ({layers}); make the cache with --layers "
                            f"{','.join(str(x) for x in sorted(set(self.layers) | set(layers)))}")
        if self.record["data"]["fingerprint"] != fingerprint:
            raise DataError(f"{where}: made from other samples than --data {data}; make the "
                            "cache again from this data")
        if self.record["data"].get("tokenizer") != tokenizer:
            raise DataError(f"{where}: made with another tokenizer or chat template than "
                            f"--data {data}'s")
        cut = self.record["settings"]["max_len"]
        if cut is not None and cut < max_len:
            raise DataError(f"{where}: stores {cut} tokens per sample, the run trains on up "
                            f"to {max_len}; make the cache with --max-len {max_len} or train "
                            f"with --max-len {cut}")


class CachedRows:
    """The cache's features laid out as a collated micro-batch's rows (what the draft reads).

    ``index_of(sample_id)``: the prepared sample behind a row's sample id (the ids the
    sampler or the held-out batches give); ``layers``: the run's target layers.
    """

    def __init__(self, cache: FeatureCache, layers: list[int],
                 index_of: Callable[[int], int]) -> None:
        self.cache, self.layers, self.index_of = cache, list(layers), index_of

    def __call__(self, batch: dict[str, Any], rows: list[list[int]], *, last: bool = False,
                 capacity: int | None = None) -> tuple[Any, Any]:
        """``(features (R, C, F), last hidden states (R, C, H))`` of ``batch`` (``capacity``:
        the packed row length, for packed batches); the second is ``None`` unless ``last``
        and the cache holds them."""
        import torch

        from lengthwise.dflash.blocks import row_segments

        packed = "position_ids" in batch and "attention_mask" not in batch
        ids, _, segs = row_segments(batch, rows, packed,
                                    capacity or int(batch["input_ids"].shape[-1]))
        n_rows, width = ids.shape
        feats = torch.zeros((n_rows, width, len(self.layers) * self.cache.hidden))
        hidden = (torch.zeros((n_rows, width, self.cache.hidden))
                  if last and self.cache.has_last else None)
        for r, row in enumerate(segs):
            for start, end, sid in row:
                if sid < 0:
                    continue
                i = self.index_of(sid)
                feats[r, start:end] = self.cache.features(i, self.layers, end - start)
                if hidden is not None:
                    hidden[r, start:end] = self.cache.last(i, end - start)
        return feats, hidden


def open_features(folder: str | Path, *, verify: bool = True) -> FeatureCache:
    """The finished cache in ``folder``; ``verify``: check every shard's SHA-256 first.

    A folder that is not a cache, a pass not finished, a missing, cut or changed shard
    is a :class:`DataError` naming it.
    """
    folder = Path(folder)
    where = f"--features {folder}"
    if not (folder / RECORD).is_file():
        if (folder / PASS).is_file():
            raise DataError(f"{where}: its pass did not finish; run `lengthwise dflash "
                            "features` again with the same settings to finish it")
        raise DataError(f"{where}: not a feature cache (no {RECORD}; made by `lengthwise "
                        "dflash features`)")
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        ok = record.get("format") == FORMAT and record.get("complete") is True
    except (OSError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise DataError(f"{where}: {RECORD} is not a feature cache's record")
    if record.get("version") != VERSION:
        raise DataError(f"{where}: a cache of format version {record.get('version')}, this "
                        f"lengthwise reads version {VERSION}; make the cache again")
    names = [INDEX] + [n for s in record["shards"] for n in s["files"]]
    sums = {INDEX: record["index_sha256"]} | {
        n: s["sha256"][n] for s in record["shards"] for n in s["files"]}
    for name in names:
        path = folder / name
        if not path.is_file() or path.is_symlink() or Path(name).name != name:
            raise DataError(f"{where}: {name} is missing; make the cache again")
        if verify and _sha256(path) != sums[name]:
            raise DataError(f"{where}: {name} is damaged or cut short (its SHA-256 differs "
                            "from the record's); make the cache again")
    try:
        index = np.load(folder / INDEX, allow_pickle=False)
        shards = [[np.load(folder / n, mmap_mode="r", allow_pickle=False) for n in s["files"]]
                  for s in record["shards"]]
    except (OSError, ValueError) as exc:
        raise DataError(f"{where}: a shard cannot be read ({exc}); make the cache "
                        "again") from None
    return FeatureCache(folder, record, index, shards)

