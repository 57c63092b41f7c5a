"""``lengthwise doctor``: say why a training loss curve looks the way it does.

Example::

    $ lengthwise doctor train_log.jsonl
    $ lengthwise doctor run_a.jsonl run_b.jsonl --json
    $ lengthwise doctor runs/ --plot doctor.png --checkpoint-every 500
    $ lengthwise doctor wandb/run-20240101_120000-abc123 --world-size 4
    $ lengthwise doctor --watch runs/train_log.jsonl --interval 30
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_name


def _finite(text: str) -> float:
    """A float flag's value: a finite number (``inf`` and ``nan`` are refused at parse time)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A ``--watch`` duration: a finite number of seconds, at most a year (``MAX_SECONDS``)."""
    from lengthwise.doctor.watch import MAX_SECONDS

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and abs(value) <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds (at most {MAX_SECONDS:.0f}, a year), "
            f"got {text!r}")
    return value


HELP = "diagnose training loss curves: bands, periods, cliffs, and their causes"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` sub-command."""
    p = subparsers.add_parser(
        "doctor",
        help=HELP,
        description=(
            "Read training logs (JSON lines, .gz, CSV exports, TensorBoard event files or "
            "directories, W&B run files or folders) and report the stable region, loss "
            "statistics, bands, periodicity, "
            "cliffs and their alignment with checkpoints, attribution to batch composition, "
            "and a ranked verdict with prescriptions."
        ),
    )
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="log file(s), TensorBoard dir(s) or W&B run folder(s)")
    p.add_argument("--step-key", default=None, help="step field (default: step or an alias)")
    p.add_argument("--loss-key", default=None, help="loss field (default: loss or an alias)")
    p.add_argument("--from", dest="start", type=_finite, default=None, metavar="STEP",
                   help="first step of the stable region (default: chosen automatically)")
    p.add_argument("--to", dest="end", type=_finite, default=None, metavar="STEP",
                   help="last step of the stable region (default: the last finite loss)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="checkpoint saves every N steps (when the log has no checkpoint events)")
    p.add_argument("--steps-per-epoch", type=_finite, default=None, metavar="N",
                   help="optimizer steps per epoch (default: from the logged `epoch` field); "
                   "tests epoch boundaries and matches periods to epochs and mega-batches")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="samples per optimizer step (per device batch x gradient accumulation), "
                   "for the mega-batch arithmetic of length-grouped sampling")
    p.add_argument("--world-size", type=int, default=None, metavar="W",
                   help="data-parallel processes (default: a training_args.json or config "
                   "file beside the log, else 1, 2, 4 and 8 are tried) for the mega-batch "
                   "arithmetic")
    p.add_argument("--eval-every", type=_finite, default=None, metavar="N",
                   help="evaluation every N steps (a period of that length is named)")
    p.add_argument("--clip", type=_finite, default=None, metavar="NORM",
                   help="gradient-clipping norm of the run (default: max_grad_norm or clip in a "
                   "training_args.json or config file beside the log), for the clip rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap/permutation tests")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-timing", dest="timing", action="store_false",
                   help="leave the logged step times out (no slow-step or straggler finding), "
                        "so the report depends on the loss alone, not on the machine's load")
    p.add_argument("--watch", action="store_true",
                   help="follow one growing log: diagnose it again whenever it changes and "
                   "print each new finding once; a summary at the end (Ctrl-C, exit 130)")
    p.add_argument("--interval", type=_seconds, default=None, metavar="SECONDS",
                   help="with --watch: seconds between looks at the log (default 10)")
    p.add_argument("--max-seconds", type=_seconds, default=None, metavar="SECONDS",
                   help="with --watch: stop after this long, print the summary, exit 0")
    p.add_argument("--cooldown", type=_seconds, default=None, metavar="SECONDS",
                   help="with --watch: a finding that went away is printed again only this "
                   "long after it was last printed (default 300)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="write a PNG: loss with stable region, bands and cliffs; histogram; "
                   "autocorrelation (needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Diagnose each log and print the reports (text, or JSON with --json)."""
    from lengthwise.doctor import LogError, LogNotFoundError, PlotUnavailableError, diagnose
    from lengthwise.doctor.numeric import json_ready
    from lengthwise.doctor.report import render_comparison, render_text

    if args.watch or args.interval is not None or args.max_seconds is not None \
            or args.cooldown is not None:
        return _watch(args)
    reports = {}
    for log in args.logs:
        try:
            reports[log] = diagnose(log, **_options(args))
        except (LogError, LogNotFoundError, ValueError, OSError) as exc:
            print(f"lengthwise doctor: error: {_one_line(exc)}", file=sys.stderr)
            return 2
    if args.plot:
        from lengthwise.doctor.plot import plot_reports

        try:
            plot_reports(reports, args.plot)
        except PlotUnavailableError as exc:
            print(f"lengthwise doctor: error: {exc}", file=sys.stderr)
            return 2
    if args.json:
        if len(reports) == 1:
            payload = next(iter(reports.values())).to_dict()
        else:
            payload = {"runs": {name: r.to_dict() for name, r in reports.items()}}
        print(json.dumps(json_ready(payload), indent=2))
    else:
        texts = [render_text(r) for r in reports.values()]
        if len(reports) > 1:
            texts.append("comparison\n" + render_comparison(reports))
        print("\n\n".join(texts))
    if args.plot:
        sys.stdout.flush()
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _options(args: argparse.Namespace) -> dict[str, object]:
    """The diagnosis options of the command line, as ``diagnose`` takes them."""
    return {name: getattr(args, name) for name in (
        "step_key", "loss_key", "start", "end", "checkpoint_every", "steps_per_epoch",
        "batch_size", "eval_every", "world_size", "seed", "clip", "timing")}


def _watch(args: argparse.Namespace) -> int:
    """``--watch``: follow one log (see :mod:`lengthwise.doctor.watch`)."""
    from lengthwise.doctor.watch import DEFAULT_COOLDOWN, DEFAULT_INTERVAL, watch

    if not args.watch:
        raise ConfigError("--interval, --max-seconds and --cooldown go with --watch")
    if len(args.logs) != 1:
        raise ConfigError(f"--watch follows one log, got {len(args.logs)}")
    if args.json or args.plot:
        raise ConfigError("--watch prints text lines; drop --json and --plot")
    for name in ("interval", "max_seconds", "cooldown"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{flag_name(name)} must be positive, got {value:g}")
    return watch(args.logs[0], interval=args.interval or DEFAULT_INTERVAL,
                 max_seconds=args.max_seconds,
                 cooldown=DEFAULT_COOLDOWN if args.cooldown is None else args.cooldown,
                 options=_options(args))


def _one_line(exc: BaseException) -> str:
    """The error message on one line (user errors print no traceback)."""
    return " ".join(str(exc).split()) or type(exc).__name__
