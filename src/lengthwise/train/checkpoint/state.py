"""What a checkpoint captures besides the tensors: RNG states, scheduler, sampler, step, extra.

Example::

    >>> import torch
    >>> from lengthwise.train.checkpoint.state_json import from_json
    >>> saved = TrainingState(3, torch.nn.Linear(1, 1), extra={"note": "hi"})
    >>> saved.contents(), from_json(saved.aux(param_groups_only=False))["extra"]
    (['model'], {'note': 'hi'})
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lengthwise.train.checkpoint.state_json import to_json


def rng_state() -> dict[str, Any]:
    """The RNG states of Python, NumPy, torch and (when initialised) CUDA.

    Example::

        >>> sorted(rng_state())[:3]
        ['numpy', 'python', 'torch']
    """
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore RNG states taken by :func:`rng_state` (CUDA ones only for devices present).

    Example::

        >>> saved = rng_state(); a = random.random(); set_rng_state(saved)
        >>> random.random() == a
        True
    """
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        for device, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)


def cpu_copy(obj: Any) -> Any:
    """Deep copy with every tensor copied to CPU memory (the training loop may go on).

    Example::

        >>> t = torch.zeros(2); c = cpu_copy({"t": [t]}); t += 1
        >>> c["t"][0].tolist()
        [0.0, 0.0]
    """
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
    """Raise ``TypeError`` unless ``obj`` is ``None`` or has ``state_dict``/``load_state_dict``.

    Example::

        >>> check_stateful("sampler", None)
    """
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
        naming it (see :mod:`~lengthwise.train.checkpoint.state_json`).
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
