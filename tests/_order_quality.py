"""What the tests of the two order experiments (``benchmarks/order_quality*.py``) check alike."""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import ModuleType


def check_promises(full: dict) -> None:
    """The committed full run has every order, at least five seeds, a wide length span and
    equal real tokens per run."""
    from lengthwise.demo.config import available_orders

    assert list(full["orders"]) == list(available_orders())
    assert len(full["config"]["seeds"]) >= 5
    assert full["data"]["length_span"] >= 30
    assert full["equal_tokens"]["spread"] <= 0.02


def drift_after(script: ModuleType, check: dict, change: Callable[[dict], None]) -> list[str]:
    """What ``script.compare`` reports of a copy of the committed ``check`` run once ``change``
    has altered its first run; the copy as it is, and with its training seconds doubled
    (machine-dependent, never compared), must first report nothing."""
    fresh = copy.deepcopy(check)
    assert script.compare(check, fresh) == []
    run = fresh["runs"][0]
    run["train_seconds"] *= 2
    assert script.compare(check, fresh) == []
    change(run)
    return script.compare(check, fresh)
