"""The settings of a DFlash training run: the loop's, plus the draft's block, layers and anchors.

No torch here: the command line reads its defaults and help from this class without
loading torch.

A resumed run's settings are each either applied and said, or refused by name.
Every checkpoint of a run holds ``train_settings.json`` (:func:`settings_json`): the
loop's and the run's settings, the prepared data's fingerprint and its tokenizer hash. On
``--resume``, :func:`check_resume` compares them with the settings given, before anything
is loaded:

- settings that fix the draft's shape or the data and its order (:data:`REFUSED`: block
  size, layers, token budget, seed, order, held-out split, the prepared data) cannot
  change in a resumed run: a :class:`~lengthwise.errors.ConfigError` names each flag with
  its old and new value;
- every other change (learning rate, schedule, steps, clipping, anchors, ...) is applied
  from the resumed step on and listed, so the run says what it does.

A checkpoint without this file, written by an older lengthwise, is refused naming it.
:func:`apply_optimizer_settings` puts the learning rate and weight decay given into the
optimizer and schedule a checkpoint restored.

Example::

    >>> cfg = DFlashTrainConfig(steps=100)
    >>> cfg.warmup_steps, cfg.schedule, cfg.weight_decay
    (4, 'cosine', 0.0)
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_field, flag_name
from lengthwise.planning.vocabulary import ORDERS
from lengthwise.train.config import PACKED, LoopConfig, check_finite, check_positive

__all__ = ["INITS", "LABELS", "REFUSED", "SETTINGS_FILE", "DFlashTrainConfig", "RunSettings",
           "apply_optimizer_settings", "changed", "check_resume", "settings_json"]

#: how the draft's weights start: ``target`` (copied from the target's top), ``random`` (seeded)
INITS = ("target", "random")
#: what block slots learn: ``data`` (the next tokens), ``target_kl`` (the target's distribution)
LABELS = ("data", "target_kl")


@dataclass
class DFlashTrainConfig(LoopConfig):
    """Loop settings plus the draft's: block size, layers, anchors per sample.

    The defaults follow DFlash training runs: AdamW without weight decay, linear
    warm-up over ``warmup_ratio`` of the steps, then cosine; gradient clipping 1.0.
    """

    lr: float = flag_field(6e-4, "peak learning rate")
    schedule: str = flag_field("cosine", "learning-rate schedule after warm-up",
                               choices=("cosine", "constant"))
    weight_decay: float = flag_field(0.0, "AdamW weight decay")
    warmup_ratio: float = flag_field(0.04, "warm-up share of the steps")
    spike_guard: bool = True
    block_size: int = flag_field(16, "draft block size")
    draft_layers: int = flag_field(1, "draft decoder layers")
    num_features: int | None = flag_field(None, "target layers feeding the draft",
                                          none="draft_layers", type=int)
    num_anchors: int = flag_field(512, "anchors drawn per sample and step")
    gamma: float | None = flag_field(None, "loss decay over block slots",
                                     none="7 for block 16, 5 for 10, 4 for 8", type=float)
    max_slots: int | None = flag_field(None, "draft slots (anchors x block size) per "
                                             "micro-batch", none="block_size x max_tokens",
                                       type=int)
    head_chunk: int = flag_field(1024, "supervised slots per LM-head and cross-entropy chunk")
    flex_attention: bool | None = None  # block-sparse flex mask (None: on CUDA), else dense
    init: str = flag_field(
        "target", "the draft's starting weights: target (layer i copies the target's decoder "
        "layer from the top, the final norm the target's, fc the identity on the deepest "
        "feature), or random (seeded)", choices=INITS)
    zero_init_output: bool = flag_field(
        False, "start o_proj and down_proj of the draft's layers at zero (each layer starts as "
        "the identity)")
    standardize_features: bool = flag_field(
        False, "divide each feature dimension by its root mean square over the first training "
        "tokens before fc (folded into fc at export)")
    labels: str = flag_field(
        "data", "what block slots learn: data (cross-entropy on the next tokens) or target_kl "
        "(KL to the target's distribution; needs --features with the last hidden state)",
        choices=LABELS)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, allowed in (("init", INITS), ("labels", LABELS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, "
                                  f"got {getattr(self, name)!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio}")
        check_positive(self, "block_size", "draft_layers", "num_anchors", "head_chunk")
        if self.num_features is not None:
            check_positive(self, "num_features")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        g = self.gamma
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float))
                              or not 0 < g < math.inf):
            raise ConfigError(f"gamma must be a finite number > 0 (or None for the block "
                              f"size's default), got {g!r}")
        if self.max_slots is not None:
            check_positive(self, "max_slots")
            if self.max_slots < self.block_size:
                raise ConfigError(f"max_slots={self.max_slots} holds no block of block_size="
                                  f"{self.block_size}; give max_slots >= block_size")

    @property
    def slot_budget(self) -> int:
        """Most draft slots a micro-batch holds: ``max_slots``, else ``block_size * max_tokens``.

        Without ``max_slots`` a sample of ``n`` tokens has at most ``n - 1`` anchors, so a
        micro-batch of ``max_tokens`` tokens never holds more than the default.

        Example::

            >>> DFlashTrainConfig(max_tokens=16384, max_len=8192, max_slots=32768).slot_budget
            32768
        """
        return self.max_slots or self.block_size * self.max_tokens

    @property
    def warmup_steps(self) -> int:
        """``warmup`` when given, else ``warmup_ratio`` of the steps (at least 1)."""
        if self.warmup is not None:
            return self.warmup
        return max(1, round(self.warmup_ratio * self.steps))


@dataclass
class RunSettings:
    """What a training run needs besides :class:`DFlashTrainConfig`."""

    target: str = flag_field(MISSING, "local Hugging Face causal LM folder", metavar="PATH")
    data: str = flag_field(MISSING, "folder written by `dflash prepare`", metavar="FOLDER")
    out: str = flag_field("dflash_run", "run folder", metavar="FOLDER")
    order: str = flag_field("stratified", "batching order of the sampler, or packed")
    epochs: float | None = flag_field(None, "passes over the training samples (sets --steps "
                                            "from the plan)", type=float)
    eval_samples: int = flag_field(64, "prepared samples held out for evaluation")
    eval_every: int | None = flag_field(None, "steps between held-out evaluations (0: none)",
                                        none="a tenth of the run", type=int)
    eval_anchors: int | None = flag_field(None, "anchors per held-out sample",
                                          none="num_anchors", type=int)
    wandb: bool = flag_field(False, "also log to Weights & Biases")
    wandb_project: str | None = flag_field(None, "W&B project (with --wandb)", type=str)
    tensorboard: str | None = flag_field(None, "also log to TensorBoard event files in this "
                                               "folder", type=str)
    overwrite: bool = flag_field(False, "remove an earlier run's checkpoints and final draft "
                                        "from --out first (without it, or --resume, such a "
                                        "folder is refused)")
    features: str | None = flag_field(None, "a feature cache of --data from `dflash features`: "
                                            "the target's features are read from it, not "
                                            "computed each step", type=str)
    split_seed: int | None = None  # seed of the held-out draw (default: the run's seed)
    train_samples: int | None = flag_field(None, "train on a seeded draw of this many training "
                                                 "samples (a smaller draw lies inside a larger "
                                                 "one)", none="all", type=int)

    def __post_init__(self) -> None:
        if self.order not in (*ORDERS, PACKED):
            raise ConfigError(f"order must be one of {', '.join((*ORDERS, PACKED))}, "
                              f"got {self.order!r}")
        for name in ("eval_samples", "eval_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if self.epochs is not None:
            check_finite(self, "epochs", positive=True)
        for name in ("eval_anchors", "train_samples"):
            if getattr(self, name) is not None:
                check_positive(self, name)


#: file name of the run's settings inside every checkpoint folder
SETTINGS_FILE = "train_settings.json"
#: settings a resumed run cannot change: the draft's shape, the data, its split and order
REFUSED = ("block_size", "draft_layers", "num_features", "standardize_features", "max_tokens",
           "max_len", "grad_accum", "seed", "buckets", "pad_multiple", "order", "eval_samples",
           "split_seed", "data")
#: fields that are not settings of the run (or change every time)
_SKIP = ("progress", "resume", "overwrite", "target", "data", "out", "epochs")


def snapshot(cfg: Any, run: Any, data_info: dict[str, Any]) -> dict[str, Any]:
    """The settings compared on resume: the loop's, the run's and the data's fingerprint."""
    return {"cfg": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _SKIP},
            "run": {k: v for k, v in dataclasses.asdict(run).items() if k not in _SKIP},
            "data": _data_identity(data_info)}


def _data_identity(info: dict[str, Any]) -> str | None:
    """The prepared data's fingerprint (source and settings) and its tokenizer's hash."""
    fp = info.get("fingerprint")
    if fp is None:
        return None
    tok = info.get("tokenizer_sha256")
    return f"{fp}:{tok[:16]}" if tok else fp


def settings_json(cfg: Any, run: Any, data_info: dict[str, Any]) -> str:
    """The text of ``train_settings.json``."""
    return json.dumps(snapshot(cfg, run, data_info), indent=2, sort_keys=True) + "\n"


def changed(new: dict[str, Any], old: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(applied, refused)``: the settings that differ, as ``--flag old -> new``.

    Example::

        >>> old = {"cfg": {"lr": 0.01, "block_size": 4}, "run": {}, "data": None}
        >>> changed({"cfg": {"lr": 0.001, "block_size": 4}, "run": {}, "data": None}, old)
        (['--lr 0.01 -> 0.001'], [])
        >>> changed({"cfg": {"lr": 0.01, "block_size": 8}, "run": {}, "data": None}, old)
        ([], ['--block-size 4 -> 8'])
    """
    applied, refused = [], []
    pairs = [(k, v, new["cfg"].get(k)) for k, v in old.get("cfg", {}).items()]
    pairs += [(k, v, new["run"].get(k)) for k, v in old.get("run", {}).items()]
    for name, before, now in pairs:
        if before == now:
            continue
        line = f"{flag_name(name)} {before} -> {now}"
        (refused if name in REFUSED else applied).append(line)
    if old.get("data") is not None and old["data"] != new.get("data"):
        refused.append(f"--data (other data or tokenizer: {old['data']} -> "
                       f"{new.get('data')})")
    return applied, refused


def check_resume(checkpoint: Path, cfg: Any, run: Any, data_info: dict[str, Any]) -> list[str]:
    """Refuse settings a resume from ``checkpoint`` cannot change; return the changes applied."""
    new = snapshot(cfg, run, data_info)
    file = checkpoint / SETTINGS_FILE
    if not file.is_file():
        raise ConfigError(f"--resume from {checkpoint}: it holds no {SETTINGS_FILE}: it was "
                          "written by an older lengthwise, which this version does not resume; "
                          "start a new run in another --out")
    try:
        old = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(old, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise ConfigError(f"{file}: not readable ({exc})") from None
    applied, refused = changed(new, old)
    if refused:
        raise ConfigError(f"--resume from {checkpoint}: {', '.join(refused)}: a resumed run "
                          "keeps the draft's shape, its data and their order; give the "
                          "checkpoint's values, or start a new run in another --out")
    return applied


def apply_optimizer_settings(optimizer: Any, scheduler: Any, cfg: Any) -> list[str]:
    """Put ``cfg.lr`` and ``cfg.weight_decay`` into a restored optimizer and schedule.

    A checkpoint restores the learning rate and weight decay it was saved with; a
    resumed run uses the ones given. Returns the changes made, as ``--flag old -> new``.
    """
    said = []
    before = float(scheduler.base_lrs[0])
    if before != cfg.lr:
        scheduler.base_lrs = [cfg.lr for _ in scheduler.base_lrs]
        for group, rule in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
            group["initial_lr"] = cfg.lr
            group["lr"] = cfg.lr * rule(scheduler.last_epoch)
        said.append(f"--lr {before:g} -> {cfg.lr:g}")
    decay = optimizer.param_groups[0]["weight_decay"]
    if decay != cfg.weight_decay:
        optimizer.param_groups[0]["weight_decay"] = cfg.weight_decay
        said.append(f"--weight-decay {decay:g} -> {cfg.weight_decay:g}")
    return said
