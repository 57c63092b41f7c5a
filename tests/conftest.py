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
# the tiny DFlash targets and chats, for the DFlash tests and the tests of the DFlash benchmarks
sys.path.append(str(Path(__file__).resolve().parent / "dflash"))

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


@pytest.fixture
def plan_keywords():
    """``check(build, who, **options)`` for an entry point that takes a PlanConfig or its
    fields as keywords: ``build(config, **keywords)`` returns what it planned (its batches).

    The keyword form plans as the PlanConfig does; both together, and an unknown keyword
    (named with the nearest option), raise a one-line ConfigError naming ``who``.
    """
    from lengthwise.errors import ConfigError
    from lengthwise.planning.config import PlanConfig

    def check(build, who, **options):
        assert build(None, **options) == build(PlanConfig(**options))
        with pytest.raises(ConfigError, match=rf"^{who}\(\) got a PlanConfig and the plan "
                                              r"options max_len, order as keywords: give one "
                                              r"or the other$"):
            build(PlanConfig(**options), order="sorted", max_len=4)
        with pytest.raises(ConfigError, match=rf"^{who}\(\) got an unknown option 'max_token'; "
                                              r"did you mean 'max_tokens'\?$"):
            build(None, max_token=64)
        with pytest.raises(ConfigError, match=rf"^{who}\(\) needs a plan: a PlanConfig, or its "
                                              r"options as keywords \(max_tokens=\.\.\., "):
            build(None)

    return check


@pytest.fixture(scope="module")
def tiny_prepared(tmp_path_factory):
    """``(target folder, prepared folder)``: a tiny chat target and 40 chats prepared for it."""
    from _chat_tiny import prepared_chats

    return prepared_chats(tmp_path_factory.mktemp("dflash_prepared"))
