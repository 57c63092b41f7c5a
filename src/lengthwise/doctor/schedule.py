"""The logged learning rate against the configured one: its peak and the end of its warm-up.

The configuration is read from a ``training_args.json``/config file beside the
log (:func:`~lengthwise.doctor.run_config.setting_beside`): the peak rate
(``learning_rate``, ``lr``) and the warm-up (``warmup_steps``, else
``warmup_ratio`` times ``max_steps``). The logged peak is the highest logged
rate; it disagrees when it differs by more than :data:`PEAK_TOLERANCE` of the
configured one. The logged warm-up ends at the first row whose rate reaches
:data:`WARM_SHARE` of the peak (none when the first row already does); it
disagrees when it is further than :data:`WARM_TOLERANCE` of the configured
warm-up, and at least two logging intervals, from it. The decay is not checked.

Example::

    >>> import numpy as np
    >>> s = np.arange(1.0, 1001.0)
    >>> lr = 1e-4 * np.minimum(1.0, s / 100)
    >>> check_schedule(s, lr, {"peak": 2e-4, "warmup_steps": 100},
    ...                "training_args.json").mismatches
    ['the learning rate peaks at 0.0001, the configuration says 0.0002']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.numbers import num, significant

__all__ = ["Schedule", "check_schedule", "SCHEDULE_KEYS"]

#: the logged peak may differ from the configured rate by this share
PEAK_TOLERANCE = 0.02
#: the warm-up ends where the rate first reaches this share of the peak
WARM_SHARE = 0.98
#: the logged warm-up may differ from the configured one by this share
WARM_TOLERANCE = 0.1
#: the configuration keys read, each with its aliases
SCHEDULE_KEYS: dict[str, tuple[str, ...]] = {
    "peak": ("learning_rate", "lr"),
    "warmup_steps": ("warmup_steps", "num_warmup_steps"),
    "warmup_ratio": ("warmup_ratio",),
    "max_steps": ("max_steps", "total_steps"),
}


@dataclass(frozen=True)
class Schedule:
    """The configured and logged peak rate and warm-up, and what disagrees."""

    source: str | None = None
    peak: float | None = None
    logged_peak: float | None = None
    warmup: float | None = None
    logged_warmup: float | None = None
    mismatches: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``schedule`` key of the report)."""
        return {"source": self.source, "peak": significant(self.peak),
                "logged_peak": significant(self.logged_peak), "warmup": num(self.warmup),
                "logged_warmup": num(self.logged_warmup), "mismatches": list(self.mismatches),
                "note": self.note}


def check_schedule(step: np.ndarray, lr: np.ndarray | None, config: dict[str, Any],
                   source: str | None, interval: float = 1.0) -> Schedule:
    """Compare the logged ``lr`` at ``step`` with ``config`` (keys of :data:`SCHEDULE_KEYS`)."""
    if not config:
        return Schedule(note="not tested: no learning-rate schedule recorded beside the log "
                             "(`learning_rate` and `warmup_steps` in a training_args.json, "
                             "args.json, config.json or run_config.json)")
    if lr is None or np.isfinite(lr).sum() < 3:
        return Schedule(source=source, note="not tested: no learning rate logged")
    ok = np.isfinite(lr)
    s, r = step[ok], lr[ok]
    logged_peak = float(np.max(r))
    reach = np.flatnonzero(r >= WARM_SHARE * logged_peak)
    logged_warm = float(s[reach[0]]) if reach.size and reach[0] > 0 else 0.0
    peak = config.get("peak")
    warm = config.get("warmup_steps")
    if warm is None and config.get("warmup_ratio") is not None and config.get("max_steps"):
        warm = float(config["warmup_ratio"]) * float(config["max_steps"])
    if peak is None and warm is None:
        return Schedule(source=source, note="not tested: no peak learning rate or warm-up "
                        "configured beside the log")
    out = []
    if peak is not None and abs(logged_peak - peak) > PEAK_TOLERANCE * peak:
        out.append(f"the learning rate peaks at {logged_peak:.3g}, the configuration says "
                   f"{peak:.3g}")
    if warm is not None and abs(logged_warm - warm) > max(WARM_TOLERANCE * warm,
                                                          2 * interval):
        out.append(f"the warm-up ends at step {logged_warm:g}, the configuration says "
                   f"{warm:g} steps")
    return Schedule(source=source, peak=peak, logged_peak=logged_peak,
                    warmup=None if warm is None else float(warm), logged_warmup=logged_warm,
                    mismatches=out)
