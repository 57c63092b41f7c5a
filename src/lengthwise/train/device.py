"""Where a training process runs: its ``torchrun`` rank, its device and its autocast dtype.

Ranks come from :func:`lengthwise.pytorch.dist.group_info` once
:func:`setup_distributed` has joined the process group that ``torchrun``
describes in the environment (gloo on CPU, NCCL on CUDA); a single process is
rank 0 of 1.

Example::

    >>> rank_world(None)
    (0, 1)
    >>> autocast_dtype(None, "cpu") is None
    True
"""

from __future__ import annotations

import atexit
import os
import platform
import sys
from typing import Any

from lengthwise.errors import ConfigError
from lengthwise.pytorch.dist import GroupInfo, group_info

__all__ = ["autocast_dtype", "barrier", "configure_torch", "cpu_model", "is_main", "leave_group",
           "pick_device", "rank_world", "say", "setup_distributed"]


_JOINED: list[bool] = []  # one entry once setup_distributed has made the group


def setup_distributed(device: str = "cpu") -> GroupInfo | None:
    """Join the ``torchrun`` process group when the environment names one; the group or ``None``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch
        import torch.distributed as tdist

        if not tdist.is_initialized():
            backend = "nccl" if device.startswith("cuda") else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            tdist.init_process_group(backend=backend)
            _JOINED.append(True)
            atexit.register(leave_group)  # at exit: leave at once (wait=False)
    return group_info()


def leave_group(wait: bool = False) -> None:
    """Leave the process group that :func:`setup_distributed` made (no-op without one).

    ``wait=True`` is for the end of a successful command: every rank waits at a
    barrier first, so that none tears its side down while a peer is still at work
    (rank 0 writes the summary after the others are done). After an error the
    ranks are not in step, so the default leaves at once. The group is destroyed
    while the interpreter is whole: a gloo group left to interpreter shutdown can
    abort the process (its worker threads still hold tensors whose release needs
    the GIL).
    """
    if not _JOINED:  # a group the caller made is the caller's to leave
        return
    import torch.distributed as tdist

    if tdist.is_initialized():
        if wait:
            tdist.barrier()
        tdist.destroy_process_group()
    _JOINED.clear()


def rank_world(info: GroupInfo | None) -> tuple[int, int]:
    """``(rank, world_size)`` of a group, ``(0, 1)`` without one."""
    return (0, 1) if info is None else (info.rank, info.world_size)


def say(info: GroupInfo | None, text: str) -> None:
    """Print a progress line to stderr on rank 0 only.

    Example::

        >>> say(None, "lengthwise: starting")  # prints to stderr
    """
    if rank_world(info)[0] == 0:
        print(text, file=sys.stderr, flush=True)


def is_main(info: GroupInfo | None = None) -> bool:
    """Whether this process is rank 0 (of the given group, else of the current one)."""
    return rank_world(info if info is not None else group_info())[0] == 0


def barrier(info: GroupInfo | None) -> None:
    """Wait for every rank (no-op in a single process)."""
    if info is not None and info.world_size > 1:
        info.dist.barrier()


def pick_device(device: str, info: GroupInfo | None = None) -> Any:
    """The ``torch.device`` for ``device`` (``cuda`` means this rank's local GPU)."""
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: torch sees no CUDA device here")
        if device == "cuda" or (info is not None and info.world_size > 1):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            return torch.device("cuda", local)
    return torch.device(device)


def autocast_dtype(name: str | None, device: Any) -> Any:
    """The autocast dtype for ``name`` (``None``: bf16 on CUDA, none on CPU)."""
    import torch

    kind = device if isinstance(device, str) else device.type
    name = name or ("bf16" if str(kind).startswith("cuda") else None)
    if name in (None, "fp32", "float32"):
        return None
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16}
    if name not in table:
        raise ConfigError(f"dtype must be one of fp32, bf16, fp16, got {name!r}")
    return table[name]


def configure_torch(device: Any, *, threads: int | None, deterministic: bool) -> None:
    """Intra-op threads and deterministic kernels for a CPU run (no-op on other devices)."""
    import torch

    if getattr(device, "type", device) != "cpu":
        return
    if threads is not None:
        torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def cpu_model() -> str:
    """This machine's CPU as the system names it (``/proc/cpuinfo``'s model name on Linux).

    Example::

        >>> isinstance(cpu_model(), str)
        True
    """

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh
                         if line.startswith("model name")), name)
    except OSError:
        return name
