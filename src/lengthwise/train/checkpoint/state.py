"""What a checkpoint captures besides the tensors (RNG states, scheduler, sampler, step,
extra), and that state as JSON text.

A checkpoint keeps its step, ``extra``, RNG, scheduler and sampler states as JSON,
so reading it back builds plain data and never runs code. JSON's own types (dicts
with string keys, lists, strings, numbers, booleans, ``None``) are written as they
are; a few more are tagged objects (``{"__lw__": kind, ...}``): tuples, dicts with
other keys, tensors and NumPy arrays (dtype, shape and the numbers as a list; RNG
states are such lists of ints) and NumPy scalars. Anything else cannot be saved:
:func:`to_json` raises :class:`~lengthwise.errors.ConfigError` naming its place.

Example::

    >>> import torch
    >>> saved = TrainingState(3, torch.nn.Linear(1, 1), extra={"note": "hi"})
    >>> saved.contents(), from_json(saved.aux(param_groups_only=False))["extra"]
    (['model'], {'note': 'hi'})
    >>> state = {"seed": 3, "rng": (1, [2, 3]), "t": torch.tensor([1, 2], dtype=torch.uint8)}
    >>> back = from_json(to_json(state))
    >>> back["rng"], back["t"].dtype, back["t"].tolist()
    ((1, [2, 3]), torch.uint8, [1, 2])
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lengthwise.errors import ConfigError

__all__ = ["from_json", "to_json"]


TAG = "__lw__"
_NUMPY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: no Python objects


def _encode(obj: Any, where: str) -> Any:
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, np.ndarray | np.generic):
        return _encode_numpy(obj, where)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return _float(float(obj))
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu")
        if t.is_complex() or t.is_quantized or t.is_sparse or t.dtype not in _TORCH_DTYPES:
            raise ConfigError(f"{where or 'the state'}: a {t.dtype} tensor cannot be saved in a "
                              "checkpoint's state")
        data = t.to(torch.float64 if t.is_floating_point() else t.dtype).reshape(-1).tolist()
        return {TAG: "tensor", "dtype": _TORCH_DTYPES[t.dtype], "shape": list(t.shape),
                "data": [_float(v) for v in data] if t.is_floating_point() else data}
    if isinstance(obj, tuple):
        return {TAG: "tuple", "items": [_encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        parts = [(k, _encode(v, f"{where}[{k!r}]" if where else str(k))) for k, v in obj.items()]
        if all(isinstance(k, str) for k, _ in parts) and TAG not in obj:
            return dict(parts)
        return {TAG: "dict", "items": [[_encode(k, f"{where} key {k!r}"), v] for k, v in parts]}
    raise ConfigError(f"{where or 'the state'} cannot be saved in a checkpoint: a "
                      f"{type(obj).__name__} is not plain data (checkpoints keep JSON: numbers, "
                      "strings, lists, tuples, dicts, tensors and NumPy arrays)")


def _encode_numpy(obj: np.ndarray | np.generic, where: str) -> dict[str, Any]:
    if obj.dtype.kind not in _NUMPY_KINDS or obj.dtype.fields is not None:
        raise ConfigError(f"{where or 'the state'}: a NumPy {obj.dtype} value cannot be "
                          "saved in a checkpoint's state")
    values = np.asarray(obj).reshape(-1).tolist()
    if obj.dtype.kind == "c":
        values = [[_float(v.real), _float(v.imag)] for v in values]
    elif obj.dtype.kind == "f":
        values = [_float(v) for v in values]
    kind = "ndarray" if isinstance(obj, np.ndarray) else "numpy"
    return {TAG: kind, "dtype": obj.dtype.str, "shape": list(obj.shape), "data": values}


def _float(v: float) -> Any:
    """A float as JSON writes it; non-finite ones as strings, so the text stays standard JSON."""
    return v if math.isfinite(v) else {TAG: "float", "value": repr(v)}


_TORCH_DTYPES = {getattr(torch, name): name for name in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64")}
_TORCH_BY_NAME = {name: dtype for dtype, name in _TORCH_DTYPES.items()}


def to_json(state: Any) -> str:
    """``state`` as JSON text; :class:`ConfigError` names a part that is not plain data."""
    return json.dumps(_encode(state, ""), allow_nan=False)


def _number(v: Any, kind: str = "f") -> Any:
    """One value of an array of ``kind`` ("b", "i"/"u" or "f"), checked."""
    if kind == "b":
        if not isinstance(v, bool):
            raise ValueError(f"{v!r} is not a boolean")
        return v
    if isinstance(v, float) and kind == "f":
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind == "f" and isinstance(v, dict) and v.get("value") in ("inf", "-inf", "nan"):
        return float(v["value"])
    raise ValueError(f"{v!r} is not a number of kind {kind!r}")


def _numbers(data: Any, shape: Any, kind: str) -> list[Any]:
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"bad shape {shape!r}")
    if not isinstance(data, list) or len(data) != math.prod(shape):
        raise ValueError(f"{len(data) if isinstance(data, list) else data!r} values for shape "
                         f"{shape}")
    if kind == "c":
        return [complex(_number(p[0]), _number(p[1])) for p in data]
    return [_number(v, "i" if kind == "u" else kind) for v in data]


def _decode(obj: Any) -> Any:
    kind = obj.get(TAG)
    if kind is None:
        return obj
    if kind == "tuple":
        return tuple(obj["items"])
    if kind == "dict":
        return {_hashable(k): v for k, v in obj["items"]}
    if kind == "float":
        return _number(obj, "f")
    if kind == "tensor":
        dtype = _TORCH_BY_NAME[obj["dtype"]]
        kind = ("f" if dtype.is_floating_point else "b" if dtype == torch.bool else "i")
        values = _numbers(obj["data"], obj["shape"], kind)
        return torch.tensor(values, dtype=dtype).reshape(obj["shape"])
    if kind in ("ndarray", "numpy"):
        dtype = np.dtype(str(obj["dtype"]))
        if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or dtype.subdtype:
            raise ValueError(f"NumPy dtype {obj['dtype']!r} is not a number type")
        array = np.array(_numbers(obj["data"], obj["shape"], dtype.kind),
                         dtype=dtype).reshape(obj["shape"])
        return array if kind == "ndarray" else array[()]
    raise ValueError(f"unknown tagged value {kind!r}")


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    return key


def from_json(text: str) -> Any:
    """The state :func:`to_json` wrote; ``ValueError`` (or ``KeyError``) for damaged text.

    Only plain data, tensors and NumPy arrays are built; nothing is imported or run.
    """
    return json.loads(text, object_hook=_decode)


def rng_state() -> dict[str, Any]:
    """The RNG states of Python, NumPy, torch and (when initialised) CUDA."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore RNG states taken by :func:`rng_state` (CUDA ones only for devices present)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        for device, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)


def cpu_copy(obj: Any) -> Any:
    """Deep copy with every tensor copied to CPU memory (the training loop may go on)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, cpu_copy(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(cpu_copy(v) for v in obj)
    return obj


def state_bytes(obj: Any) -> int:
    """Bytes of the distinct tensor storages and the text in ``obj`` (nested containers).

    About what saving ``obj`` takes on the disk.

    Example::

        >>> t = torch.zeros(4)
        >>> state_bytes({"a": t, "b": [t, torch.zeros(2, dtype=torch.float64)], "c": "ab"})
        34
    """
    seen: dict[int, int] = {}
    text = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, str | bytes):
            text += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return sum(seen.values()) + text


def check_stateful(name: str, obj: Any) -> None:
    """Raise ``TypeError`` unless ``obj`` is ``None`` or has ``state_dict``/``load_state_dict``."""
    if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
        raise TypeError(f"{name} must have state_dict() and load_state_dict(), got {type(obj)}")


@dataclass(frozen=True)
class TrainingState:
    """The objects one checkpoint saves: the step, the model and the optional stateful ones."""

    step: int
    model: torch.nn.Module
    optimizer: Any = None
    scheduler: Any = None
    sampler: Any = None
    extra: Any = None

    def contents(self) -> list[str]:
        """Names of what is saved, as listed in the manifest."""
        return ["model"] + [name for name, obj in (("optimizer", self.optimizer),
                                                   ("scheduler", self.scheduler),
                                                   ("sampler", self.sampler))
                            if obj is not None]

    def aux(self, *, param_groups_only: bool) -> str:
        """Everything but the model's and optimizer's tensors, as JSON text.

        Step, extra, RNG, scheduler and sampler states; with ``param_groups_only``
        also the optimizer's hyper-parameters (for an optimizer that has no state yet).
        A part that is not plain data raises :class:`~lengthwise.errors.ConfigError`
        naming it (see :mod:`~lengthwise.train.checkpoint.state`).
        """
        aux = {
            "step": self.step,
            "extra": self.extra,
            "rng": rng_state(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "sampler": None if self.sampler is None else self.sampler.state_dict(),
            "optimizer_param_groups": (
                self.optimizer.state_dict()["param_groups"] if param_groups_only else None
            ),
        }
        return to_json(aux)
