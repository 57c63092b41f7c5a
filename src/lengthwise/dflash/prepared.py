"""Read a folder written by ``lengthwise dflash prepare``: samples and their lengths.

:func:`open_prepared` checks the folder (``prepare.json``, every shard readable and
its page checksums, ``lengths.npy`` agreeing with every sample's token count) and
returns :class:`PreparedChats`, a random-access view over the shards (memory-mapped
Parquet, nothing copied per sample but the sample itself).

Example::

    >>> from lengthwise.dflash.prepared import open_prepared
    >>> chats = open_prepared("prepared/")                      # doctest: +SKIP
    >>> len(chats), chats.lengths[:3], chats[0]["loss_mask"][:4]  # doctest: +SKIP
    (912345, array([412, 1033, 87]), [0, 0, 0, 0])
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.dflash.objective import anchor_candidates
from lengthwise.errors import DataError

__all__ = ["PreparedChats", "open_prepared"]

IGNORE = -100


class PreparedChats:
    """Prepared conversations: ``len()``, ``.lengths``, ``[i] -> {"input_ids", "loss_mask"}``."""

    def __init__(self, folder: Path, info: dict[str, Any], chunks: list[tuple[Any, ...]],
                 lengths: np.ndarray) -> None:
        self.folder, self.info, self.lengths = folder, info, lengths
        self._chunks = chunks  # (ids values, ids offsets, mask values, mask offsets)
        self._starts = np.cumsum([0] + [c[1].size - 1 for c in chunks])

    def __len__(self) -> int:
        return int(self.lengths.size)

    def _locate(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i %= n
        c = int(np.searchsorted(self._starts, i, side="right")) - 1
        ids, off, mask, moff = self._chunks[c]
        j = i - int(self._starts[c])
        return ids[off[j]:off[j + 1]], mask[moff[j]:moff[j + 1]]

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        ids, mask = self._locate(int(i))
        return {"input_ids": ids.tolist(), "loss_mask": mask.tolist()}

    def max_token_id(self) -> int:
        """The largest token id in the data (``-1`` when empty); checks the target's vocabulary.

        Example::

            >>> chats.max_token_id() < 151_936                          # doctest: +SKIP
            True
        """
        return max((int(c[0][c[1][0]:c[1][-1]].max()) for c in self._chunks
                    if c[1][-1] > c[1][0]), default=-1)

    def unlearnable_when_cut(self, idx: np.ndarray, max_len: int) -> np.ndarray:
        """Whether each sample ``idx`` is longer than ``max_len`` and keeps no two consecutive
        supervised tokens (no anchor, so no loss) in its first ``max_len`` tokens."""

        idx = np.asarray(idx, dtype=np.int64)
        out = np.zeros(idx.size, dtype=bool)
        for k in np.flatnonzero(self.lengths[idx] > max_len):
            out[k] = anchor_candidates(self._locate(int(idx[k]))[1][:max_len]).size == 0
        return out

    def anchor_pairs(self, idx: np.ndarray, max_len: int) -> np.ndarray:
        """Positions with two consecutive supervised tokens (where an anchor may sit) in the
        first ``max_len`` tokens of each sample ``idx`` (int64)."""

        idx = np.asarray(idx, dtype=np.int64)
        return np.array([anchor_candidates(self._locate(i)[1][:max_len]).size
                         for i in idx.tolist()], dtype=np.int64)

    def fingerprint(self) -> str:
        """SHA-256 of every sample's token ids and length, in order (what target features
        depend on; the loss mask does not enter them).

        Example::

            >>> len(chats.fingerprint())                                 # doctest: +SKIP
            64
        """

        digest = hashlib.sha256(np.ascontiguousarray(self.lengths, dtype=np.int64).tobytes())
        for ids, off, _, _ in self._chunks:
            digest.update(np.ascontiguousarray(ids[off[0]:off[-1]], dtype=np.int64).tobytes())
        return digest.hexdigest()

    def sample(self, i: int) -> dict[str, np.ndarray]:
        """Sample ``i`` as the collators take it: ``input_ids``, ``labels`` (-100: not learned).

        Example::

            >>> chats.sample(0)["labels"][:4]                          # doctest: +SKIP
            array([-100, -100, -100, -100])
        """
        ids, mask = self._locate(int(i))
        ids = ids.astype(np.int64)
        return {"input_ids": ids, "labels": np.where(mask > 0, ids, IGNORE)}


def _shard_path(folder: Path, name: object) -> Path:
    """The shard ``name`` of ``prepare.json``: a plain file name that stays inside ``folder``.

    Example::

        >>> _shard_path(Path("prep"), "shard_00000.parquet").as_posix()
        'prep/shard_00000.parquet'
    """
    if (not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name
            or "\\" in name):
        raise DataError(f"--data {folder}: prepare.json names the shard {name!r}, which is not "
                        "a file name inside the folder; refused")
    path = folder / name
    if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
        raise DataError(f"--data {folder}: the shard {name} is a link to "
                        f"{path.resolve()}, outside the folder; refused")
    return path


def open_prepared(folder: str | Path) -> PreparedChats:
    """The prepared data set in ``folder``; a :class:`DataError` names what is missing or off."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    meta_path = folder / "prepare.json"
    if not meta_path.is_file():
        raise DataError(f"--data {folder}: no prepare.json there (not written by "
                        "`lengthwise dflash prepare`, or that run did not finish)")
    try:
        info = json.loads(meta_path.read_text(encoding="utf-8"))
        shards = [_shard_path(folder, name) for name in info["shards"]]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{meta_path}: not a prepare record ({exc})") from None
    chunks: list[tuple[Any, ...]] = []
    rows = 0
    for path in shards:
        if not path.is_file():
            raise DataError(f"--data {folder}: shard {path.name} named in prepare.json is missing")
        try:  # page checksums (written by prepare) are verified: a flipped byte is an error
            table = pq.read_table(path, columns=["input_ids", "loss_mask"], memory_map=True,
                                  page_checksum_verification=True)
            ids_col, mask_col = table.column("input_ids"), table.column("loss_mask")
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise DataError(f"--data {folder}: shard {path.name} is damaged or cut short "
                            f"({' '.join(str(exc).split())[:200]}); prepare the folder "
                            "again") from None
        for a, m in zip(ids_col.chunks, mask_col.chunks, strict=True):
            if len(a) == 0:
                continue
            # ``values`` is the whole child array; ``offsets`` (sliced or not) index into it
            chunks.append((a.values.to_numpy(zero_copy_only=False),
                           a.offsets.to_numpy(zero_copy_only=False),
                           m.values.to_numpy(zero_copy_only=False),
                           m.offsets.to_numpy(zero_copy_only=False)))
        rows += table.num_rows
    sizes = _sample_sizes(folder, chunks)
    lengths_path = folder / "lengths.npy"
    if not lengths_path.is_file():
        raise DataError(f"--data {folder}: lengths.npy is missing")
    try:
        lengths = np.load(lengths_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{lengths_path}: not an array of lengths ({exc}); prepare the "
                        "folder again") from None
    if lengths.ndim != 1 or lengths.size != rows:
        raise DataError(f"{lengths_path}: {lengths.size} lengths for {rows} samples in the "
                        "shards; prepare the folder again")
    lengths = np.asarray(lengths, dtype=np.int64)
    off = np.flatnonzero(lengths != sizes)
    if off.size:
        i = int(off[0])
        raise DataError(f"{lengths_path}: disagrees with the shards at {off.size} sample(s), "
                        f"the first sample {i} ({int(lengths[i])} in lengths.npy, "
                        f"{int(sizes[i])} tokens in the shards); prepare the folder again")
    return PreparedChats(folder, info, chunks, lengths)


def _sample_sizes(folder: Path, chunks: list[tuple[Any, ...]]) -> np.ndarray:
    """Every sample's token count from the shards' offsets (its loss mask must match)."""
    sizes = [np.diff(c[1]).astype(np.int64) for c in chunks]
    masks = [np.diff(c[3]).astype(np.int64) for c in chunks]
    ids = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    if masks and not np.array_equal(ids, np.concatenate(masks)):
        raise DataError(f"--data {folder}: a sample's loss_mask and input_ids differ in length "
                        "in the shards; prepare the folder again")
    return ids
