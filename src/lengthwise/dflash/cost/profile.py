"""A device profile: seconds per unit of a stage's work, fitted on timed work, kept as JSON.

:class:`Profile` is what the training profile
(:class:`~lengthwise.dflash.cost.train_time.DeviceProfile`) and the regeneration one
(:class:`~lengthwise.dflash.cost.regenerate_time.GenerateProfile`) share: their file
(:meth:`Profile.save`, :meth:`Profile.load`, checked as data before anything is priced
by it) and their fit (:func:`fit_costs`: non-negative least squares on relative residuals,
each timed unit counting alike).

Example::

    >>> coef, fit = fit_costs(np.array([[1.0, 2.0], [1.0, 4.0]]), np.array([3.0, 5.0]))
    >>> coef.round(6).tolist(), fit["max_relative_error"] < 1e-9
    ([1.0, 1.0], True)
"""

from __future__ import annotations

import json
import os
import reprlib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lengthwise.errors import ConfigError, DataError

__all__ = ["MAX_COST", "Profile", "check_one_process", "device_name", "duration", "fit_costs"]

#: the most seconds a profile may price one unit of work at: beyond it a time is no estimate
MAX_COST = 1e6
_JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


class Profile:
    """The file of a profile dataclass: its kind, the command that writes it, the fields it
    requires, those that are seconds per unit (``costs``, from 0 to :data:`MAX_COST`; not all
    of ``priced`` 0) and what its ``fit`` counts (``timed``)."""

    kind: ClassVar[str]
    write: ClassVar[str]
    required: ClassVar[tuple[str, ...]]
    costs: ClassVar[tuple[str, ...]]
    priced: ClassVar[tuple[str, ...]]
    timed: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (``--save-profile``)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """A profile written by :meth:`save` (``--device-profile``), checked as data before
        anything is priced by it; a one-line error naming the file and the field otherwise.

        >>> import tempfile, os
        >>> from lengthwise.dflash.cost.train_time import DeviceProfile
        >>> f = os.path.join(tempfile.mkdtemp(), "p.json")
        >>> _ = open(f, "w").write('{"device": "cpu", "micro_batch": 0, "per_gflop": true}')
        >>> try:
        ...     DeviceProfile.load(f)
        ... except DataError as e:
        ...     print(str(e).replace(f, "p.json"))
        --device-profile p.json: per_gflop must be a number of seconds from 0 to 1e+06, got True
        """
        where = f"--device-profile {path}"
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except OSError as e:
            raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not a text file (byte {e.start} is not UTF-8)") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not JSON ({e.msg}, line {e.lineno})") from None
        except RecursionError:
            raise DataError(f"{where}: not a profile (JSON nested too deep)") from None
        if not isinstance(data, dict):
            raise DataError(f"{where}: a JSON object is expected, got a JSON "
                            f"{_JSON_KIND.get(type(data), type(data).__name__)}")
        missing = [k for k in ("device", *cls.required) if k not in data]
        if missing:
            raise DataError(f"{where}: not a {cls.kind} profile (no {', '.join(missing)}); "
                            f"write one with {cls.write}")
        if not isinstance(data["device"], str) or not data["device"].strip():
            raise DataError(f"{where}: device must be the name of a device, got "
                            f"{reprlib.repr(data['device'])}")
        _check_numbers(data, cls.costs, where)
        priced = cls.priced
        if not any(data.get(k, 0) for k in priced):
            names = ", ".join(priced[:-1]) + " and " + priced[-1]
            raise DataError(f"{where}: {names} {'are both' if len(priced) == 2 else 'are all'} "
                            f"0, which prices the work at 0 s; write a measured profile with "
                            f"{cls.write}")
        fit = data.get("fit", {})
        if not isinstance(fit, dict):
            raise DataError(f"{where}: fit must be a JSON object (the timed work), got "
                            f"{reprlib.repr(fit)}")
        v = fit.get(cls.timed, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DataError(f"{where}: fit.{cls.timed} must be a count >= 1, got "
                            f"{reprlib.repr(v)}")
        _check_numbers(fit, ("median_relative_error", "max_relative_error"), where,
                       what="a number", section="fit.")
        cls.check(data, where)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @classmethod
    def check(cls, data: dict[str, Any], where: str) -> None:
        """What the kind of profile checks beyond :meth:`load`'s checks (nothing here)."""


def _check_numbers(data: dict[str, Any], names: tuple[str, ...], where: str, *,
                   what: str = "a number of seconds", section: str = "") -> None:
    """Each of ``names`` in ``data`` (0 when absent) is a real number from 0 to :data:`MAX_COST`."""
    for k in names:
        v = data.get(k, 0.0)
        if (isinstance(v, bool) or not isinstance(v, (int, float))
                or not 0 <= v <= MAX_COST):  # NaN fails both comparisons
            raise DataError(f"{where}: {section}{k} must be {what} from 0 to {MAX_COST:g}, got "
                            f"{reprlib.repr(v)}")


def fit_costs(x: np.ndarray, seconds: np.ndarray, coef: np.ndarray | None = None,
              ) -> tuple[np.ndarray, dict[str, float]]:
    """``(seconds per unit of each column of x, how well they repeat seconds)``: the
    non-negative least squares fit on relative residuals, or ``coef`` when given."""
    from lengthwise.pytorch.calibrate import _nnls

    if coef is None:
        coef = _nnls(x / seconds[:, None], np.ones_like(seconds))
    err = np.abs(x @ coef - seconds) / seconds
    return coef, {"median_relative_error": float(np.median(err)),
                  "max_relative_error": float(err.max())}


def check_one_process() -> None:
    """Refuse timing under a launcher of several processes: a profile is one device's."""
    from lengthwise.pytorch.dist import launched_world

    if launched_world() is not None:
        raise ConfigError("--time measures a profile in one process: run the estimate "
                          "without torchrun, with --world N for the ranks of the run")


def device_name(device: str, threads: int | None) -> str:
    """The device a profile was measured on, as the estimate names it."""
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    from lengthwise.train.device import cpu_model

    return f"this machine's CPU ({cpu_model()}, {threads or os.cpu_count()} thread(s))"


def duration(seconds: float, *, exact: bool = False, unit: bool = True) -> str:
    """``seconds`` as a person says it: ``3 h 10 min``, ``12 min``, ``45 s``, ``2.2 s``.

    ``exact``: keep a decimal below 10 s (two digits below 1 s); ``unit=False``: a bare
    number where the unit is seconds (the first of a range).

    Example::

        >>> duration(11400), duration(725), duration(44.6), duration(2.24, exact=True)
        ('3 h 10 min', '12 min', '45 s', '2.2 s')
        >>> duration(0.0412, exact=True)
        '0.041 s'
    """
    s = float(seconds)
    if s >= 3600:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    if s >= 600:
        return f"{round(s / 60)} min"
    if s >= 60:
        m, r = divmod(round(s), 60)
        return f"{m} min {r} s" if r else f"{m} min"
    text = f"{s:.2g}" if exact and s < 1 else f"{s:.1f}" if exact and s < 10 else f"{round(s)}"
    return text + (" s" if unit else "")
