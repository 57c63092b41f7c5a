"""Detect an initialised ``torch.distributed`` group without importing torch, and sum over it.

If torch has not been imported, no process group can exist, so these helpers
look in ``sys.modules`` instead of importing it; code that never touches torch
stays free of it.

Example::

    >>> from lengthwise.pytorch.dist import group_info
    >>> group_info() is None or group_info().world_size >= 1
    True
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lengthwise.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class GroupInfo:
    """An initialised process group: the ``torch.distributed`` module, group, rank and size."""

    dist: Any
    group: Any
    rank: int
    world_size: int

    def device(self) -> Any:
        """Device for small collective tensors: CPU when the group has a CPU backend, else CUDA."""
        import torch

        backend = str(self.dist.get_backend(self.group)).lower()
        if "gloo" in backend or "mpi" in backend or "cpu:" in backend or "nccl" not in backend:
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())


def group_info(process_group: Any = None) -> GroupInfo | None:
    """Return the active process group, or ``None`` when torch.distributed is not initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    rank = dist.get_rank(process_group)
    world_size = dist.get_world_size(process_group)
    return GroupInfo(dist=dist, group=process_group, rank=rank, world_size=world_size)


def launched_world() -> tuple[int, str] | None:
    """How many processes this one runs among, and what says so; ``None`` for one process.

    The initialised ``torch.distributed`` group answers first, then the launcher's
    ``WORLD_SIZE`` (set by ``torchrun``, ``accelerate launch``, Lightning and others before
    any process group exists), then ``LOCAL_WORLD_SIZE`` where ``WORLD_SIZE`` is not set.
    A value that is not a count of processes is a :class:`ConfigError` naming it.

    Example::

        >>> import os
        >>> os.environ["WORLD_SIZE"] = "2"
        >>> launched_world()
        (2, 'WORLD_SIZE=2')
        >>> del os.environ["WORLD_SIZE"]
    """
    group = group_info()
    if group is not None:
        return (group.world_size, "the initialised torch.distributed group") \
            if group.world_size > 1 else None
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise ConfigError(f"{name}={os.environ[name]!r} is not a count of processes (a "
                              "launcher sets it to one: unset it to run a single process)")
        return (int(raw), f"{name}={raw}") if int(raw) > 1 else None
    return None


def launched_rank() -> tuple[int, str] | None:
    """This process's rank among the launched processes, and what says so; ``None`` if unknown.

    The initialised ``torch.distributed`` group answers first, then ``RANK`` (with
    ``WORLD_SIZE``) or ``LOCAL_RANK`` (with ``LOCAL_WORLD_SIZE`` alone), as
    :func:`launched_world` reads the number of processes.

    Example::

        >>> import os
        >>> os.environ.update(WORLD_SIZE="2", RANK="1")
        >>> launched_rank()
        (1, 'RANK=1')
        >>> del os.environ["WORLD_SIZE"], os.environ["RANK"]
    """
    group = group_info()
    if group is not None:
        return group.rank, "the initialised torch.distributed group"
    world = launched_world()
    if world is None:
        return None
    name = "RANK" if world[1].startswith("WORLD_SIZE") else "LOCAL_RANK"
    raw = os.environ.get(name, "").strip()
    return (int(raw), f"{name}={raw}") if raw.isdigit() else None


def check_replicas(num_replicas: int, what: str = "the sampler", rank: int | None = None,
                   ) -> None:
    """Raise if ``num_replicas`` is not the number of processes this one runs among, or
    ``rank`` is not this process's rank among them.

    A sampler built before ``init_process_group`` (or with ``num_replicas=1``) under a
    launcher of 2 processes plans the whole epoch on each: every sample twice. Two
    processes given the same ``rank`` both train that rank's share, and the other's
    samples are never trained. Pass ``check_world_size=False`` to the sampler where
    ranks share batches on purpose (tensor or context parallel groups), so fewer
    data-parallel ranks than processes.

    Example::

        >>> import os
        >>> os.environ["WORLD_SIZE"] = "2"
        >>> check_replicas(1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: the sampler plans for num_replicas=1, but WORLD_SIZE=2 ...
        >>> del os.environ["WORLD_SIZE"]
    """
    world = launched_world()
    if world is None:
        return
    size, source = world
    if size != num_replicas:
        raise ConfigError(
            f"{what} plans for num_replicas={num_replicas}, but {source} says this process is "
            f"one of {size}: the processes would not split the epoch (samples trained more than "
            f"once, or not at all). Build the sampler after torch.distributed.init_process_group, "
            f"or pass num_replicas={size} and this process's rank (with Accelerate on CPU: "
            "Accelerator(cpu=True)); pass check_world_size=False if ranks share batches on "
            "purpose (tensor or context parallel)")
    mine = launched_rank()
    if rank is None or mine is None or mine[0] == rank:
        return
    raise ConfigError(
        f"{what} was given rank={rank}, but {mine[1]} says this process is rank {mine[0]} "
        f"of {size}: two processes with one rank train the same samples and leave another "
        f"rank's untrained. Leave rank unset (it defaults to the process group's) or pass "
        f"this process's rank; pass check_world_size=False if the rank is a data-parallel "
        "rank of another group on purpose")


def all_reduce_sum(values: np.ndarray, info: GroupInfo) -> np.ndarray:
    """Sum a float64 array over the ranks of ``info``'s group (every rank must call this).

    The reduction runs on :meth:`GroupInfo.device`; the result comes back as a NumPy array.
    """
    import torch

    tensor = torch.from_numpy(values).to(info.device())
    info.dist.all_reduce(tensor, op=info.dist.ReduceOp.SUM, group=info.group)
    return tensor.cpu().numpy()
