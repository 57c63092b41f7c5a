"""The memory of a device: sizes as people write them, and whether a peak fits.

Example::

    >>> fits_line(3 * GIB, memory_size("8GiB"))
    'fits in 8.0 GiB (with 1.0 GiB for the CUDA context): +4.0 GiB to spare'
"""

from __future__ import annotations

import re

from lengthwise.errors import ConfigError

__all__ = ["DEVICE_MEMORY", "GIB", "fits_line", "memory_size"]

GIB = 2**30
#: memory of named devices as ``nvidia-smi`` reports it
DEVICE_MEMORY: dict[str, int] = {
    "h200": 143_771 * 2**20, "h100-80g": 81_559 * 2**20, "a100-80g": 81_920 * 2**20,
    "a100-40g": 40_960 * 2**20, "l40s": 46_068 * 2**20,
}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_size(text: str) -> int:
    """Bytes of a size such as ``141GiB``, ``80GB`` or ``h200`` (a :data:`DEVICE_MEMORY` name).

    >>> memory_size("141GiB") == 141 * 2**30, memory_size("80 GB"), memory_size("h200")
    (True, 80000000000, 150754820096)
    """
    name = str(text).strip().lower()
    if name in DEVICE_MEMORY:
        return DEVICE_MEMORY[name]
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", name)
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"device memory {text!r}: give a size such as 141GiB or 80GB, or one "
                          f"of {', '.join(DEVICE_MEMORY)}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def fits_line(peak: int, device_bytes: int, *, reserve: int = GIB) -> str:
    """Whether ``peak`` bytes fit ``device_bytes`` with ``reserve`` set aside (the CUDA
    context's; 0 on CPU), in one line.

    >>> fits_line(3 * GIB, 2 * GIB, reserve=0)
    'does NOT fit in 2.0 GiB: -1.0 GiB to spare'
    """
    left = device_bytes - reserve - peak
    verdict = "fits" if left >= 0 else "does NOT fit"
    context = f" (with {reserve / GIB:.1f} GiB for the CUDA context)" if reserve else ""
    return f"{verdict} in {device_bytes / GIB:.1f} GiB{context}: {left / GIB:+.1f} GiB to spare"
