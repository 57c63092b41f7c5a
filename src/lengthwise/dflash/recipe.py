"""Train a DFlash draft for a local target on prepared chat data (``lengthwise dflash train``).

:func:`train_draft` loads the frozen target (bf16 on CUDA, fp32 on CPU), builds
the draft from the target's config, holds out ``eval_samples`` prepared samples,
and trains on the rest with :class:`~lengthwise.train.loop.TrainLoop` and
:class:`~lengthwise.dflash.train.DFlashTask` (DDP for the draft under
``torchrun``, the target replicated on every rank). Every ``eval_every`` steps,
rank 0 evaluates the draft teacher-forced on the held-out samples and the step
record gets ``eval_loss``, ``eval_accuracy``, ``eval_simulated_acceptance_length`` and
``eval_expected_acceptance`` (at temperature 1, from ``1 - TV(p_draft, p_target)`` per block
slot; :func:`~lengthwise.dflash.teacher_forced.evaluate_blocks`). The run folder holds
``train_log.jsonl``, ``checkpoints/`` (exact resume with ``resume=True``),
``draft_config.json``, at the end ``final/draft.pt`` and, when the mask token needed a
row the target lacked, ``target/``: the target grown by that row, with its tokenizer
(export, evaluate and serve the draft with it).

The run folder's lock is held from the start (a second run into it stops before
touching it). A folder holding an earlier run's checkpoints is refused unless the run
resumes it (``resume``) or replaces it (``overwrite``: its checkpoints and final draft
are removed first). The target's tokenizer must be the one the data was prepared with
(``prepare.json``). A resumed run refuses settings that would change the draft's shape
or the data and applies, and lists, every other change
(:mod:`~lengthwise.dflash.train_config`).

Example::

    $ torchrun --nproc-per-node 8 -m lengthwise dflash train --target ./Qwen3-8B \\
          --data prepared/ --out run/ --device cuda --steps 90000
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lengthwise.atomic import atomic_open
from lengthwise.dflash.draft_init import warm_start, zero_output
from lengthwise.dflash.features import CachedRows, open_features
from lengthwise.dflash.load import FINAL_STEP
from lengthwise.dflash.mask_token import ensure_mask_token, save_grown_target
from lengthwise.dflash.model import DFlashConfig, DFlashDraft, feature_scale
from lengthwise.dflash.objective import target_layer_ids
from lengthwise.dflash.out_lock import sole_writer
from lengthwise.dflash.prepared import open_prepared
from lengthwise.dflash.target import Target, check_causal_lm, load_target, load_tokenizer
from lengthwise.dflash.target_match import TOKENIZER_FIELDS, check_tokenizer, weights_record
from lengthwise.dflash.teacher_forced import HELD_OUT_FIRST_ID, evaluate_blocks, held_out_batches
from lengthwise.dflash.train import DFlashTask, check_budget
from lengthwise.dflash.train_config import (
    SETTINGS_FILE,
    DFlashTrainConfig,
    RunSettings,
    apply_optimizer_settings,
    check_resume,
    settings_json,
)
from lengthwise.disk import reporting_full_disk
from lengthwise.errors import ConfigError, DataError
from lengthwise.progress import progress as bar
from lengthwise.train.checkpoint import latest_checkpoint
from lengthwise.train.checkpoint.state import state_bytes
from lengthwise.train.device import (
    autocast_dtype,
    barrier,
    configure_torch,
    pick_device,
    rank_world,
    say,
    setup_distributed,
)
from lengthwise.train.loop import TrainLoop, make_sampler
from lengthwise.train.step_logger.rollback import log_files
from lengthwise.train.stop import EXIT_STATUS as STOPPED
from lengthwise.train.stop import StopRequest

__all__ = ["EvalTask", "new_draft", "starting_draft", "train_draft"]

def new_draft(target: Any, cfg: DFlashTrainConfig, *, mask_token_id: int,
              feature_scale: Any = None, samples: Iterable[Any] = ()) -> Any:
    """A draft sized from the target's config, initialised from ``cfg.seed``, on its device.

    Its blocks are filled with ``mask_token_id``, a row of the target's vocabulary
    (:func:`~lengthwise.dflash.mask_token.ensure_mask_token` adds one when the
    tokenizer has none). ``cfg.init``, ``cfg.zero_init_output``: how its weights start
    (:mod:`~lengthwise.dflash.draft_init`); with ``cfg.standardize_features`` the draft
    scales its features by ``feature_scale``
    (:func:`~lengthwise.dflash.model.feature_scale`; ones when not given).
    ``samples``: token-id sequences of training text, on which ``init=target`` measures
    the target's query and key sizes (:func:`~lengthwise.dflash.draft_init.warm_start`).

    The global random state is left as it was.

    Example::
        >>> import torch, transformers
        >>> from lengthwise.dflash.target import Target
        >>> t = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=4,
        ...                              num_attention_heads=2, intermediate_size=32)
        >>> target = Target(transformers.LlamaForCausalLM(t), layers=[1, 2])
        >>> d = new_draft(target, DFlashTrainConfig(block_size=4, steps=2), mask_token_id=39,
        ...               samples=[torch.arange(30) % 39])
        >>> d.config.block_size, d.config.target_layers, d.training
        (4, [1, 2], True)
    """


    dcfg = DFlashConfig.from_target(target.model.config, num_layers=cfg.draft_layers,
                                    block_size=cfg.block_size, gamma=cfg.gamma,
                                    target_layers=target.layers, mask_token_id=mask_token_id,
                                    standardize_features=cfg.standardize_features)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        draft = DFlashDraft(dcfg)
    draft = draft.to(target.device)
    if cfg.standardize_features and feature_scale is not None:
        draft.feature_scale.copy_(feature_scale)
    if cfg.init == "target":
        warm_start(draft, target, samples)
    if cfg.zero_init_output:
        zero_output(draft)
    return draft.train()


class EvalTask(DFlashTask):
    """:class:`DFlashTask` whose step record gets held-out figures every ``every`` steps.

    Rank 0 evaluates after the update of every ``every``-th step (the other ranks
    leave the fields out: only rank 0 writes the log).
    """

    def __init__(self, *args: Any, held: list[tuple[dict[str, Any], Any]], every: int,
                 anchors: int, main: bool, settings: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held, self.every, self.anchors, self.main = held, every, anchors, main
        self.settings = settings  # train_settings.json, saved with every checkpoint
        self._step = 0

    def checkpoint_files(self) -> dict[str, str]:
        """``draft_config.json`` and the run's ``train_settings.json`` (checked on resume)."""

        files = super().checkpoint_files()
        if self.settings is not None:
            files[SETTINGS_FILE] = self.settings
        return files

    def prepare(self, batch: dict[str, Any], rows: list[list[int]], step: int) -> Any:
        self._step = step + 1  # the step this micro-batch's update completes
        return super().prepare(batch, rows, step)

    def evaluate(self) -> dict[str, Any]:
        """Held-out loss, accuracy, simulated and expected acceptance of the draft as it is.

        ``eval_expected_acceptance``: ``1 + sum_k prod_{j<=k} alpha_j`` with ``alpha_j`` the
        mean ``1 - TV(p_draft, p_target)`` of block slot ``j`` at temperature 1.
        """
        cfg = self.cfg
        ev = evaluate_blocks(self.model, self.target, self.held, num_anchors=self.anchors,
                             seed=cfg.seed, amp=self.amp, head_chunk=cfg.head_chunk,
                             max_slots=cfg.slot_budget, max_tokens=cfg.max_tokens,
                             temperature=1.0, features=self.features)
        return {"eval_loss": _finite(ev.loss), "eval_accuracy": _finite(ev.accuracy),
                "eval_simulated_acceptance_length": _finite(ev.simulated_acceptance_length),
                "eval_expected_acceptance": _finite(ev.expected_acceptance)}

    def step_fields(self, stats: dict[str, float]) -> dict[str, Any]:
        out = super().step_fields(stats)
        if self.main and self.held and self.every and self._step % self.every == 0:
            out.update(self.evaluate())
        return out


def _with_epochs(cfg: DFlashTrainConfig, run: RunSettings, lengths: np.ndarray, rank: int,
                 world: int) -> DFlashTrainConfig:
    """``cfg`` with ``steps`` = ``run.epochs`` passes of the planned optimizer steps."""


    per_epoch = len(make_sampler(run.order, lengths, cfg, rank=rank, world=world)
                    ) // cfg.grad_accum
    if per_epoch < 1:
        raise ConfigError(f"an epoch has fewer than grad_accum={cfg.grad_accum} micro-batches "
                          "per rank; use more data, a smaller max_tokens or grad_accum")
    steps = run.epochs * per_epoch
    if not np.isfinite(steps):
        raise ConfigError(f"epochs {run.epochs!r} of {per_epoch:,} steps each are more steps "
                          "than can be counted")
    return dataclasses.replace(cfg, steps=max(1, round(steps)))


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def train_draft(cfg: DFlashTrainConfig, run: RunSettings, *, progress: bool = True,
                ) -> dict[str, Any]:
    """Train (or resume) a draft; return rank 0's summary (``{}`` on the other ranks)."""

    config = check_causal_lm(run.target)
    if cfg.resume and run.overwrite:
        raise ConfigError("give --resume (continue the run in --out) or --overwrite (remove "
                          "it and start again), not both")
    data = open_prepared(run.data)
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    top = data.max_token_id()
    if vocab is not None and top >= int(vocab):
        raise DataError(f"--data {run.data}: token id {top} is outside the vocabulary of "
                        f"--target {run.target} ({vocab} tokens); prepare the data with this "
                        "target's tokenizer")
    tokenizer = load_tokenizer(run.target)
    check_tokenizer(data.info, tokenizer, data=run.data, target=run.target)
    check_held_out(data, run.eval_samples)
    group = setup_distributed(cfg.device)
    device = pick_device(cfg.device, group)
    with sole_writer(run.out, "dflash train", group):
        return _train_locked(cfg, run, data, tokenizer, group, device, progress)


def check_held_out(data: Any, eval_samples: int) -> None:
    """Refuse holding out ``eval_samples`` of prepared ``data`` unless some are left to train
    on (a :class:`ConfigError` naming ``eval_samples``)."""
    if eval_samples >= len(data):
        raise ConfigError(f"eval_samples ({eval_samples}) must be fewer than the "
                          f"{len(data)} prepared samples in {data.folder}")


def split_samples(data: Any, cfg: DFlashTrainConfig, eval_samples: int, *,
                  seed: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """``(held-out ids, training ids, dropped)`` of prepared ``data`` as training takes them.

    The held-out samples are drawn from ``(seed, 7919)`` (default seed: ``cfg.seed``;
    runs of several seeds give one ``seed`` to hold out the same samples), fewer than all
    (:func:`check_held_out`); training samples left with no two consecutive supervised
    tokens after the cut to ``cfg.max_len`` are dropped and counted, and a budget that
    leaves none is refused (a :class:`ConfigError` naming it).
    """
    check_held_out(data, eval_samples)
    perm = np.random.default_rng([cfg.seed if seed is None else seed, 7919]
                                 ).permutation(len(data))
    held_idx, train_idx = np.sort(perm[:eval_samples]), np.sort(perm[eval_samples:])
    unlearnable = data.unlearnable_when_cut(train_idx, cfg.max_len)
    dropped = int(unlearnable.sum())
    if dropped == train_idx.size:  # the budget named with the least value, where it is the cause
        def cut(i: int) -> dict[str, np.ndarray]:
            return {k: v[: cfg.max_len] for k, v in data.sample(int(train_idx[i])).items()}

        check_budget(cut, lambda i: data.sample(int(train_idx[i])), int(train_idx.size), cfg)
        raise ConfigError(f"max_len {cfg.max_len}: every training sample is cut before two "
                          "consecutive supervised tokens, so none has any loss; raise max_len")
    return held_idx, train_idx[~unlearnable], dropped


@dataclass
class _Split:
    """The data phase: training ids, held-out ids and batches, lengths as trained, counts."""

    train_idx: np.ndarray
    held_idx: np.ndarray
    lengths: np.ndarray
    held: list[tuple[dict[str, Any], list[list[int]]]]
    dropped: int
    cut: int


def _split(data: Any, cfg: DFlashTrainConfig, run: RunSettings) -> _Split:
    """Held-out and training samples as training takes them (cut to ``max_len``)."""
    held_idx, train_idx, dropped = split_samples(data, cfg, run.eval_samples,
                                                 seed=run.split_seed)
    if run.train_samples is not None:
        if run.train_samples > train_idx.size:
            raise ConfigError(f"train_samples {run.train_samples}: the data has only "
                              f"{train_idx.size} training samples")
        seed = cfg.seed if run.split_seed is None else run.split_seed
        draw = np.random.default_rng([seed, 7920]).permutation(train_idx.size)
        train_idx = np.sort(train_idx[draw[: run.train_samples]])
    held = held_out_batches([{k: v[: cfg.max_len] for k, v in data.sample(int(j)).items()}
                             for j in held_idx], max_tokens=cfg.max_tokens)
    return _Split(train_idx, held_idx, np.minimum(data.lengths[train_idx], cfg.max_len), held,
                  dropped, int((data.lengths[train_idx] > cfg.max_len).sum()))


@dataclass
class _Models:
    """The model phase: the frozen target, the draft, the mask token, the feature cache."""

    target: Target
    draft: Any
    mask: Any
    serve: Path  # the target to export, evaluate and serve the draft with
    rows_before: int  # the target's embedding rows before the mask token
    cache: Any


#: training tokens the feature scale is measured on (``standardize_features``)
SCALE_TOKENS = 16384


def _first_ids(data: Any, train_idx: np.ndarray, cfg: DFlashTrainConfig
               ) -> Iterator[np.ndarray]:
    """The token ids of the training samples in order, each cut to ``cfg.max_len``."""
    for j in train_idx:
        yield np.asarray(data.sample(int(j))["input_ids"][: cfg.max_len])


def _first_features(target: Target, data: Any, train_idx: np.ndarray, cache: Any,
                    cfg: DFlashTrainConfig) -> Iterator[Any]:
    """The target's features ``(tokens, F)`` of the first training samples, one at a time,
    up to :data:`SCALE_TOKENS` tokens (read from ``cache`` when there is one)."""
    seen = 0
    for j in train_idx:
        n = int(min(data.lengths[j], cfg.max_len))
        if cache is not None:
            rows = torch.as_tensor(cache.features(int(j), target.layers, n))
        else:
            ids = torch.as_tensor(np.asarray(data.sample(int(j))["input_ids"][:n]))
            with torch.no_grad():
                rows = target.features(ids[None].to(target.device))[0].float().cpu()
        yield rows
        seen += n
        if seen >= SCALE_TOKENS:
            return


def starting_draft(target: Target, cfg: DFlashTrainConfig, *, mask_token_id: int, data: Any,
                   train_idx: np.ndarray, cache: Any = None) -> Any:
    """The draft ``dflash train`` starts from: :func:`new_draft`, and with
    ``cfg.standardize_features`` its feature scale measured on the first training samples
    ``train_idx`` of prepared ``data`` (up to :data:`SCALE_TOKENS` tokens cut to
    ``cfg.max_len``; their features read from the feature ``cache`` when given).

    Example::
        >>> import numpy as np, transformers
        >>> from lengthwise.dflash.target import Target
        >>> t = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=4,
        ...                              num_attention_heads=2, intermediate_size=32)
        >>> target = Target(transformers.LlamaForCausalLM(t), layers=[1, 2])
        >>> class Chats(list):  # two prepared samples
        ...     lengths = np.array([12, 9])
        ...     def sample(self, j): return self[j]
        >>> data = Chats({"input_ids": np.arange(1, n + 1)} for n in (12, 9))
        >>> cfg = DFlashTrainConfig(block_size=4, steps=2, standardize_features=True)
        >>> d = starting_draft(target, cfg, mask_token_id=39, data=data, train_idx=np.arange(2))
        >>> bool((d.feature_scale != 1).all())
        True
    """
    scale = None
    if cfg.standardize_features:
        scale = feature_scale(_first_features(target, data, train_idx, cache, cfg))
    return new_draft(target, cfg, mask_token_id=mask_token_id, feature_scale=scale,
                     samples=_first_ids(data, train_idx, cfg))


def _models(cfg: DFlashTrainConfig, run: RunSettings, data: Any, tokenizer: Any, device: Any,
            rank: int, train_idx: np.ndarray) -> _Models:
    """Load the target, check the feature cache against it, build the draft."""
    cache = open_features(run.features) if run.features else None
    model = load_target(run.target, dtype=cfg.dtype, device=device)
    layers = target_layer_ids(model.config.num_hidden_layers,
                              cfg.num_features or cfg.draft_layers)
    data_tokenizer = {k: data.info[k] for k in TOKENIZER_FIELDS if data.info.get(k) is not None}
    if cache is not None:
        cache.check(weights=weights_record(model), layers=layers, fingerprint=data.fingerprint(),
                    tokenizer=data_tokenizer, max_len=cfg.max_len, data=run.data)
    # the blocks' mask token: the tokenizer's own, else <|MASK|> added (the target embeds it)
    rows = int(model.get_input_embeddings().weight.shape[0])
    mask = ensure_mask_token(tokenizer, model)
    serve = Path(run.out) / "target" if mask.resized else Path(run.target)
    if mask.resized and rank == 0:  # whole or not at all; an identical one is kept
        save_grown_target(model, tokenizer, serve)
    target = Target(model, layers=layers)
    draft = starting_draft(target, cfg, mask_token_id=mask.id, data=data, train_idx=train_idx,
                           cache=cache)
    draft.config.tokenizer = data_tokenizer or None  # export and eval check the target's
    draft.config.target_weights = weights_record(model)  # the target eval must be given
    return _Models(target, draft, mask, serve, rows, cache)


def _loop(cfg: DFlashTrainConfig, run: RunSettings, data: Any, split: _Split, m: _Models,
          device: Any, group: Any) -> TrainLoop:
    """The training loop over the plan, with the held-out evaluation and the log's sinks."""
    rank = rank_world(group)[0]
    out = Path(run.out)

    def sample(i: int) -> dict[str, np.ndarray]:  # training sample i as trained: cut to max_len
        return {k: v[: cfg.max_len] for k, v in data.sample(int(split.train_idx[i])).items()}

    def dataset_index(sample_id: int) -> int:  # training ids, then the held-out batches' ids
        return int(split.train_idx[sample_id] if sample_id < HELD_OUT_FIRST_ID
                   else split.held_idx[sample_id - HELD_OUT_FIRST_ID])

    features = (None if m.cache is None
                else CachedRows(m.cache, m.target.layers, dataset_index))
    every = run.eval_every if run.eval_every is not None else max(1, cfg.steps // 10)
    task = EvalTask(m.draft, m.target, cfg, order=run.order,
                    amp=autocast_dtype(cfg.dtype, device), held=split.held, every=every,
                    anchors=run.eval_anchors or cfg.num_anchors, main=rank == 0,
                    settings=settings_json(cfg, run, data.info), features=features)
    sinks: dict[str, Any] = {}
    if run.tensorboard:
        sinks["tensorboard_dir"] = run.tensorboard
    if run.wandb:
        sinks["wandb"] = {"project": run.wandb_project} if run.wandb_project else True
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "draft_config.json").write_text(
            json.dumps(m.draft.config.to_dict(), indent=2) + "\n", encoding="utf-8")
    return TrainLoop(task, run.order, split.lengths, sample, cfg, run_dir=out, device=device,
                     info=group, log_sinks=sinks)


def _announce(cfg: DFlashTrainConfig, run: RunSettings, split: _Split, m: _Models,
              loop: TrainLoop, group: Any) -> None:
    """The run's two opening lines: what trains on what, and the mask token."""
    world = rank_world(group)[1]
    model = m.target.model
    say(group, f"lengthwise dflash train: target {run.target} "
               f"({model.config.num_hidden_layers} layers, "
               f"{str(model.dtype).removeprefix('torch.')}; layers "
               f"{m.target.layers} feed a {cfg.draft_layers}-layer draft, block {cfg.block_size}"
               + (f", read from the feature cache {run.features}" if m.cache is not None else "")
               + "); "
               f"{split.train_idx.size} training samples ({int(split.lengths.sum())} tokens"
               + (f", {split.cut} truncated to max_len {cfg.max_len}" if split.cut else "")
               + (f"; {split.dropped} dropped: no supervised tokens left after truncation to "
                  f"max_len {cfg.max_len}" if split.dropped else "")
               + f"), {split.held_idx.size} held out; {cfg.steps} steps x {cfg.grad_accum} "
               f"micro-batches of <= {cfg.max_tokens} tokens x {world} rank(s)"
               + (f"; resumed at step {loop.step_count}" if loop.resumed_from else ""))
    mask = m.mask
    say(group, f"lengthwise dflash train: mask token {mask.token} id {mask.id}"
               + (" (added to the tokenizer)" if mask.added else "")
               + (" (a special token of the tokenizer that the chat template never writes: "
                  "the target serves the draft as it is)" if mask.unused else "")
               + (f"; the target's embedding and LM head grew from {m.rows_before} to "
                  f"{mask.id + 1} rows: export, evaluate and serve the draft with the target "
                  f"saved to {m.serve}" if mask.resized else ""))


def _train(loop: TrainLoop, cfg: DFlashTrainConfig, group: Any, progress: bool,
           ) -> list[dict[str, Any]]:
    """Every step left; on SIGTERM a checkpoint and :data:`STOPPED`. The step records."""
    records = []
    with StopRequest() as stop:
        for _ in bar(range(loop.step_count, cfg.steps), desc="dflash train", unit="step",
                     total=cfg.steps - loop.step_count,
                     enable=progress and rank_world(group)[0] == 0):
            records.append(loop.step())
            if stop.requested(group) and not loop.done:
                saved = loop.checkpoint()
                say(group, f"lengthwise dflash train: SIGTERM: stopped after step "
                           f"{loop.step_count} of {cfg.steps}; " + (
                               f"checkpoint step_{loop.step_count} saved: continue with "
                               "--resume" if saved else "no checkpoint (--checkpoint-every "
                               "0): those steps are lost"))
                raise SystemExit(STOPPED)
    return records


def _save_final(draft: Any, final: Path, step: int) -> None:
    """``final/``: the draft's weights, its config and the step, each file whole."""
    final.mkdir(parents=True, exist_ok=True)
    state = draft.state_dict()
    with reporting_full_disk(final, needed=state_bytes(state), what="saving the final draft"):
        with atomic_open(final / "draft.pt") as fh:
            torch.save(state, fh)
        with atomic_open(final / "config.json", "w", encoding="utf-8") as fh:
            fh.write(json.dumps(draft.config.to_dict(), indent=2) + "\n")
        with atomic_open(final / FINAL_STEP, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step}) + "\n")


def _train_locked(cfg: DFlashTrainConfig, run: RunSettings, data: Any, tokenizer: Any,
                  group: Any, device: Any, progress: bool) -> dict[str, Any]:
    """:func:`train_draft` with the run folder's lock held, in phases: setup, data, model,
    train, save, summary."""
    # setup
    rank, world = rank_world(group)
    out = Path(run.out)
    configure_torch(device, threads=cfg.threads, deterministic=cfg.deterministic)
    # data
    split = _split(data, cfg, run)
    if run.epochs is not None:
        cfg = _with_epochs(cfg, run, split.lengths, rank, world)
    applied = _check_out(out, cfg, run, data.info, group)
    # model
    m = _models(cfg, run, data, tokenizer, device, rank, split.train_idx)
    # train
    loop = _loop(cfg, run, data, split, m, device, group)
    if loop.resumed_from:
        applied = list(dict.fromkeys(applied + apply_optimizer_settings(
            loop.optimizer, loop.scheduler, cfg)))
        if applied:
            say(group, f"lengthwise dflash train: resume: applied from step {loop.step_count} "
                       f"on: {', '.join(applied)}")
    _announce(cfg, run, split, m, loop, group)
    try:
        records = _train(loop, cfg, group, progress)
        # save
        if rank == 0:
            _save_final(m.draft, out / "final", loop.step_count)
    finally:
        loop.close()
    # summary
    if loop.non_finite_steps:
        say(group, f"lengthwise dflash train: warning: the loss was NaN or infinite at "
                   f"{loop.non_finite_steps} of {len(records)} steps (the first: step "
                   f"{loop.first_non_finite}; {loop.log_path.name} writes it null)"
                   + (", their updates skipped" if loop.guard is not None else "")
                   + ": check --lr, --weight-decay and the data")
    if rank != 0:
        return {}
    last = records[-1] if records else {}
    evals = [r for r in records if r.get("eval_accuracy") is not None]
    return {"steps": loop.step_count, "resumed_from": loop.resumed_from,
            "train_samples": int(split.train_idx.size), "eval_samples": int(split.held_idx.size),
            "truncated_samples": split.cut, "dropped_unsupervised_after_truncation": split.dropped,
            "loss": last.get("loss"), "accuracy": last.get("accuracy"),
            "non_finite_loss_steps": loop.non_finite_steps,
            "eval": ({k: evals[-1][k] for k in ("step", "eval_loss", "eval_accuracy",
                                                "eval_simulated_acceptance_length",
                                                "eval_expected_acceptance")}
                     if evals else None),
            "log": str(loop.log_path), "final": str(out / "final"),
            "mask_token_id": m.mask.id, "target": str(m.serve)}


def _check_out(out: Path, cfg: DFlashTrainConfig, run: RunSettings, data_info: dict[str, Any],
               group: Any) -> list[str]:
    """Refuse (or with ``overwrite`` clear) an earlier run in ``out``; check a resume's settings.

    Returns the settings a resume changes (applied); nothing is loaded or written before.
    """


    ckpts = out / "checkpoints"
    steps = sorted((p.name for p in ckpts.glob("step_*")), key=lambda name: (len(name), name)
                   ) if ckpts.is_dir() else []  # step_2 before step_10
    final = out / "final"
    if cfg.resume:
        latest = latest_checkpoint(ckpts) if ckpts.is_dir() else None
        if latest is not None:
            return check_resume(latest, cfg, run, data_info)
        earlier = [f"checkpoints {', '.join(steps)}"] if steps else []
        if final.exists():
            earlier.append("a final draft")
        earlier += [p.name for p in log_files(out / "train_log.jsonl")]
        if earlier:  # starting over would delete or replace them
            raise ConfigError(f"--resume: no complete checkpoint under {ckpts} to resume from, "
                              f"and --out {out} holds an earlier run ({', '.join(earlier)}): "
                              "give --overwrite instead to remove it and start again, or "
                              "another --out")
        return []
    if not steps and not final.exists():
        return []
    held = (f"checkpoints {', '.join(steps)}" if steps else "") + (
        (" and " if steps else "") + "a final draft" if final.exists() else "")
    if not run.overwrite:
        raise ConfigError(f"--out {out} holds an earlier run ({held}): give --resume to "
                          "continue it, --overwrite to remove them and start again, or "
                          "another --out")
    barrier(group)  # every rank has looked before rank 0 removes
    if rank_world(group)[0] == 0:
        shutil.rmtree(ckpts, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
    barrier(group)
    say(group, f"lengthwise dflash train: --overwrite: removed the earlier run's {held} "
               f"from {out}")
    return []

