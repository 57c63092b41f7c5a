"""Old module paths kept importable: ``import lengthwise.sampler`` still works, with a warning.

The modules moved into the ``planning``, ``pytorch``, ``hf`` and ``train`` sub-packages; an
import of an old path returns the module at its new path (the same object) and
emits a :class:`DeprecationWarning` naming the new one.

Example::

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     import lengthwise.edges as old
    >>> import lengthwise.planning.edges as new
    >>> old is new
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module path -> new module path
MOVED: dict[str, str] = {
    "lengthwise.batching": "lengthwise.planning.batching",
    "lengthwise.orders": "lengthwise.planning.orders",
    "lengthwise.edges": "lengthwise.planning.edges",
    "lengthwise.cost": "lengthwise.planning.cost",
    "lengthwise.lengths": "lengthwise.planning.lengths",
    "lengthwise.metrics": "lengthwise.planning.metrics",
    "lengthwise.jsonl": "lengthwise.planning.jsonl",
    "lengthwise.plan": "lengthwise.planning.plan",
    "lengthwise.pack": "lengthwise.planning.packed",
    "lengthwise.pack.schedule": "lengthwise.planning.packed.balance",
    "lengthwise.pack.packed_plan": "lengthwise.planning.packed.plan",
    "lengthwise.sampler": "lengthwise.pytorch.sampler",
    "lengthwise.collate": "lengthwise.pytorch.collate",
    "lengthwise.collate.pad": "lengthwise.pytorch.collate.padded",
    "lengthwise.collate.pack": "lengthwise.pytorch.collate.packed",
    "lengthwise.collate._rows": "lengthwise.pytorch.collate._packed_rows",
    "lengthwise.calibrate": "lengthwise.pytorch.calibrate",
    "lengthwise.train._dist": "lengthwise.pytorch.dist",
    "lengthwise.hf_lengths": "lengthwise.hf.lengths",
    "lengthwise.hf_trainer": "lengthwise.hf.trainer",
    "lengthwise.demo.loop": "lengthwise.train.loop",
    "lengthwise.demo.schedule": "lengthwise.train.schedule",
    "lengthwise.demo.device": "lengthwise.train.device",
}


def new_path(old: str) -> str | None:
    """Where the module ``old`` lives now (``None``: it did not move).

    Example::

        >>> new_path("lengthwise.pack._lanes"), new_path("lengthwise.doctor")
        ('lengthwise.planning.packed._lanes', None)
    """
    if old in MOVED:
        return MOVED[old]
    package, _, name = old.rpartition(".")
    if package in MOVED and hasattr(importlib.import_module(MOVED[package]), "__path__"):
        return f"{MOVED[package]}.{name}"
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already imported module, keeping its own ``__spec__``."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolve an old module path to the module at its new path."""

    def find_spec(self, fullname: str, path=None, target=None):
        if not fullname.startswith("lengthwise."):
            return None
        new = new_path(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; import it from there",
                      DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module),
                                              is_package=hasattr(module, "__path__"))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        # first, so that an old path never loads a second copy of a moved module
        sys.meta_path.insert(0, MovedModuleFinder())
