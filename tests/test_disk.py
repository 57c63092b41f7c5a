"""A full disk or too large a file, recognised whichever library raised it (lengthwise.disk)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lengthwise.cli import is_user_error
from lengthwise.disk import full_disk_error, full_disk_reason, reporting_full_disk
from lengthwise.errors import DiskFullError


class SafetensorError(Exception):
    """Stands for safetensors' own error type: no errno, only its text."""


def _chained(outer: str, inner: OSError) -> RuntimeError:
    """``outer`` raised while handling ``inner``, as torch's zip writer does."""
    try:
        try:
            raise inner
        except OSError:
            raise RuntimeError(outer)  # noqa: B904 - the implicit context is the point
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize("exc, word", [
    (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
    (OSError(errno.EFBIG, "File too large"), "file size"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "quota"),
    (SafetensorError("Error while serializing: I/O error: No space left on device "
                     "(os error 28)"), "no space"),
    (SafetensorError("Error while serializing: I/O error: File too large (os error 27)"),
     "file size"),
    (_chained("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598",
              OSError(errno.ENOSPC, "No space left on device")), "no space"),
])
def test_each_library_s_full_disk_is_recognised(exc, word):
    assert word in full_disk_reason(exc)


def test_the_error_names_the_folder_the_size_and_what_is_free(tmp_path):
    error = full_disk_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path,
                            needed=3 * 2**20, what="saving the target")
    text = str(error)
    assert isinstance(error, DiskFullError) and isinstance(error, OSError)
    assert text.startswith(f"saving the target into {tmp_path} failed: the disk is full")
    assert "it needs about 3.0 MiB" in text and "free there now" in text
    assert "\n" not in text and is_user_error(error)


@given(st.text(max_size=60).filter(lambda t: not any(
    w in t.lower() for w in ("space", "os error", "too large", "quota"))))
def test_other_errors_are_not_called_a_full_disk(text):
    assert full_disk_reason(ValueError(text)) is None
    assert full_disk_reason(OSError(errno.EACCES, text)) is None


def test_a_bug_inside_the_block_keeps_its_type_and_traceback(tmp_path):
    with pytest.raises(KeyError), reporting_full_disk(tmp_path):
        raise KeyError("a bug")


def test_a_full_disk_inside_the_block_becomes_one_line(tmp_path):
    with pytest.raises(DiskFullError, match="writing into .* failed: the disk is full") as info:
        with reporting_full_disk(tmp_path / "sub"):
            raise SafetensorError("I/O error: No space left on device (os error 28)")
    assert isinstance(info.value.__cause__, SafetensorError)


def test_a_real_full_disk_is_recognised(small_disk: Path):
    with pytest.raises(DiskFullError, match="the disk is full") as info:
        with reporting_full_disk(small_disk, needed=1 << 20), \
                open(small_disk / "big", "wb") as handle:
            handle.write(b"\0" * (1 << 20))
            handle.flush()
    assert "it needs about 1.0 MiB" in str(info.value)
