"""``lengthwise dflash estimate``: a stage's peak memory and time, before launching it.

``--stage train`` (the default, whose settings are ``dflash train``'s: :func:`report`, which
``dflash train --estimate`` prints too), ``regenerate``, ``eval`` or ``features`` reads the
target's ``config.json`` (and tokenizer; no weights) and prints the predicted peak of the
stage's process (:mod:`lengthwise.dflash.cost.memory`) and, with ``--device-memory`` or on
the CUDA device the run selects, whether it fits (exit 1 when not). ``--time`` (with
``--data``) adds the run's or the regeneration's time (:mod:`lengthwise.dflash.cost.timing`).
Under ``torchrun`` rank 0 prints and every rank exits alike (:func:`prints_here`).

Example::

    $ lengthwise dflash estimate --target ./Qwen3-8B --config run.yaml --device-memory h200
    $ lengthwise dflash estimate --stage regenerate --target ./model --device cpu \\
          --batch-size 16 --max-len 1024 --max-new-tokens 256
    $ lengthwise dflash estimate --target ./model --data prepared/ --device cpu --epochs 2 \\
          --time --save-profile cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.cli._options import add_config_flags
from lengthwise.cli.dflash._settings import DEFAULTS, add_run_flags, settings
from lengthwise.dflash.cost.resident import process_baseline
from lengthwise.dflash.cost.timing import (
    PROFILE_STEPS,
    DeviceProfile,
    GenerateProfile,
    estimate_regenerate_time,
    estimate_time,
)
from lengthwise.dflash.features import FeaturesConfig, cache_bytes, open_features
from lengthwise.dflash.prepare_config import PrepareConfig
from lengthwise.dflash.prepared import open_prepared
from lengthwise.dflash.train_config import DFlashTrainConfig
from lengthwise.disk import format_bytes
from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_name
from lengthwise.pytorch.dist import launched_rank

#: the flags of ``dflash train`` that set the memory of a step
SHAPE_FLAGS = ("max_tokens", "grad_accum", "block_size", "draft_layers", "num_features",
               "num_anchors", "max_slots", "head_chunk", "dtype", "features")
#: the flags of the estimate itself (``dflash train`` reads them with ``--estimate`` only)
REPORT_FLAGS = ("rows", "world", "device_memory", "json", "time", "profile_steps",
                "device_profile", "save_profile")
#: the flags of ``dflash train`` that set a run's steps and plan (read with ``--time``)
RUN_FLAGS = ("steps", "epochs", "order", "eval_every", "eval_samples", "seed", "threads",
             "buckets", "grad_accum")
#: the flags of the features stage only (``dflash features``'s names)
FEATURES_FLAGS = ("layers", "target_dtype", "last_hidden", "shard_mib", "out")
#: the flags of the regenerate and eval stages (their commands' names and defaults)
STAGE_FLAGS: dict[str, dict[str, Any]] = {
    "regenerate": {k: getattr(PrepareConfig, k)
                   for k in ("batch_size", "max_new_tokens", "max_len", "dtype", "shard_rows",
                             "max_tokens")},
    "eval": {"batch_size": 16, "max_new_tokens": 256, "max_len": None, "dtype": None,
             **{k: DEFAULTS.get(k, getattr(DFlashTrainConfig, k)) for k in (
                 "max_tokens", "max_slots", "head_chunk", "block_size", "draft_layers",
                 "num_features")}},
    # dflash features: its FeaturesConfig's fields (their defaults), and the cache's folder
    "features": dict.fromkeys((*FEATURES_FLAGS, "num_features", "dtype", "max_tokens",
                               "max_len")),
}


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` stage."""
    p = stages.add_parser(
        "estimate",
        help="before launch: a stage's peak memory (train, regenerate, eval) from the target's "
             "config.json, and with --time the run's time",
        description="Predict the peak memory of a stage's whole process (--stage train, "
                    "regenerate or eval) from the target's config.json alone (no weights; "
                    "the stage's passes traced under fake tensors) and its parts: on CPU the "
                    "peak resident memory of the process, on CUDA the peak allocated memory "
                    "per GPU, and whether it fits a device; with --time (and --data) also the "
                    "run's time from its plan and a few timed steps. Train's settings: the "
                    "defaults of `dflash train`, then --config YAML, then flags.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--stage", dest="estimated_stage",
                   choices=("train", "regenerate", "eval", "features"),
                   help="the stage: train (default), regenerate (dflash prepare --regenerate), "
                        "eval or features (dflash features)")
    p.add_argument("--target", metavar="PATH", required=True,
                   help="target folder or its config.json (weights are not read)")
    p.add_argument("--config", metavar="YAML", help="run settings of `dflash train`")
    p.add_argument("--data", metavar="FOLDER",
                   help="with --time: train, the folder written by `dflash prepare` (the run's "
                        "plan); regenerate, the chats `dflash prepare --regenerate` reads; "
                        "features: the prepared folder (the cache's size on disk)")
    add_run_flags(p, only=(*SHAPE_FLAGS, *RUN_FLAGS, "device"), defaults={"device": "cuda"})
    add_report_flags(p)
    add_stage_flags(p)
    p.set_defaults(func=run)


def add_stage_flags(p: argparse.ArgumentParser) -> None:
    """The size flags of the regenerate and eval stages, each added unless ``p`` has it."""
    regen, evals = STAGE_FLAGS["regenerate"], STAGE_FLAGS["eval"]
    flags = {"--batch-size": "regenerate, eval: prompts decoded together (defaults "
                             f"{regen['batch_size']} and {evals['batch_size']}, as `dflash "
                             "prepare` and `dflash eval`)",
             "--max-new-tokens": "regenerate, eval: tokens written per prompt at most "
                                 f"(defaults {regen['max_new_tokens']} and "
                                 f"{evals['max_new_tokens']})",
             "--max-len": "regenerate, eval: the longest prompt in tokens (required there, "
                          "but for regenerate --time: the longest of --data); train: the "
                          "longest sample (default: max_tokens)",
             "--shard-rows": f"regenerate: conversations per shard (default "
                             f"{regen['shard_rows']}, as `dflash prepare`); ranks (--world, "
                             "with --time) take shards in turn"}
    for flag, text in flags.items():
        if flag not in p._option_string_actions:  # another part of the command has it
            p.add_argument(flag, type=int, metavar="N", help=text)
    features = p.add_argument_group("the features stage (--stage features)")
    add_config_flags(features, FeaturesConfig, only=FEATURES_FLAGS, given_only=True)
    features.add_argument("--out", metavar="CACHE", help="the cache's folder, whose disk must "
                          "have room for it (default: this folder)")


def add_report_flags(p: argparse.ArgumentParser, *, listed: bool = True) -> None:
    """The flags of :data:`REPORT_FLAGS`; ``listed=False`` keeps them out of ``p``'s help
    (``dflash train`` reads them with ``--estimate`` and points to this command's help)."""
    def text(words: str) -> str:
        return words if listed else argparse.SUPPRESS

    p.add_argument("--rows", type=int, metavar="N",
                   help=text("rows of the micro-batch (default 1: one packed row, the worst "
                             "case)"))
    p.add_argument("--world", type=int, metavar="N",
                   help=text("data-parallel ranks (default 1; more adds DDP's gradient "
                             "buckets)"))
    p.add_argument("--device-memory", metavar="SIZE",
                   help=text("memory of the GPU: a size (141GiB, 80GB) or a name (h200, "
                             "h100-80g, a100-80g, a100-40g, l40s); default: the selected CUDA "
                             "device's, where there is one"))
    p.add_argument("--json", action="store_true", help=text("print the estimate as JSON"))
    p.add_argument("--time", action="store_true",
                   help=text("also predict the run's time from its plan (needs --data): train "
                             "per step, per epoch and in all, priced by a few training steps "
                             "timed here; regenerate in all, priced by the forwards of a few of "
                             "its conversations regenerated here (either loads the target), or by "
                             "--device-profile"))
    p.add_argument("--profile-steps", type=int, metavar="N",
                   help=text("training steps timed for --time (default 4, plus a warm-up step "
                             "and one that also evaluates); regenerate: conversations "
                             "regenerated (default 32, or --batch-size if larger)"))
    p.add_argument("--device-profile", metavar="FILE",
                   help=text("price the plan with this profile (written by --save-profile, "
                             "e.g. on a GPU elsewhere) instead of timing steps here"))
    p.add_argument("--save-profile", metavar="FILE",
                   help=text("write the profile --time measured, as JSON"))


def device_bytes(given: dict[str, Any], device: str) -> int | None:
    """``--device-memory``, else the memory of the CUDA ``device`` when torch sees it."""
    from lengthwise.dflash.cost.memory import memory_size

    if "device_memory" in given:
        return memory_size(given["device_memory"])
    if not str(device).startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def report(given: dict[str, Any], *, defaults: dict[str, Any] | None = None) -> int:
    """Print the estimate of the run ``given`` (parsed ``dflash train`` flags and
    :data:`REPORT_FLAGS`; ``defaults`` over ``dflash train``'s) sets; 1: no fit. Reads the
    target's ``config.json`` and nothing else, unless ``--time`` (:func:`run_time`)."""
    from lengthwise.dflash.cost.memory import estimate_train, read_target_config

    given = {k: v for k, v in given.items()
             if k not in ("batch_size", "max_new_tokens", "shard_rows")}
    opts = {k: given.pop(k) for k in REPORT_FLAGS if k in given}
    cfg, run_settings, _ = settings(given, defaults=defaults, estimate=True)
    _check_profile_flags(opts)
    profile = (DeviceProfile.load(opts["device_profile"]) if opts.get("device_profile")
               else None)  # a bad profile before any tracing
    if opts.get("time") and not run_settings.data:  # the estimate leaves it empty when not given
        raise ConfigError("--time needs --data (or data: in --config): the time is the plan's, "
                          "on the run's own samples")
    size = device_bytes(opts, cfg.device)  # a bad --device-memory before any tracing
    if run_settings.features:  # its record only: the shards are checked when training starts
        open_features(run_settings.features, verify=False)
    config = read_target_config(run_settings.target)
    grown = _grown(config, run_settings.target)  # loads the tokenizer, as training does
    baseline = _baseline("train", config, run_settings.target, cfg.device,
                         tokenizer=grown is None)
    est = estimate_train(config, cfg, rows=opts.get("rows", 1), world=opts.get("world", 1),
                         grown=grown, baseline=baseline, cached=bool(run_settings.features))
    timing = (run_time(given, opts, profile=profile, defaults=defaults) if opts.get("time")
              else None)
    return _print(est, opts, size, timing)


def run_time(given: dict[str, Any], opts: dict[str, Any], *, profile: Any = None,
             defaults: dict[str, Any] | None = None) -> Any:
    """``(RunTime, DeviceProfile)`` of the run ``given`` sets (``--time``)."""
    cfg, run_settings, _ = settings(given, defaults=defaults)  # the data's own max_len
    timing = estimate_time(cfg, run_settings, world=opts.get("world", 1), profile=profile,
                           steps=opts.get("profile_steps", PROFILE_STEPS))
    if opts.get("save_profile"):
        timing[1].save(opts["save_profile"])
    return timing


def _grown(config: Any, target: str) -> int | None:
    """Rows of the target's embedding with the mask token, from its tokenizer (if it has one)."""
    import transformers

    from lengthwise.dflash.cost.memory import grown_rows

    folder = _tokenizer_folder(target)
    if folder is None:
        return None
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    try:
        gen = transformers.GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    except OSError:
        gen = None
    return grown_rows(tok, config, gen)


def prints_here() -> bool:
    """Whether this process prints the estimate: rank 0 of a launch (``torchrun``: no group
    is joined for it), or alone. Every rank computes it, so all exit with its verdict.

    >>> os.environ.update(WORLD_SIZE="2", RANK="1")
    >>> prints_here()
    False
    >>> del os.environ["WORLD_SIZE"], os.environ["RANK"]
    """
    rank = launched_rank()
    return rank is None or rank[0] == 0


def run(args: argparse.Namespace) -> int:
    """Print the estimate (the kernels of CUDA unless ``--device``); 1 when it does not fit."""
    given = vars(args)
    stage = given.pop("estimated_stage", "train")
    if stage == "train":
        stray = [k for k in FEATURES_FLAGS if k in given]
        if stray:
            raise ConfigError(f"{', '.join(map(flag_name, stray))}: not a setting of the train "
                              "stage's estimate (of --stage features)")
        return report(given, defaults={"device": "cuda"})
    return stage_report(stage, given)


def stage_report(stage: str, given: dict[str, Any]) -> int:
    """Print the ``regenerate``, ``eval`` or ``features`` estimate of the flags ``given``;
    1: no fit (of the device, or of the disk for the feature cache)."""
    from lengthwise.dflash.cost import memory

    given = {k: v for k, v in given.items() if k not in ("func", "command", "stage")}
    opts = {k: given.pop(k) for k in REPORT_FLAGS if k in given}
    target = given.pop("target")
    device = str(given.pop("device", "cuda"))
    data = given.pop("data", None) if stage in ("regenerate", "features") else None
    known = STAGE_FLAGS[stage]
    stray = sorted(set(given) - set(known))
    timed = stage == "regenerate" and opts.get("time")
    if stray or opts.get("rows") or (opts.get("world") and not timed):
        names = stray + [k for k in ("rows", "world") if opts.get(k)]
        raise ConfigError(f"{', '.join(map(flag_name, names))}: not a setting of the {stage} "
                          "stage's estimate"
                          + (" (--world goes with --time)" if names == ["world"] else ""))
    sizes = {**known, **given}
    if stage in ("eval", "features") and any(opts.get(k) for k in ("time", "device_profile",
                                                                    "save_profile")):
        raise ConfigError(f"--time: the time of the train and regenerate stages, not of {stage}")
    if stage == "features":
        sizes = {k: v for k, v in sizes.items() if v is not None}
        out = sizes.pop("out", ".")
        return _features_report(target, FeaturesConfig(**sizes), data, out, device, opts)
    _check_profile_flags(opts)
    if timed and data is None:
        raise ConfigError("--stage regenerate --time needs --data, the chats `dflash prepare "
                          "--regenerate` reads: the time is that of their prompts")
    if sizes["max_len"] is None and not timed:
        raise ConfigError(f"--stage {stage}: give --max-len, the longest prompt in tokens "
                          "(the estimate reads no prompts)")
    size = device_bytes(opts, device)
    config = memory.read_target_config(target)
    timing = None
    if timed:
        timing, longest = regenerate_time(target, data, sizes, device, opts)
        if sizes["max_len"] is None:
            sizes["max_len"] = longest
    sizes.pop("shard_rows", None)
    if stage == "regenerate":  # the budget of the time's replay; the memory is of full rows
        sizes.pop("max_tokens", None)
    est = getattr(memory, f"estimate_{stage}")(config, device=device, **sizes,
                                                baseline=_baseline(stage, config, target, device))
    return _print(est, opts, size, timing)


def _features_report(target: str, cfg: Any, data: str | None, out: str, device: str,
                     opts: dict[str, Any]) -> int:
    """Print the ``features`` estimate of ``cfg`` and, with the prepared ``data``, the cache's
    bytes against the free space of ``out``'s disk."""
    from lengthwise.dflash.cost.memory import estimate_features, read_target_config

    size = device_bytes(opts, device)
    config = read_target_config(target)
    stored = None
    if data is not None:
        lengths = np.asarray(open_prepared(data).lengths, dtype=np.int64)
        stored = lengths if cfg.max_len is None else np.minimum(lengths, cfg.max_len)
    est = estimate_features(config, cfg, stored=stored, device=device,
                            baseline=_baseline("features", config, target, device))
    layers, hidden = len(est.settings["target_layers"]), int(config.hidden_size)
    per = cache_bytes(1, layers, hidden, cfg.dtype, cfg.last_hidden)
    what = (f"{layers} layers" + (" + the last hidden state" if cfg.last_hidden else "")
            + f" x {hidden} x {per // hidden // (layers + cfg.last_hidden)} bytes")
    if stored is None:
        return _print(est, opts, size, disk=(f"disk: {format_bytes(per)} a token ({what}); "
                                             "give --data PREPARED for the cache's size", True))
    tokens = int(stored.sum())
    need = cache_bytes(tokens, layers, hidden, cfg.dtype, cfg.last_hidden)
    where = Path(out).absolute()
    while not where.is_dir():  # the folder the pass makes is on its nearest parent's disk
        where = where.parent
    free = shutil.disk_usage(where).free
    fits = need <= free
    est.settings.update(tokens=tokens, cache_bytes=need, disk=str(where), disk_free_bytes=free,
                        disk_fits=fits)
    return _print(est, opts, size, disk=(
        f"disk: the cache needs {format_bytes(need)} ({tokens:,} tokens x "
        f"{format_bytes(per)}: {what}); {where} has {format_bytes(free)} free: "
        + ("fits" if fits else "does NOT fit"), fits))


def _check_profile_flags(opts: dict[str, Any]) -> None:
    """Refuse ``--device-profile`` and ``--save-profile`` without ``--time``, and a
    ``--save-profile`` that cannot be written, before any timing."""
    stray = [k for k in ("device_profile", "save_profile") if opts.get(k)]
    if stray and not opts.get("time"):
        raise ConfigError(f"{', '.join(map(flag_name, stray))}: goes with --time")
    save = opts.get("save_profile")
    if not save:
        return
    folder = Path(save).parent
    if Path(save).is_dir():
        raise ConfigError(f"--save-profile {save}: a folder; give the file to write")
    if not folder.is_dir():
        raise ConfigError(f"--save-profile {save}: no folder {folder} to write it in")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--save-profile {save}: cannot write in {folder}")


def regenerate_time(target: str, data: str, sizes: dict[str, Any], device: str,
                    opts: dict[str, Any]) -> tuple[Any, int]:
    """``((GenerateTime, GenerateProfile), longest prompt)`` of regenerating ``data``."""
    cfg = PrepareConfig(regenerate=True, max_new_tokens=sizes["max_new_tokens"],
                        batch_size=sizes["batch_size"], shard_rows=sizes["shard_rows"],
                        max_tokens=sizes["max_tokens"], device=device, dtype=sizes["dtype"],
                        backend="hf")
    profile = (GenerateProfile.load(opts["device_profile"]) if opts.get("device_profile")
               else None)
    gen, prof, _ = estimate_regenerate_time(data, target, cfg, world=opts.get("world", 1),
                                            profile=profile,
                                            conversations=opts.get("profile_steps"))
    if opts.get("save_profile"):
        prof.save(opts["save_profile"])
    return (gen, prof), gen.longest_prompt


def _baseline(stage: str, config: Any, target: str, device: str, *,
              tokenizer: bool = True) -> int:
    """The process's own resident bytes on CPU (0 on CUDA); ``tokenizer``: load the target's
    tokenizer first (``False``: this process holds it already)."""
    if str(device).startswith("cuda"):
        return 0
    return process_baseline(stage, config, _tokenizer_folder(target) if tokenizer else None)


def _tokenizer_folder(target: str) -> Any:
    """``target`` as a folder (a :class:`~pathlib.Path`) when it holds a tokenizer, else None."""
    from lengthwise.dflash.target import TOKENIZER_FILES

    folder = Path(target)
    if folder.is_dir() and any((folder / n).is_file() for n in TOKENIZER_FILES):
        return folder
    return None


def _time_lines(timing: Any) -> list[str]:
    """The ``--time`` lines: the run, then what priced it."""
    if timing is None:
        return []
    rt, prof = timing
    fit = prof.fit or {}
    err = (f" (median error {100 * fit['median_relative_error']:.1f} %)"
           if "median_relative_error" in fit else "")
    if hasattr(prof, "responses"):  # regeneration
        resp = np.asarray(prof.responses)
        errs = "; ".join(f"{k} {100 * fit[f'{k}_median_relative_error']:.1f} %"
                         for k in ("prefills", "steps") if f"{k}_median_relative_error" in fit)
        how = (f"priced per prefill {prof.per_prefill:.3g} s + {prof.per_prefill_token:.3g} s "
               f"a token + {prof.per_prefill_pair:.3g} s an attended pair, per decode step "
               f"{prof.per_step:.3g} s + {prof.per_row:.3g} s a row + "
               f"{prof.per_row_width:.3g} s a cached token a row attends"
               + (f", fitted on the regeneration of {fit['conversations']} conversations "
                  f"({fit['forwards']:,} forwards; median error {errs})"
                  if fit.get("conversations") else ""))
        return [f"predicted time of regeneration: {rt.render()}",
                f"  {how}; the continuous batch is replayed with each answer drawn from the "
                f"target's {resp.size} timed ones (median {int(np.median(resp))} tokens, "
                f"{100 * rt.cut_share:.0f} % cut at --max-new-tokens); later turns' prompts "
                "hold those answers, not the data's"]
    how = (f"priced per micro-batch {prof.micro_batch:.3g} s and per GFLOP "
           f"{prof.per_gflop:.3g} s" + (f", fitted on {fit['steps']} timed steps{err}"
                                        if fit.get("steps") else ""))
    return [f"predicted time: {rt.render()}", f"  {how}; checkpoints are saved in the "
            "background and not counted"]


def _print(est: Any, opts: dict[str, Any], size: int | None, timing: Any = None, *,
           disk: tuple[str, bool] | None = None) -> int:
    """Print a :class:`~lengthwise.dflash.cost.memory.StageMemory` (JSON with ``--json``),
    whether it fits ``size`` bytes, ``timing`` (``--time``) and ``disk``: a line on the disk
    a stage writes and whether it fits there."""
    from lengthwise.dflash.cost.memory import GIB, fits_line

    reserve = GIB if est.device == "cuda" else 0
    fits = (size is None or est.peak + reserve <= size) and (disk is None or disk[1])
    # a GPU whose peak is the training step's: the step's figures (docs/dflash.md shows them)
    step_only = est.device == "cuda" and est.step is not None and est.phase == "training step"
    if prints_here() and opts.get("json"):
        out = est.step.to_dict() if step_only else est.to_dict() | (
            {"step": est.step.to_dict()} if est.step is not None else {})
        if size is not None:
            out.update(device_memory_bytes=size, fits=fits)
        if timing is not None:
            out.update(time=timing[0].to_dict(), profile=timing[1].to_dict())
        print(json.dumps(out, indent=2))
    elif prints_here():
        lines = ([est.step.render(size)] if step_only else
                 [est.render(), *([est.step.render()] if est.step is not None else []),
                  *([fits_line(est.peak, size, reserve=reserve)] if size is not None else [])])
        print("\n".join([*lines, *([disk[0]] if disk else []), *_time_lines(timing)]))
    return 0 if fits else 1
