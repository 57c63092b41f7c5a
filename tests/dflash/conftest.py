"""Fixtures of the DFlash tests."""

from __future__ import annotations

import pytest
from _dflash_tiny import tiny_draft, tiny_target


@pytest.fixture
def pair():
    target = tiny_target()
    return target, tiny_draft(target)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
