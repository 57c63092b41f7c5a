"""Load a script of ``benchmarks/`` as a module (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, executed as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script_fixtures(name: str) -> tuple[Any, Any]:
    """The module-scoped fixtures ``script`` (``benchmarks/<name>.py``) and ``saved`` (its
    committed ``SAVED`` JSON) of a test of that script: ``script, saved = script_fixtures(...)``."""
    @pytest.fixture(scope="module")
    def script() -> ModuleType:
        return load_script(name)

    @pytest.fixture(scope="module")
    def saved(script: ModuleType) -> dict:
        return json.loads(script.SAVED.read_text(encoding="utf-8"))

    return script, saved


def stale_regions(script: ModuleType, saved: dict) -> list[str]:
    """The marked regions of ``script.REGIONS`` whose text is not what ``script.render`` makes
    of ``saved`` (empty: every region is current)."""
    out = []
    for rel, names in script.REGIONS.items():
        text = (ROOT / rel).read_text(encoding="utf-8")
        for name in names:
            i, j = script.region_text(text, name, rel)
            if text[i:j] != "\n" + script.render(name, saved) + "\n":
                out.append(f"{rel}: region {name}")
    return out
