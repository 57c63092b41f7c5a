"""The resident memory of this process: what it holds now, and large buffers given back on free.

:func:`resident_bytes` reads the process's resident set (Linux ``/proc/self/status``,
else the high-water mark of ``getrusage``); the stage estimates
(:mod:`~lengthwise.dflash.stage_memory`) take it as the process's own baseline
(Python, torch, transformers, the target's model code and tokenizer).

:func:`return_freed_memory` makes glibc's ``malloc`` serve every buffer of 64 KiB or
more from its own mapping, unmapped when freed. By default glibc raises that
threshold to the size of the last large buffer freed (up to 32 MiB), after which
torch's freed activations stay in the heap: a CPU training step on a 135M target
then held about 0.2 GiB more resident memory than it had live. The DFlash stages
call it on CPU, so the resident set follows the live tensors, as the estimate counts
them.

Example::

    >>> resident_bytes() > 0
    True
    >>> return_freed_memory() in (True, False)
    True
"""

from __future__ import annotations

import sys

__all__ = ["MMAP_THRESHOLD", "resident_bytes", "return_freed_memory"]

#: buffers of at least this many bytes get their own mapping, unmapped when freed
MMAP_THRESHOLD = 64 * 2**10
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def resident_bytes() -> int:
    """The resident set of this process now, in bytes (its high-water mark where not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def return_freed_memory() -> bool:
    """Serve large buffers from their own mappings (glibc); ``False`` where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
