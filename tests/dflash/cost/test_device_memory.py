"""A device's memory as people write it."""

from __future__ import annotations

import pytest

from lengthwise.dflash.cost.device_memory import DEVICE_MEMORY, fits_line, memory_size
from lengthwise.errors import ConfigError


def test_memory_size_reads_sizes_and_device_names():
    assert memory_size("141GiB") == 141 * 2**30
    assert memory_size("80 GB") == 80 * 10**9
    assert memory_size("1.5TiB") == int(1.5 * 2**40)
    assert memory_size("H200") == DEVICE_MEMORY["h200"]
    for bad in ("", "12zz", "-3GiB", "0GB", "h300"):
        with pytest.raises(ConfigError, match="device memory"):
            memory_size(bad)


def test_the_fit_line_sets_the_reserve_aside():
    assert fits_line(3 * 2**30, 4 * 2**30).startswith("fits in 4.0 GiB (with 1.0 GiB")
    assert fits_line(3 * 2**30, 4 * 2**30, reserve=2**31).startswith("does NOT fit")
