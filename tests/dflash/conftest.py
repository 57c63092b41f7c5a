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


@pytest.fixture(scope="module")
def tiny_prepared(tmp_path_factory):
    """``(target folder, prepared folder)``: a tiny chat target and 40 chats prepared for it."""
    from _chat_tiny import conversations, save_target, write_jsonl

    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    root = tmp_path_factory.mktemp("dflash_prepared")
    target = save_target(root / "target")
    chats = write_jsonl(root / "chats.jsonl", conversations(40))
    prepare_chats(chats, target, root / "prepared",
                  PrepareConfig(min_supervised=16, shard_rows=16, progress=False))
    return target, root / "prepared"

