"""What ``torch.save`` raises when the disk fills under it: its zip writer's error, whose
context is the ``OSError`` (ENOSPC) of the file's write."""

from __future__ import annotations

import errno
from typing import Any


def zip_writer_full(handle: Any) -> None:
    """Write half a file to ``handle`` (an open file or a path), then fail as torch does."""
    if hasattr(handle, "write"):
        handle.write(b"PK half a file")
    else:
        handle.write_bytes(b"PK half a file")
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "  # noqa: B904
                           "704 vs 598")
