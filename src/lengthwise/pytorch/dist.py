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

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


def all_reduce_sum(values: np.ndarray, info: GroupInfo) -> np.ndarray:
    """Sum a float64 array over the ranks of ``info``'s group (every rank must call this).

    The reduction runs on :meth:`GroupInfo.device`; the result comes back as a NumPy array.
    """
    import torch

    tensor = torch.from_numpy(values).to(info.device())
    info.dist.all_reduce(tensor, op=info.dist.ReduceOp.SUM, group=info.group)
    return tensor.cpu().numpy()
