"""Every ``>>>`` example in the package runs, module by module, and in the packages the
benchmarks and tests share (``benchmarks/experiments``, ``benchmarks/simulated_logs``).

A module whose optional dependencies are missing is skipped with the reason.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import lengthwise

SRC = Path(lengthwise.__file__).resolve().parent
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _examples(package: Path) -> list[str]:
    """The modules of ``package`` whose source holds a ``>>>`` example."""
    names = []
    for path in sorted(package.rglob("*.py")):
        if "__main__" in path.name:
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if ">>>" in path.read_text():
            names.append(".".join(parts))
    return names


MODULES = [name for package in (SRC, BENCHMARKS / "experiments", BENCHMARKS / "simulated_logs")
           for name in _examples(package)]


def test_modules_with_examples_were_found():
    assert "lengthwise.planning.plan" in MODULES and len(MODULES) > 40
    assert "experiments.arms" in MODULES and "simulated_logs.runs" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional dependency is missing
        pytest.skip(f"{name} needs {exc.name}: {exc}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name, globs=dict(vars(module))) if t.examples]
    assert tests, f"{name} has '>>>' in its source but no example was found"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
