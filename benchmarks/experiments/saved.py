"""An experiment script's saved runs and committed figures, shared by the order experiments.

:class:`CellRuns` saves each run as it ends (an interrupted benchmark continues where it
stopped); :func:`parse` makes the folder options as folders first; :func:`committed`
reads the committed figures (a damaged file is a one-line usage error naming it);
:func:`write` writes them; :func:`close` and :func:`say_drift` compare a rerun check.

Example::

    >>> close(1.0, 1.001), close(None, None), close(1.0, None)
    (True, True, False)
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["REL_TOL", "SELECTION", "CellRuns", "close", "committed", "experiment_parser", "parse",
           "run_identity", "run_parts", "say_check", "say_drift", "stamp", "write"]

#: relative tolerance of a compared figure: a run repeated on this machine gives the same
#: figures to the last digit; other CPUs may round the kernels' sums differently
REL_TOL = 2e-3


def close(a: Any, b: Any) -> bool:
    """Whether two compared figures agree within :data:`REL_TOL` (``None`` only with itself)."""
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOL)


#: design fields that choose which runs a design has, not how each one trains
SELECTION = ("orders", "reduced", "seeds", "arms", "schedules", "batches", "full_batches",
             "skip", "threads")


def run_identity(cfg: Any) -> dict[str, Any]:
    """What makes a saved run of design ``cfg`` (a dataclass) one of its runs: every field
    but the :data:`SELECTION` of runs, as JSON values.

    Example::

        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class D:
        ...     epochs: int = 2
        ...     seeds: tuple = (0, 1)
        >>> run_identity(D())
        {'epochs': 2}
    """
    import dataclasses

    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in SELECTION}
    return json.loads(json.dumps(fields, default=str, sort_keys=True))


class CellRuns:
    """The runs of every cell, each saved as ``folder/ARM-SCHEDULE-bBATCH/ORDER-seedN.json``
    as it ends, so that a benchmark stopped halfway continues where it stopped. ``say``
    prints a line (the script's progress). ``folder/design.json`` records the design's
    :func:`run_identity` and ``inputs`` (digests of the data and start the runs read, when
    the design reads files): runs saved for another design (other data, start or
    settings) are refused in one line, never mixed in; a design with more orders, seeds,
    arms or schedules reuses the runs it shares."""

    def __init__(self, folder: Path, cfg: Any, say: Callable[[str], None] = print,
                 inputs: dict[str, str] | None = None) -> None:
        from lengthwise.errors import ConfigError

        self.folder, self.say = folder, say
        self.order = cfg.jobs()  # (arm, schedule, batch, order, seed), seed by seed per cell
        folder.mkdir(parents=True, exist_ok=True)
        mine, record = run_identity(cfg), folder / "design.json"
        if inputs is not None:
            mine["inputs"] = inputs
        if record.is_file():
            saved = json.loads(record.read_text(encoding="utf-8"))
            differ = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
            if differ:
                raise ConfigError(f"{folder}: its runs were saved for another design "
                                  f"({', '.join(differ)} differ); give another folder")
        else:
            record.write_text(json.dumps(mine, indent=1) + "\n", encoding="utf-8")
        for arm, schedule, batch in {job[:3] for job in self.order}:
            (folder / f"{arm}-{schedule}-b{batch}").mkdir(parents=True, exist_ok=True)

    def _path(self, arm: str, schedule: str, batch: int, order: str, seed: int) -> Path:
        return self.folder / f"{arm}-{schedule}-b{batch}" / f"{order}-seed{seed}.json"

    def done(self) -> set[tuple[Any, ...]]:
        """The (arm, schedule, batch, order, seed) runs already saved."""
        return {job for job in self.order if self._path(*job).is_file()}

    def save(self, r: dict[str, Any]) -> None:
        """Save run ``r`` and say what it measured."""
        self._path(r["arm"], r["schedule"], r["batch"], r["order"], r["seed"]).write_text(
            json.dumps(r), encoding="utf-8")
        self.say(f"{r['arm']}/{r['schedule']}/{r['batch']}: {r['order']} seed {r['seed']}: "
                 f"held-out loss {r['eval_loss']:.4f} after {r['steps']} steps, "
                 f"{r['real_tokens']:,} real tokens, {r['flops'] / 1e9:,.1f} GFLOP, "
                 f"{r['wall_seconds']:.0f} s")

    def load(self) -> list[dict[str, Any]]:
        """Every run, cell by cell, seed by seed, in the config's order of orders."""
        return [json.loads(self._path(*job).read_text(encoding="utf-8")) for job in self.order]


def experiment_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An experiment script's options: ``--out``, ``--workers`` and what it does (at most one
    of ``--check``, ``--full-only``, ``--check-only``, ``--render``); usage errors are one
    line (exit 2), as the ``lengthwise`` command's."""
    from lengthwise.cli import _Parser
    from lengthwise.cli.demo import _positive

    ap = _Parser(prog=prog, description=description)
    ap.add_argument("--out", default=None, help="folder for logs and saved runs (default: temp)")
    ap.add_argument("--workers", type=_positive, default=1, help="runs trained at a time")
    mode = ap.add_mutually_exclusive_group()  # each names what the script does: one at most
    mode.add_argument("--check", action="store_true",
                      help="rerun the reduced check and compare with the committed figures")
    mode.add_argument("--full-only", action="store_true", help="skip the reduced check run")
    mode.add_argument("--check-only", action="store_true",
                      help="run the reduced check and save it, keep the saved full run")
    mode.add_argument("--render", action="store_true",
                      help="rewrite the results, docs and plots from the committed figures only")
    return ap


def say_check(saved: dict[str, Any], fresh: dict[str, Any], broken: list[str],
              compare: Callable[[dict[str, Any], dict[str, Any]], list[str]], name: str,
              ) -> int:
    """Print the broken invariants of a rerun check and, against the committed check in
    ``saved`` (when there is one), the figures that moved; the exit status (1: any)."""
    for line in broken:
        print(line)
    if "check" not in saved:
        print(f"{name}: {len(broken)} invariant(s) broken; no committed check run yet to "
              "compare with")
        return 1 if broken else 0
    return max(1 if broken else 0, say_drift(compare(saved["check"], fresh), name))


def parse(ap: argparse.ArgumentParser, argv: list[str] | None,
          folders: Sequence[str] = ("out",)) -> argparse.Namespace:
    """The options of ``argv``, with the folder options ``folders`` (their ``dest``) made as
    folders first: a path that cannot be one is a usage error naming the option (not a
    traceback later)."""
    from lengthwise.cli.demo import _check_folder
    from lengthwise.errors import ConfigError

    args = ap.parse_args(argv)
    for dest in folders:
        path, option = getattr(args, dest), "--" + dest.replace("_", "-")
        if path is None:
            continue
        try:
            _check_folder(option, path)
            Path(path).mkdir(parents=True, exist_ok=True)
        except ConfigError as exc:
            ap.error(str(exc))
        except OSError as exc:
            ap.error(f"{option} {path}: cannot make this folder ({exc.strerror or exc})")
    return args


def committed(path: Path, ap: argparse.ArgumentParser) -> dict[str, Any]:
    """The figures saved in ``path`` (none before the first run); a file that is not a JSON
    object (damaged, cut short) is a one-line usage error naming it (exit 2)."""
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        ap.error(f"{path}: not readable ({exc})")
    except ValueError as exc:
        ap.error(f"{path}: not valid JSON, damaged or cut short ({exc}); restore it (git "
                 "checkout) or rerun the experiment")
    if not isinstance(saved, dict):
        ap.error(f"{path}: holds a JSON {type(saved).__name__}, not the figures' object")
    return saved


def write(saved: dict[str, Any], path: Path) -> None:
    """Write the figures as JSON (NaN, e.g. the interval of one seed, as null)."""
    from lengthwise.demo.report import clean_json

    path.write_text(json.dumps(clean_json(saved), indent=1) + "\n", encoding="utf-8")


def say_drift(drift: list[str], name: str) -> int:
    """Print the figures of a rerun check that moved and how many (``name``: the script);
    the exit status (1: any)."""
    for line in drift:
        print(line)
    print(f"{name}: {len(drift)} figure(s) differ from the committed check run")
    return 1 if drift else 0


def stamp(summary: dict[str, Any], started: float, workers: int) -> dict[str, Any]:
    """``summary`` with the wall seconds since ``started`` (``time.perf_counter``), the
    machine and the runs trained at a time."""
    import os
    import platform
    import time

    summary["wall_seconds"] = time.perf_counter() - started
    summary["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores"
    summary["workers"] = workers
    return summary


def run_parts(saved: dict[str, Any], args: argparse.Namespace, path: Path,
              check: Callable[[], dict[str, Any]], full: Callable[[], dict[str, Any]]) -> None:
    """Run and save the check (unless ``--full-only``) and the full run (unless
    ``--check-only``) into ``saved``, written to ``path`` after each."""
    if not args.full_only:
        saved["check"] = check()
        write(saved, path)
    if not args.check_only:
        saved["full"] = full()
        write(saved, path)
