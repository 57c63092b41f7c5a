"""Load a script of ``benchmarks/`` as a module (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, executed as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
