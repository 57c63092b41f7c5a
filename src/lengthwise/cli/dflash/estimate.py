"""``lengthwise dflash estimate``: the peak GPU memory of a training run, before launching it.

Reads the target's ``config.json`` only (no weights) and the run's settings (the
defaults of ``dflash train``, then ``--config run.yaml``, then flags), traces one
training step under fake tensors (:func:`lengthwise.dflash.memory.estimate_step`)
and prints the predicted peak per GPU with its parts; with ``--device-memory`` (or
on the CUDA device the run selects, where there is one) it says whether the run
fits and exits with 1 when it does not. ``dflash train --estimate`` prints the same
for the settings of that command (:func:`report`). Under ``torchrun`` rank 0 prints it
and every rank exits with the same status (:func:`prints_here`).

Example::

    $ lengthwise dflash estimate --target ./Qwen3-8B --device-memory h200
    $ lengthwise dflash estimate --target ./Qwen3-8B/config.json --config run.yaml \\
          --device-memory 80GiB --world 8 --json
    $ lengthwise dflash train --config run.yaml --device cuda --estimate
"""

from __future__ import annotations

import argparse
import json
from typing import Any

#: the flags of ``dflash train`` that set the memory of a step
SHAPE_FLAGS = ("max_tokens", "grad_accum", "block_size", "draft_layers", "num_features",
               "num_anchors", "max_slots", "head_chunk", "dtype")
#: the flags of the estimate itself (``dflash train`` reads them with ``--estimate`` only)
REPORT_FLAGS = ("rows", "world", "device_memory", "json")


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` stage."""
    p = stages.add_parser(
        "estimate",
        help="predict a training run's peak GPU memory from the target's config.json",
        description="Predict the peak memory per GPU of `dflash train` at the run's settings "
                    "from the target's config.json alone (one training step traced under fake "
                    "tensors), its parts, and whether it fits a device. Settings: the defaults "
                    "of `dflash train`, then --config YAML, then flags.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--target", metavar="PATH", required=True,
                   help="target folder or its config.json (weights are not read)")
    p.add_argument("--config", metavar="YAML", help="run settings of `dflash train`")
    from lengthwise.cli.dflash._settings import FLAGS

    for name, kind, text in FLAGS:
        if name in SHAPE_FLAGS:
            p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text,
                           metavar={int: "N"}.get(kind, "NAME"))
    p.add_argument("--device", help="the kernels of: cuda (default) or cpu")
    add_report_flags(p)
    p.set_defaults(func=run)


def add_report_flags(p: argparse.ArgumentParser, *, only: str = "") -> None:
    """The flags of :data:`REPORT_FLAGS`; ``only``: a note on when they are read."""
    p.add_argument("--rows", type=int, metavar="N",
                   help="rows of the micro-batch (default 1: one packed row, the worst case)"
                        + only)
    p.add_argument("--world", type=int, metavar="N",
                   help="data-parallel ranks (default 1; more adds DDP's gradient buckets)"
                        + only)
    p.add_argument("--device-memory", metavar="SIZE",
                   help="memory of the GPU: a size (141GiB, 80GB) or a name (h200, h100-80g, "
                        "a100-80g, a100-40g, l40s); default: the selected CUDA device's, where "
                        "there is one" + only)
    p.add_argument("--json", action="store_true", help="print the estimate as JSON" + only)


def device_bytes(given: dict[str, Any], device: str) -> int | None:
    """``--device-memory``, else the memory of the CUDA ``device`` when torch sees it."""
    from lengthwise.dflash.memory import memory_size

    if "device_memory" in given:
        return memory_size(given["device_memory"])
    if not str(device).startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def report(given: dict[str, Any], *, defaults: dict[str, Any] | None = None) -> int:
    """Print the estimate of the run ``given`` sets (``dflash train``'s settings); 1: no fit.

    ``given``: parsed flags (``--config``, the run's settings and :data:`REPORT_FLAGS`);
    ``defaults``: over ``dflash train``'s. Reads the target's ``config.json`` and nothing
    else: no weights, no data, nothing written.
    """
    from lengthwise.cli.dflash._settings import settings
    from lengthwise.dflash.memory import estimate_step, read_target_config

    given = dict(given)
    opts = {k: given.pop(k) for k in REPORT_FLAGS if k in given}
    cfg, run_settings, _ = settings(given, defaults=defaults, estimate=True)
    size = device_bytes(opts, cfg.device)
    est = estimate_step(read_target_config(run_settings.target), cfg,
                        rows=opts.get("rows", 1), world=opts.get("world", 1))
    if prints_here():
        if opts.get("json"):
            out = est.to_dict()
            if size is not None:
                out.update(device_memory_bytes=size, fits=est.fits(size))
            print(json.dumps(out, indent=2))
        else:
            print(est.render(size))
    return 0 if size is None or est.fits(size) else 1


def prints_here() -> bool:
    """Whether this process prints the estimate: rank 0 of a launch (``torchrun``), or alone.

    The rank comes from the launcher's environment (``RANK``, ``LOCAL_RANK``) or an
    initialised group (:func:`lengthwise.pytorch.dist.launched_rank`); no group is
    joined for it. Every rank still computes the estimate, so all exit with its verdict.

    Example::

        >>> import os
        >>> os.environ.update(WORLD_SIZE="2", RANK="1")
        >>> prints_here()
        False
        >>> del os.environ["WORLD_SIZE"], os.environ["RANK"]
        >>> prints_here()
        True
    """
    from lengthwise.pytorch.dist import launched_rank

    rank = launched_rank()
    return rank is None or rank[0] == 0


def run(args: argparse.Namespace) -> int:
    """Print the estimate (the kernels of CUDA unless ``--device``); 1 when it does not fit."""
    return report(vars(args), defaults={"device": "cuda"})
