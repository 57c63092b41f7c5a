"""Test settings shared by every test folder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# the code the tests share with the benchmarks (simulated training logs, the order experiment)
# lives in benchmarks/, beside the scripts that import it
sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))

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
