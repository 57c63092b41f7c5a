"""The two-arm order experiment on a DFlash draft trained from cached target features.

The same design as :mod:`experiments.arms` (:class:`~experiments.arms.ArmsDesign`: orders,
paired seeds, arms ``data`` and ``compute``, schedules), trained through the DFlash recipe
(:mod:`lengthwise.dflash.recipe`): the prepared chats split as ``dflash train`` splits
them (at ``data_seed``, the same held-out samples for every run), the target loaded by the
recipe once per process (:func:`~lengthwise.dflash.recipe._models`: the feature cache
checked against the target and the data, the mask token), a draft per run from the
recipe's :func:`~lengthwise.dflash.recipe.starting_draft` at the run's seed (with
``standardize_features``, its feature scale measured on the training samples), and
:class:`~lengthwise.dflash.train.DFlashTask` reading the target's features from the cache
(no target forward in a step) on :class:`~lengthwise.train.loop.TrainLoop`, one rank. The
draft's settings are :class:`~lengthwise.dflash.train_config.DFlashTrainConfig`'s defaults
with the overrides of :attr:`DFlashArms.train` (the real-target benchmark's shape by
default, :data:`SHAPE`).

A micro-batch's compute is counted from its blocks (:func:`draft_flops`): the draft's
forward and backward over the padded context (``fc`` and the layers' key/value
projections), over the slots its block tensors hold, its attention over the keys each
block sees, and the frozen LM head over the supervised slots; the target's forward is
cached and costs nothing. Anchors are drawn per sample and step, so the count depends on
the step a micro-batch is trained at.

Every run writes ``train_log.jsonl`` (one line per optimizer step) and ``micro_log.jsonl``
(one line per micro-batch: the loss log the doctor and the plots read) under
``out/ARM-SCHEDULE-bBATCH/ORDER-seedSEED/``, and measures the held-out draft at
``eval_points`` equal shares of its arm's axis: loss, teacher-forced accuracy per block
position, expected acceptance at temperature 0 (and at 1 at the end), with the held-out
anchors drawn at ``data_seed`` for every run. With ``prompts`` (a prompt file), each run
ends with the real thing: the draft proposing and the target verifying, greedily, on the
file's first ``prompt_limit`` prompts under the target's chat template
(:func:`real_acceptance`: ``acceptance_length``, METRICS.md's name).

Example::

    >>> DFlashArms(prepared="p", target="t", features="f").cells()[0]
    (('data', 'cosine', 2), ('sorted', 'random', 'bucket-random', 'interleave', 'stratified'))
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

from experiments.arms import ArmsDesign, arm_steps, drive_arm, plan_budgets
from experiments.loss_log import loss_log_figures

__all__ = ["SHAPE", "DFlashArms", "cached_rows", "draft_flops", "inputs", "real_acceptance",
           "run_dflash_arm", "run_draft", "run_job", "shared_start", "tokens_per_second"]

#: the draft and micro-batch of the real-target benchmarks (2 layers fed by 2 target layers,
#: blocks of 8, 32 anchors, micro-batches of 2,048 tokens) and their learning rate
SHAPE: dict[str, Any] = {"max_tokens": 2048, "max_len": 1024, "block_size": 8,
                         "draft_layers": 2, "num_features": 2, "num_anchors": 32, "lr": 3e-3}


def _recipe_warmup() -> float:
    from lengthwise.dflash.train_config import DFlashTrainConfig

    return float(DFlashTrainConfig.warmup_ratio)


@dataclass
class DFlashArms(ArmsDesign):
    """The experiment's design on a DFlash draft: a prepared folder, its target and feature
    cache, the held-out samples, and overrides of the recipe's training settings.

    ``batches``: micro-batches per optimizer step (one rank). The warm-up share is the
    recipe's ``warmup_ratio``.
    """

    prepared: str = ""
    target: str = ""
    features: str = ""
    eval_samples: int = 16
    train_samples: int | None = None  # a draw of the training samples (None: all)
    start: str | None = None  # a draft (exported, or a run or checkpoint) every run starts from
    prompts: str | None = None  # a prompt file: real acceptance on its first prompt_limit
    prompt_limit: int = 16
    prompt_tokens: int = 48  # new tokens decoded per prompt
    train: dict[str, Any] = field(default_factory=lambda: dict(SHAPE))
    orders: tuple[str, ...] = ("sorted", "random", "bucket-random", "interleave", "stratified")
    reduced: tuple[str, ...] = ("sorted", "random", "bucket-random", "interleave", "stratified")
    batches: tuple[int, ...] = (2,)
    full_batches: tuple[int, ...] = (2,)
    world: int = 1
    epochs: int = 3
    eval_points: int = 4
    warmup_share: float = field(default_factory=_recipe_warmup)

    POSITIVE = (*ArmsDesign.POSITIVE, "eval_samples", "prompt_limit", "prompt_tokens")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train_samples is not None and (not isinstance(self.train_samples, int)
                                               or self.train_samples < 1):
            raise ConfigError(f"train_samples must be a positive integer or None, got "
                              f"{self.train_samples!r}")
        if self.world != 1:
            raise ConfigError(f"world must be 1 (one rank trains the draft), got {self.world}")
        self.train_config(seed=0, batch=self.batches[0], steps=1)  # refuse bad overrides now

    def train_config(self, *, seed: int, batch: int, steps: int) -> Any:
        """The recipe's settings for a run: :class:`DFlashTrainConfig`'s defaults, then
        :attr:`train`, then the run's seed, ``batch`` micro-batches per step and ``steps``
        (the arm sets the learning rate itself: the loop's own schedule is flat)."""
        from lengthwise.dflash.train_config import DFlashTrainConfig

        fixed = {"steps": steps, "grad_accum": batch, "seed": seed, "warmup": 0,
                 "schedule": "constant", "threads": self.threads, "progress": False,
                 "checkpoint_every": 0, "device": "cpu"}
        clash = sorted(set(self.train) & set(fixed))
        if clash:
            raise ConfigError(f"train overrides {clash} are set by the experiment's design")
        return DFlashTrainConfig(**{**self.train, **fixed})

    @property
    def lr(self) -> float:
        """The peak learning rate of the runs."""
        return float(self.train_config(seed=0, batch=self.batches[0], steps=1).lr)


@dataclass
class _Context:
    """What every run of a design shares: the prepared data, its split, the tokenizer, and
    the recipe's target, mask token and feature cache (loaded once per process)."""

    data: Any
    split: Any
    tokenizer: Any
    models: Any = None


@lru_cache(maxsize=2)
def _context(prepared: str, target: str, eval_samples: int, data_seed: int,
             train_samples: int | None, train: str) -> _Context:
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import _split
    from lengthwise.dflash.target import load_tokenizer
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    data = open_prepared(prepared)
    cfg = DFlashTrainConfig(**json.loads(train), seed=data_seed, steps=1)
    split = _split(data, cfg, RunSettings(target=target, data=prepared,
                                          eval_samples=eval_samples,
                                          train_samples=train_samples))
    return _Context(data, split, load_tokenizer(target))


def context(design: DFlashArms) -> _Context:
    """The shared data of ``design`` (made once per process)."""
    return _context(design.prepared, design.target, design.eval_samples, design.data_seed,
                    design.train_samples, json.dumps(design.train, sort_keys=True))


def step_flops(draft: Any, vocab: int) -> Any:
    """Per-unit FLOPs of the draft's step (:class:`~lengthwise.dflash.cost.flops.StepFlops`),
    read from the draft's own weights, with the target's terms zero: its features are read
    from the cache."""
    import torch

    from lengthwise.dflash.cost.flops import StepFlops

    def weights(module: Any) -> int:
        return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))

    attn, n = draft.layers[0].self_attn, len(draft.layers)
    kv = attn.k_proj.weight.numel() + attn.v_proj.weight.numel()
    return StepFlops(target_token=0.0, target_pair=0.0,
                     context_token=3 * 2.0 * (draft.fc.weight.numel() + n * kv),
                     slot=3 * 2.0 * weights(draft.layers),
                     slot_key=3 * 4.0 * attn.q_proj.out_features * n,
                     head=3 * 2.0 * draft.config.hidden_size * vocab,
                     block_size=int(draft.config.block_size))


def draft_flops(flops: Any, blocks: Any) -> int:
    """FLOPs of the draft's forward and backward on ``blocks`` (one micro-batch): the padded
    context, the slots the block tensors hold, the keys each drawn block sees (its sample's
    tokens before its anchor and its own block) and the LM head over the supervised slots.

    Example::

        >>> import torch
        >>> from types import SimpleNamespace
        >>> from lengthwise.dflash.cost.flops import StepFlops
        >>> f = StepFlops(0.0, 0.0, 1.0, 10.0, 100.0, 1000.0, block_size=2)
        >>> b = SimpleNamespace(input_ids=torch.zeros(2, 5), anchors=torch.tensor([[3], [-1]]),
        ...                     starts=torch.zeros(2, 1, dtype=torch.long),
        ...                     labels=torch.tensor([[[-100, 7]], [[-100, -100]]]), supervised=1)
        >>> draft_flops(f, b)  # 10 context tokens, 4 slots, 3 + 2 keys, 1 head slot
        1550
    """
    rows, width = blocks.input_ids.shape
    used = blocks.anchors >= 0
    keys = int(((blocks.anchors - blocks.starts)[used] + flops.block_size).sum())
    return int(round(rows * width * flops.context_token + blocks.labels.numel() * flops.slot
                     + keys * flops.slot_key + int(blocks.supervised) * flops.head))


def _flops_counter(task: Any, collate: Any, sample: Any, flops: Any) -> Any:
    """``flops_of(ids, step)``: the FLOPs of the micro-batch of dataset indices ``ids``
    trained at ``step`` by ``task`` (its blocks drawn as that step draws them)."""
    def flops_of(ids: list[int], step: int) -> int:
        batch = collate([[sample(i) for i in ids]])
        return draft_flops(flops, task.blocks(batch, [list(ids)], step))

    return flops_of


_BUDGETS: dict[tuple[Any, ...], dict[str, int]] = {}


def budgets(design: DFlashArms, task: Any, sample: Any, flops: Any, batch: int,
            ) -> dict[str, int]:
    """A cell's budgets from ``random``'s plan at ``data_seed`` (as
    :func:`experiments.arms.budgets`): the steps of arm ``data``, their real tokens, and
    the draft FLOPs of ``epochs`` epochs of random's micro-batches in steps of ``batch``,
    ``task``'s anchors (a task at ``data_seed``). Made once per process and cell."""
    from lengthwise.train.loop import make_collator, make_sampler

    key = (design.prepared, design.eval_samples, design.train_samples, design.data_seed,
           design.epochs, batch, json.dumps(design.train, sort_keys=True))
    if key not in _BUDGETS:
        lengths = context(design).split.lengths
        sampler = make_sampler("random", lengths, task.cfg)
        flops_of = _flops_counter(task, make_collator("random", task.cfg, sampler), sample,
                                  flops)
        _BUDGETS[key] = plan_budgets(sampler, flops_of, epochs=design.epochs, batch=batch,
                                     tokens=int(lengths.sum()))
    return dict(_BUDGETS[key])


def held_out(task: Any, held: list[Any], *, seed: int, temperature: float) -> dict[str, Any]:
    """The draft's held-out figures: loss, accuracy overall and per block position, the
    acceptance length those imply, and the expected acceptance at ``temperature``."""
    from lengthwise.dflash.teacher_forced import evaluate_blocks

    cfg = task.cfg
    ev = evaluate_blocks(task.model, task.target, held, num_anchors=cfg.num_anchors, seed=seed,
                         head_chunk=cfg.head_chunk, max_slots=cfg.slot_budget,
                         max_tokens=cfg.max_tokens, temperature=temperature,
                         features=task.features)
    return {"eval_loss": _finite(ev.loss), "eval_accuracy": _finite(ev.accuracy),
            "slot_accuracy": [_finite(x) for x in ev.slot_accuracy],
            "simulated_acceptance": _finite(ev.simulated_acceptance_length),
            "alpha": [_finite(x) for x in ev.alpha or []],
            "expected_acceptance": _finite(ev.expected_acceptance)}


def tokens_per_second(records: list[dict[str, Any]], warmup: int) -> float | None:
    """Real tokens trained per second of the steps after the first ``warmup`` (all of them
    when the run is no longer), as ``tokens_per_second`` of METRICS.md.

    Example::

        >>> recs = [{"real_tokens": 10, "seconds": 5.0}, {"real_tokens": 30, "seconds": 1.0}]
        >>> tokens_per_second(recs, 1), round(tokens_per_second(recs, 2), 3)
        (30.0, 6.667)
    """
    timed = records[warmup:] if len(records) > warmup else records
    seconds = sum(float(r["seconds"]) for r in timed)
    return sum(int(r["real_tokens"]) for r in timed) / seconds if seconds > 0 else None


def _finite(x: Any) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def run_draft(design: DFlashArms, cfg: Any, run_dir: str | Path, device: Any) -> Any:
    """The draft a run of ``design`` at ``cfg`` (:meth:`DFlashArms.train_config`) starts
    from, as ``dflash train`` builds it (:func:`~lengthwise.dflash.recipe.starting_draft`:
    initialised from ``cfg.seed``, with ``standardize_features`` its feature scale measured
    on the training samples). The recipe's target, checked against the feature cache and
    the data, and its mask token are loaded once per process, into :func:`context`'s
    ``models`` (a grown target saved under the first ``run_dir``)."""
    from lengthwise.dflash.recipe import _models, starting_draft
    from lengthwise.dflash.train_config import RunSettings

    ctx = context(design)
    if ctx.models is None:
        run = RunSettings(target=design.target, data=design.prepared, out=str(run_dir),
                          eval_samples=design.eval_samples, features=design.features)
        ctx.models = _models(cfg, run, ctx.data, ctx.tokenizer, device, 0, ctx.split.train_idx)
    m = ctx.models
    if design.start:
        return shared_start(design.start, m, cfg)
    return starting_draft(m.target, cfg, mask_token_id=m.mask.id, data=ctx.data,
                          train_idx=ctx.split.train_idx, cache=m.cache)


def shared_start(path: str | Path, models: Any, cfg: Any) -> Any:
    """The draft at ``path`` (an exported draft, a run or a checkpoint:
    :func:`~lengthwise.dflash.load.open_draft`), in training mode, checked against the
    recipe's ``models`` (its target's layers and mask token) and ``cfg`` (block size, draft
    layers): the start every run of a design shares."""
    from lengthwise.dflash.load import open_draft

    draft, _ = open_draft(path)
    c = draft.config
    mine = {"block_size": c.block_size, "draft layers": c.num_layers,
            "target layers": list(c.target_layers), "mask token": c.mask_token_id}
    want = {"block_size": cfg.block_size, "draft layers": cfg.draft_layers,
            "target layers": list(models.target.layers), "mask token": models.mask.id}
    differ = [f"{k} {mine[k]} (the design's {want[k]})" for k in mine if mine[k] != want[k]]
    if differ:
        raise ConfigError(f"start {path}: not a draft of this design: {', '.join(differ)}")
    return draft.train()


def inputs(design: DFlashArms) -> dict[str, str]:
    """Digests of what every run of ``design`` reads besides its settings: the prepared
    samples (their fingerprint, as the feature cache records it), the cache's target
    weights and settings, and the start draft's weights. A path names a place, these its
    contents: runs saved from data or a start made again are checked, never assumed, to
    match (:class:`~experiments.saved.CellRuns`).

    Example::

        >>> sorted(inputs(design))                                      # doctest: +SKIP
        ['data', 'features', 'prompts', 'start']
    """
    import hashlib

    from lengthwise.dflash.features import RECORD

    def digest(blob: bytes) -> str:
        return hashlib.sha256(blob).hexdigest()[:16]

    record = json.loads((Path(design.features) / RECORD).read_text(encoding="utf-8"))
    made = {k: record[k] for k in ("settings", "target")}
    made["target"] = {k: v for k, v in made["target"].items() if k != "path"}
    out = {"data": record["data"]["fingerprint"][:16],
           "features": digest(json.dumps(made, sort_keys=True).encode("utf-8"))}
    if design.prompts:
        out["prompts"] = digest(Path(design.prompts).read_bytes())
    if design.start:
        from lengthwise.dflash.load import open_draft

        h = hashlib.sha256()
        for name, tensor in sorted(open_draft(design.start)[0].state_dict().items()):
            h.update(name.encode("utf-8"))
            h.update(tensor.detach().float().contiguous().numpy().tobytes())
        out["start"] = h.hexdigest()[:16]
    return out


def real_acceptance(design: DFlashArms, draft: Any, *, lookup: bool = False) -> dict[str, Any]:
    """The draft's real acceptance at temperature 0 on the design's held-out prompts (the
    first ``prompt_limit`` of ``prompts``, rendered by the target's chat template, up to
    ``prompt_tokens`` new tokens each): ``acceptance_length`` and its interval over the
    prompts; ``lookup``: prompt lookup's on the same prompts too (``block_size - 1``
    candidate tokens a forward). Empty without ``prompts``. After :func:`run_draft`."""
    if not design.prompts:
        return {}
    from lengthwise.dflash.chat import read_prompt_file, render_prompts
    from lengthwise.dflash.evaluate import evaluate_set
    from lengthwise.dflash.regenerate import stop_ids

    ctx = context(design)
    target = ctx.models.target
    convs = read_prompt_file(design.prompts)[: design.prompt_limit]
    row = evaluate_set(draft, target, render_prompts(convs, ctx.tokenizer),
                       name=Path(design.prompts).stem, temperatures=(0.0,),
                       max_new_tokens=design.prompt_tokens, batch_size=8,
                       eos=stop_ids(ctx.tokenizer, target.model.config,
                                    getattr(target.model, "generation_config", None)),
                       seed=design.data_seed,
                       check=False, accuracy=False,
                       lookup_tokens=draft.config.block_size - 1 if lookup else None)[0]
    keys = ["acceptance_length", "acceptance_interval", "new_tokens", "verify_forwards"]
    if lookup:
        keys += ["baseline", "baseline_acceptance_length", "baseline_acceptance_interval"]
    return {k: row[k] for k in keys}


def cached_rows(design: DFlashArms) -> Any:
    """The cached target features of the training samples (their ids) and of the held-out
    batches (ids from ``HELD_OUT_FIRST_ID``), after :func:`run_draft` loaded the models."""
    from lengthwise.dflash.features import CachedRows
    from lengthwise.dflash.teacher_forced import HELD_OUT_FIRST_ID

    ctx = context(design)
    split = ctx.split

    def dataset_index(sample_id: int) -> int:
        return int(split.train_idx[sample_id] if sample_id < HELD_OUT_FIRST_ID
                   else split.held_idx[sample_id - HELD_OUT_FIRST_ID])

    return CachedRows(ctx.models.cache, ctx.models.target.layers, dataset_index)


def run_dflash_arm(job: tuple[str, str, int, str, int], design: DFlashArms, *,
                   out: str | Path) -> dict[str, Any]:
    """Train one (arm, schedule, batch, order, seed) run of ``design``; its figures, curve,
    and the paths of its step and micro-batch logs."""
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.train.device import configure_torch, pick_device
    from lengthwise.train.loop import TrainLoop, make_sampler

    arm, schedule, batch, order, seed = job
    ctx = context(design)
    split, data = ctx.split, ctx.data
    run_dir = Path(out) / f"{arm}-{schedule}-b{batch}" / f"{order}-seed{seed}"
    device = pick_device("cpu")
    configure_torch(device, threads=design.threads, deterministic=True)
    cfg = design.train_config(seed=seed, batch=batch, steps=1)
    draft = run_draft(design, cfg, run_dir, device)
    m = ctx.models

    def sample(i: int) -> dict[str, np.ndarray]:  # training sample i as trained
        return {k: v[: cfg.max_len] for k, v in data.sample(int(split.train_idx[i])).items()}

    features = cached_rows(design)
    flops = step_flops(draft, int(m.target.embed.weight.shape[0]))
    counting = DFlashTask(draft, m.target, dataclasses.replace(cfg, seed=design.data_seed),
                          order="random")
    budget = budgets(design, counting, sample, flops, batch)
    cfg = dataclasses.replace(cfg, steps=budget["steps"])
    task = DFlashTask(draft, m.target, cfg, order=order, features=features)
    sampler = make_sampler(order, split.lengths, cfg)
    loop = TrainLoop(task, order, split.lengths, sample, cfg, run_dir=run_dir, device=device,
                     sampler=sampler, micro_log=True)
    flops_of = _flops_counter(task, loop.collate, sample, flops)
    try:
        steps = arm_steps(arm, loop, split.lengths, budget, batch=batch, max_len=cfg.max_len,
                          flops_of=flops_of)
        trained = drive_arm(loop, steps, arm, budget, schedule=schedule, lr=cfg.lr,
                            warmup_share=design.warmup_share, flops_of=flops_of,
                            points=design.eval_points,
                            evaluate=lambda: held_out(task, split.held, seed=design.data_seed,
                                                      temperature=0.0))
    finally:
        loop.close()
    records = trained.pop("records")
    final = trained["curve"][-1]
    micro = [json.loads(line) for line in loop.micro_logger.path.read_text(
        encoding="utf-8").splitlines() if line.strip()]
    micro = [x for x in micro if "step" in x and "event" not in x]
    hot = held_out(task, split.held, seed=design.data_seed, temperature=1.0)
    real = real_acceptance(design, draft)
    return {"arm": arm, "schedule": schedule, "batch": batch, "order": order, "seed": seed,
            **trained, "budget": budget,
            **{k: final[k] for k in ("eval_loss", "eval_accuracy", "slot_accuracy",
                                     "simulated_acceptance", "expected_acceptance")},
            "expected_acceptance_t1": hot["expected_acceptance"], "alpha_t1": hot["alpha"],
            **real, "tokens_per_second": tokens_per_second(records, cfg.timing_warmup),
            "skipped_steps": sum(bool(r.get("skipped")) for r in records),
            "edges": [int(e) for e in sampler.edges or []],
            "epochs_seen": trained["real_tokens"] / float(split.lengths.sum()),
            "micro_loss": [None if x.get("loss") is None else round(float(x["loss"]), 5)
                           for x in micro],
            "micro_bucket": [(x.get("buckets") or [None])[0] for x in micro],
            "loss_log": loss_log_figures(loop.micro_logger.path, order=order),
            "step_loss_log": loss_log_figures(loop.log_path, order=order),
            "log": str(loop.log_path), "micro_log": str(loop.micro_logger.path)}


def run_job(args: tuple[Any, ...]) -> dict[str, Any]:
    """:func:`run_dflash_arm` of ``(job, design, out)``: one job of a worker process."""
    job, design, out = args
    return run_dflash_arm(job, design, out=out)
