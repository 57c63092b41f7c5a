"""The resident memory of a process: what it holds now, its peak, and large buffers given back.

:func:`process_baseline` is a stage's baseline in the CPU estimates
(:mod:`~lengthwise.dflash.cost.memory`). :func:`return_freed_memory` makes glibc serve every
buffer of 64 KiB or more from its own mapping, unmapped when freed (glibc raises that
threshold up to 32 MiB, after which torch's freed activations stay resident), so that a
stage's resident set follows its live tensors as the estimate counts them.
:func:`command_peak` reads the peak resident memory of a command's own process.

Example::

    >>> resident_bytes() > 0
    True
    >>> return_freed_memory() in (True, False)
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MMAP_THRESHOLD", "command_peak", "follow_live_tensors", "process_baseline",
           "resident_bytes", "return_freed_memory"]

#: the modules each stage's process imports (its baseline on CPU)
_IMPORTS = {"train": ("lengthwise.dflash.recipe", "pyarrow.parquet"),
            "regenerate": ("lengthwise.dflash.prepare", "lengthwise.dflash.regenerate",
                           "pyarrow.parquet"),
            "eval": ("lengthwise.dflash.evaluate", "lengthwise.dflash.speculative",
                     "lengthwise.dflash.lookup"),
            "features": ("lengthwise.dflash.features", "lengthwise.dflash.prepared")}
#: buffers of at least this many bytes get their own mapping, unmapped when freed
MMAP_THRESHOLD = 64 * 2**10
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter

#: ``python -c _STARTER OUT ARGV...``: runs ARGV as its child, writes the child's own
#: ``ru_maxrss`` to OUT and exits with the child's exit code
_STARTER = """import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w", encoding="ascii") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


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


def process_baseline(stage: str, target_config: Any, tokenizer_dir: str | Path | None = None,
                     ) -> int:
    """Resident bytes of this process after importing what ``stage`` imports, the target's
    model code, and its tokenizer from ``tokenizer_dir``: the stage's before any weights."""

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    for name in _IMPORTS[stage]:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    MODEL_FOR_CAUSAL_LM_MAPPING[type(target_config)]  # imports the model's module
    if tokenizer_dir is not None:
        transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return resident_bytes()


def return_freed_memory() -> bool:
    """Serve large buffers from their own mappings (glibc); ``False`` where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False


def follow_live_tensors(device: object) -> bool:
    """On CPU, :func:`return_freed_memory`; on another device nothing. Whether it is set.

        >>> follow_live_tensors("cuda:0")
        False
    """
    return str(device).split(":")[0] == "cpu" and return_freed_memory()


def command_peak(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 stdout: int | None = subprocess.DEVNULL,
                 stderr: int | None = None) -> tuple[int, int]:
    """``(exit code, peak resident bytes)`` of ``argv`` in a process of its own, started from a
    small Python process (Linux carries a parent's high-water mark across ``execve``).

        >>> code, peak = command_peak([sys.executable, "-c", "pass"])
        >>> code, 0 < peak < 2**30
        (0, True)
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peak")
        proc = subprocess.run([sys.executable, "-c", _STARTER, out, *argv],
                              env=None if env is None else dict(env), stdout=stdout,
                              stderr=stderr, check=False)
        if not os.path.exists(out):  # the starter itself failed
            raise RuntimeError(f"could not start {argv[0]!r}: exit {proc.returncode}")
        with open(out, encoding="ascii") as fh:
            peak = int(fh.read())
    return proc.returncode, peak * (1 if sys.platform == "darwin" else 1024)
