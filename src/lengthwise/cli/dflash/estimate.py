"""``lengthwise dflash estimate``: the peak GPU memory of a training run, before launching it.

Reads the target's ``config.json`` only (no weights) and the run's settings (the
defaults of ``dflash train``, then ``--config run.yaml``, then flags), traces one
training step under fake tensors (:func:`lengthwise.dflash.memory.estimate_step`)
and prints the predicted peak per GPU with its parts; with ``--device-memory`` it
says whether the run fits and exits with 1 when it does not.

Example::

    $ lengthwise dflash estimate --target ./Qwen3-8B --device-memory h200
    $ lengthwise dflash estimate --target ./Qwen3-8B/config.json --config run.yaml \\
          --device-memory 80GiB --world 8 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

#: the flags of ``dflash train`` that set the memory of a step
SHAPE_FLAGS = ("max_tokens", "grad_accum", "block_size", "draft_layers", "num_features",
               "num_anchors", "max_slots", "head_chunk", "dtype")


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
    from lengthwise.cli.dflash.train import _FLAGS

    for name, kind, text in _FLAGS:
        if name in SHAPE_FLAGS:
            p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text,
                           metavar={int: "N"}.get(kind, "NAME"))
    p.add_argument("--device", help="the kernels of: cuda (default) or cpu")
    p.add_argument("--rows", type=int, metavar="N",
                   help="rows of the micro-batch (default 1: one packed row, the worst case)")
    p.add_argument("--world", type=int, metavar="N",
                   help="data-parallel ranks (default 1; more adds DDP's gradient buckets)")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="memory of the GPU: a size (141GiB, 80GB) or a name (h200, h100-80g, "
                        "a100-80g, a100-40g, l40s)")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.set_defaults(func=run)


def settings(given: dict[str, Any]) -> Any:
    """The run's ``DFlashTrainConfig``: ``dflash train``'s defaults, ``--config``, flags."""
    from lengthwise.cli.dflash.train import DEFAULTS, read_yaml
    from lengthwise.dflash.train import DFlashTrainConfig
    from lengthwise.errors import ConfigError

    fields = {f.name: f for f in dataclasses.fields(DFlashTrainConfig)}
    source = given.get("config")
    merged = {**DEFAULTS, "device": "cuda", **(read_yaml(source) if source else {}),
              **{k: v for k, v in given.items() if k in fields}}
    run = {k: v for k, v in merged.items() if k in fields}
    for name, value in run.items():  # YAML reads 6e-4 as a string
        if isinstance(value, str) and isinstance(fields[name].default, float):
            try:
                run[name] = float(value)
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {value!r}") from None
    run["max_len"] = min(int(run.get("max_len") or run["max_tokens"]), run["max_tokens"])
    return DFlashTrainConfig(**{**run, "progress": False})


def run(args: argparse.Namespace) -> int:
    """Print the estimate; 1 when it does not fit ``--device-memory``."""
    from lengthwise.dflash.memory import estimate_step, memory_size, read_target_config

    given = vars(args)
    size = memory_size(given["device_memory"]) if "device_memory" in given else None
    cfg = settings(given)
    est = estimate_step(read_target_config(given["target"]), cfg,
                        rows=given.get("rows", 1), world=given.get("world", 1))
    if given.get("json"):
        out = est.to_dict()
        if size is not None:
            out.update(device_memory_bytes=size, fits=est.fits(size))
        print(json.dumps(out, indent=2))
    else:
        print(est.render(size))
    return 0 if size is None or est.fits(size) else 1
