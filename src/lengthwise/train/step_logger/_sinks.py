"""Forwarding of step records to TensorBoard and Weights & Biases.

A sink has ``record(rec)``, ``event(rec)``, ``flush()`` and ``close()``; the
background writer calls them. Both libraries are imported only when asked for.

Example::

    >>> numeric_items({"step": 3, "loss": 2, "skipped": False, "buckets": [0]})
    [('loss', 2.0), ('skipped', 0.0)]
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from lengthwise.errors import MissingDependencyError


def numeric_items(rec: dict[str, Any]) -> list[tuple[str, float]]:
    """The record's numeric fields as floats, without ``step``, ``time`` and ``event``."""
    skip = {"step", "time", "event"}
    return [(k, float(v)) for k, v in rec.items()
            if k not in skip and isinstance(v, numbers.Real)]


class TensorBoardSink:
    """Scalars ``train/<field>``, ``bucket_loss/<bucket>`` and ``event/<name>/<field>``."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                "tensorboard_dir needs torch and tensorboard: pip install torch tensorboard"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(logdir))

    def record(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        for key, value in numeric_items(rec):
            self.writer.add_scalar(f"train/{key}", value, step)
        for bucket, value in rec.get("bucket_loss", {}).items():
            self.writer.add_scalar(f"bucket_loss/{bucket}", value, step)

    def event(self, rec: dict[str, Any]) -> None:
        step = rec.get("step")
        if not isinstance(step, int):
            return
        for key, value in numeric_items(rec):
            self.writer.add_scalar(f"event/{rec['event']}/{key}", value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One ``wandb.log`` per step; reuses an existing ``wandb.run``, else starts (and ends) one."""

    def __init__(self, init_kwargs: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise MissingDependencyError(
                "wandb=True needs the wandb package: pip install wandb"
            ) from exc
        self.wandb = wandb
        self.owns_run = wandb.run is None
        if self.owns_run:
            wandb.init(**init_kwargs)

    def record(self, rec: dict[str, Any]) -> None:
        data = {f"train/{key}": value for key, value in numeric_items(rec)}
        data.update({f"bucket_loss/{b}": v for b, v in rec.get("bucket_loss", {}).items()})
        self.wandb.log(data, step=rec["step"])

    def event(self, rec: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.owns_run:
            self.wandb.finish()


def open_sinks(tensorboard_dir: str | os.PathLike | None,
               wandb: bool | dict[str, Any]) -> list[Any]:
    """The sinks asked for; if one fails to open, those already open are closed.

    Example::

        >>> open_sinks(None, False)
        []
    """
    sinks: list[Any] = []
    try:
        if tensorboard_dir is not None:
            sinks.append(TensorBoardSink(tensorboard_dir))
        if wandb:
            sinks.append(WandbSink(dict(wandb) if isinstance(wandb, dict) else {}))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
