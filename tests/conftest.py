"""Test settings shared by every test folder."""

import os
import subprocess

import pytest
from hypothesis import settings

# CI runs each property test on the same examples every time (a failure there is reproducible
# from its log); a local run explores fresh examples on each run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (skipped where this process may not mount one)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
