"""Train with Hugging Face ``transformers.Trainer`` on planned micro-batches.

:class:`LengthwiseTrainer` is a ``Trainer`` whose training data loader takes its
micro-batches from a :class:`lengthwise.BucketBatchSampler`; :func:`use_lengthwise`
does the same to an existing trainer instance (any ``Trainer`` subclass).

Each process plans its own rank's micro-batches, so Accelerate must not shard
them again: the loader is prepared for one process (no ``BatchSamplerShard``,
no dispatching), and every rank gets the same number of micro-batches, so no
rank waits for, or pads out to, another. This holds on one device, under
``torchrun`` and under ``accelerate launch`` (DDP, FSDP, DeepSpeed).

``per_device_train_batch_size`` is not used: the sampler's budget sets each
micro-batch. ``gradient_accumulation_steps`` is the plan's ``grad_accum``,
``dataloader_drop_last`` means ``even_out="drop"``, and the seed is ``data_seed`` (else
``seed``) unless ``seed`` is given.

The final metrics tell the truth about planned micro-batches: ``train_samples`` and
``train_tokens`` (real tokens) count what the optimizer steps of this ``train()``
call consumed over all ranks, ``train_samples_per_second`` and
``train_tokens_per_second`` divide them by ``train_runtime`` (Trainer's own figure
assumes ``per_device_train_batch_size`` rows per micro-batch), and ``train_loss`` is
averaged over the ranks, so every rank reports the same.

Example::

    trainer = LengthwiseTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
        lengths=lengths, max_tokens=16384)  # collates with the sampler's
    trainer.train()
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import types
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint, seed_worker

from lengthwise.atomic import atomic_open
from lengthwise.errors import ConfigError
from lengthwise.planning.config import PlanConfig, plan_config
from lengthwise.pytorch.collate import HeldCollator, PackCollator, PadCollator
from lengthwise.pytorch.sampler import BucketBatchSampler, ResumeError

if TYPE_CHECKING:
    from transformers.trainer_utils import TrainOutput

__all__ = ["STATE_FILE", "LengthwiseTrainer", "lengthwise_dataloader", "make_sampler",
           "use_lengthwise"]

#: file in each checkpoint folder that holds the sampler's state at that step
STATE_FILE = "lengthwise_sampler.json"



def data_parallel_ranks(trainer: Trainer) -> tuple[int, int]:
    """``(num_replicas, rank)`` of this process among the data-parallel ranks.

    Processes that share a batch (tensor or context parallel groups of a device
    mesh) share a rank, as Accelerate assigns them.
    """
    acc = trainer.accelerator
    world, rank = acc.num_processes, acc.process_index
    mesh = getattr(acc, "torch_device_mesh", None)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if mesh is not None and names:
        def size(name: str) -> int:
            return mesh[name].size() if name in names else 1

        rank = rank // (size("tp") * size("cp"))
        world = size("dp_replicate") * size("dp_shard")
    return world, rank


def make_sampler(trainer: Trainer, lengths: Any, config: PlanConfig | None = None,
                 **options: Any) -> BucketBatchSampler:
    """A sampler of ``config``'s plan for ``trainer``: its ranks, gradient accumulation,
    ``dataloader_drop_last`` and data seed.

    ``options`` are the plan's fields (instead of ``config``) and
    :class:`lengthwise.BucketBatchSampler`'s own (``window``...). Raises if the lengths do
    not match the training set.
    """
    config = plan_config(config, options, BucketBatchSampler.__init__, "make_sampler")
    clash = [k for k in ("num_replicas", "rank") if k in options]
    clash += [k for k in ("world_size", "grad_accum") if getattr(config, k) != 1]
    if clash:
        raise ConfigError(f"{clash} come from the trainer (its processes and "
                          "gradient_accumulation_steps); leave them out of the sampler options")
    args = trainer.args
    acc = trainer.accelerator
    for name in ("split_batches", "dispatch_batches"):
        if getattr(acc, name, None):
            raise ConfigError(
                f"accelerator_config.{name}=True cannot be used with a lengthwise sampler: it "
                "already gives every process its own micro-batches; turn it off")
    if args.dataloader_drop_last and config.even_out == "repeat":
        raise ConfigError("dataloader_drop_last=True means even_out='drop', got even_out='repeat'")
    config = dataclasses.replace(config, grad_accum=args.gradient_accumulation_steps,
                                 even_out="drop" if args.dataloader_drop_last else config.even_out)
    if "seed" not in options:
        options["seed"] = args.data_seed if args.data_seed is not None else args.seed
    world, rank = data_parallel_ranks(trainer)
    # fewer data-parallel ranks than processes only where a device mesh shares batches
    options.setdefault("check_world_size", world == acc.num_processes)
    sampler = BucketBatchSampler(lengths, config, num_replicas=world, rank=rank, **options)
    if trainer.train_dataset is not None:
        sampler.check_dataset(trainer.train_dataset)
    cfg = sampler.config
    if cfg.order == "random" and cfg.batch_size is None:
        warnings.warn("order='random' with a token or cost budget gives a different number of "
                      "micro-batches each epoch, while Trainer counts the steps of an epoch "
                      "once; use a bucketed order (the default 'stratified')", stacklevel=2)
    return sampler


def lengthwise_dataloader(trainer: Trainer, sampler: BucketBatchSampler) -> DataLoader:
    """The training loader of ``trainer`` with ``sampler`` as its batch sampler.

    The loader is prepared by Accelerate for device placement only, so the
    sampler's per-rank micro-batches are not sharded a second time.
    """

    if trainer.train_dataset is None:
        raise ConfigError("Trainer: training requires a train_dataset.")
    args = trainer.args
    dataset = trainer.train_dataset
    sampler.check_dataset(dataset)
    collator = trainer.data_collator
    try:
        import datasets
    except ImportError:  # pragma: no cover - depends on the environment
        datasets = None
    if datasets is not None and isinstance(dataset, datasets.Dataset):
        dataset = trainer._remove_unused_columns(dataset, description="training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="training")
    params: dict[str, Any] = {
        "batch_sampler": sampler,
        "collate_fn": collator,
        "num_workers": args.dataloader_num_workers,
        "pin_memory": args.dataloader_pin_memory,
        "persistent_workers": args.dataloader_persistent_workers,
        "worker_init_fn": partial(seed_worker, num_workers=args.dataloader_num_workers,
                                  rank=args.process_index),
    }
    if args.dataloader_num_workers > 0:
        if args.dataloader_prefetch_factor is not None:
            params["prefetch_factor"] = args.dataloader_prefetch_factor
        context = getattr(args, "dataloader_multiprocessing_context", None)
        if context is not None:
            params["multiprocessing_context"] = context
    loader = DataLoader(dataset, **params)
    acc = trainer.accelerator
    prepared = prepare_data_loader(
        loader, acc.device, num_processes=1, process_index=0, split_batches=False,
        put_on_device=acc.device_placement, rng_types=list(acc.rng_types),
        dispatch_batches=False, non_blocking=acc.non_blocking,
        use_stateful_dataloader=acc.use_stateful_dataloader)
    registry = getattr(acc, "_dataloaders", None)  # so that accelerator.save_state sees it
    if isinstance(registry, list):
        registry.append(prepared)
    return prepared


def _checkpoint_state(sampler: BucketBatchSampler, global_step: int) -> dict[str, Any]:
    """The sampler state matching ``global_step`` optimizer steps of Trainer's schedule."""
    state = sampler._state(0)  # the place comes from global_step, not from the loader
    n = len(sampler)
    accum = sampler.grad_accum
    steps_per_epoch = max(1, math.ceil(n / accum))
    state["epoch"] = global_step // steps_per_epoch
    state["yielded"] = min(n, (global_step % steps_per_epoch) * accum)
    state["resumed"] = []
    state["global_step"] = int(global_step)
    return state


class _SaveSamplerState(TrainerCallback):
    """Writes the sampler state into every checkpoint folder."""

    def __init__(self, sampler: BucketBatchSampler) -> None:
        self.sampler = sampler

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                with atomic_open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as fh:
                    json.dump(_checkpoint_state(self.sampler, state.global_step), fh)
        return control


def check_resume(sampler: BucketBatchSampler, checkpoint: str | None) -> None:
    """Raise if ``checkpoint`` was written with another plan than ``sampler`` builds.

    Trainer resumes by counting optimizer steps, which places the data exactly
    only with the same data, plan options, world size and gradient accumulation.
    """
    if checkpoint is None:
        return
    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as fh:
        saved = json.load(fh)
    sampler._check_same_plan(saved)
    if (saved["world_size"], saved["grad_accum"]) != (sampler.num_replicas, sampler.grad_accum):
        raise ResumeError(
            f"{checkpoint} was trained on {_ranks(saved['world_size'])} with "
            f"gradient_accumulation_steps={saved['grad_accum']}; this run has "
            f"{_ranks(sampler.num_replicas)} and gradient_accumulation_steps="
            f"{sampler.grad_accum}. Trainer resumes by counting "
            "steps, which cannot re-plan the rest of the epoch: resume with the saved values, "
            f"or load {STATE_FILE} into a BucketBatchSampler in your own loop")


def _ranks(n: int) -> str:
    return f"{n} data-parallel rank{'' if n == 1 else 's'}"


def _resolve_checkpoint(trainer: Trainer, resume_from_checkpoint: Any) -> str | None:
    if resume_from_checkpoint is True:
        return get_last_checkpoint(trainer.args.output_dir)
    if isinstance(resume_from_checkpoint, (str, os.PathLike)):
        return os.fspath(resume_from_checkpoint)
    return None


class LengthwiseTrainer(Trainer):
    """A ``Trainer`` that trains on the micro-batches of a :class:`BucketBatchSampler`.

    ``lengths`` are the training set's token lengths (row ``i`` of ``train_dataset``
    has ``lengths[i]``; any source :func:`lengthwise.load_lengths` reads), ``plan`` the
    :class:`~lengthwise.planning.config.PlanConfig` of its batches (or its fields as keywords
    instead, ``max_tokens=8192``...), and ``sampler_options`` the sampler's own options
    (``window``...). The sampler is
    ``trainer.lengthwise_sampler``; its state goes into every checkpoint
    (``lengthwise_sampler.json``) and resuming checks it.

    Without a ``data_collator`` the trainer collates with the sampler's own,
    ``sampler.collator(pad_token_id, metadata=False)``: truncated, padded and
    checked against the budget exactly as the plan counted. The pad id is
    ``pad_token_id``, else the ``processing_class``'s, else the model config's.

    Example::

        trainer = LengthwiseTrainer(model=model, args=args, train_dataset=ds,
                                    processing_class=tokenizer, lengths=lengths,
                                    max_tokens=8192)
    """

    def __init__(self, *args: Any, lengths: Any = None, plan: PlanConfig | None = None,
                 sampler_options: dict[str, Any] | None = None,
                 pad_token_id: int | None = None, **kwargs: Any) -> None:
        if lengths is None:
            raise ConfigError(f"{type(self).__name__} needs lengths=... (one token length per "
                              "row of train_dataset; see lengthwise.compute_lengths)")
        plan = plan_config(plan, kwargs, super().__init__, type(self).__name__)
        # Trainer(model, args, data_collator, ...): the collator may come by position
        given = kwargs.get("data_collator") is not None or (len(args) > 2 and args[2] is not None)
        super().__init__(*args, **kwargs)
        self.lengthwise_sampler = make_sampler(self, lengths, plan, **(sampler_options or {}))
        self.add_callback(_SaveSamplerState(self.lengthwise_sampler))
        self._lengthwise_start = _StartStep()
        self.add_callback(self._lengthwise_start)
        if not given:
            self.data_collator = self.lengthwise_sampler.collator(
                pad_token_id=_pad_token_id(self, pad_token_id), metadata=False)
        else:
            self.data_collator = hold_to_plan(self.data_collator, self.lengthwise_sampler)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        true_final_metrics(self, self.lengthwise_sampler, self._lengthwise_start.step, logs)
        super().log(logs, *args, **kwargs)

    def get_train_dataloader(self) -> DataLoader:
        return lengthwise_dataloader(self, self.lengthwise_sampler)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any,
              **kwargs: Any):
        check_resume(self.lengthwise_sampler, _resolve_checkpoint(self, resume_from_checkpoint))
        return _with_final_loss(super().train(resume_from_checkpoint, *args, **kwargs))


def hold_to_plan(collator: Any, sampler: BucketBatchSampler) -> Any:
    """``collator`` truncating and checking micro-batches as ``sampler``'s plan counted them.

    The sampler's own collators already do; any other (Hugging Face's, TRL's) is
    wrapped in :class:`~lengthwise.pytorch.collate.HeldCollator`.
    """

    if isinstance(collator, (PadCollator, PackCollator)) and collator.budget is not None:
        return collator
    if isinstance(collator, HeldCollator):
        collator = collator.inner
    return HeldCollator(collator, sampler.config)


def _pad_token_id(trainer: Trainer, given: int | None) -> int | None:
    """The pad id for the sampler's collator: given, the tokenizer's, or the model config's."""
    if given is not None or trainer.lengthwise_sampler.config.layout == "pack":
        return given
    for owner in (getattr(trainer, "processing_class", None),
                  getattr(getattr(trainer, "model", None), "config", None)):
        pad = getattr(owner, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    raise ConfigError("LengthwiseTrainer builds its collator from the sampler's plan and needs a "
                      "pad token id: pass pad_token_id=..., or a processing_class (tokenizer) "
                      "with a pad_token_id, or a data_collator")


def use_lengthwise(trainer: Trainer, lengths: Any, config: PlanConfig | None = None,
                   **options: Any) -> BucketBatchSampler:
    """Make an existing ``trainer`` train on planned micro-batches; return the sampler.

    For trainers built elsewhere (a ``Trainer`` subclass from another library):
    replaces the instance's training loader, saves the sampler state in
    checkpoints and checks it on resume, and corrects the final metrics (true
    samples and tokens per second, one ``train_loss`` over the ranks), like
    :class:`LengthwiseTrainer`. Works on TRL's ``SFTTrainer``. The trainer's
    collator is kept, held to the plan (:func:`hold_to_plan`): samples truncated
    as the plan counted them, every micro-batch checked against the budget. ``config`` and
    ``options`` are :func:`make_sampler`'s.

    Example::

        trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collate)
        sampler = use_lengthwise(trainer, lengths, max_tokens=8192)
        trainer.train()
    """
    config = plan_config(config, options, BucketBatchSampler.__init__, "use_lengthwise")
    sampler = make_sampler(trainer, lengths, config, **options)
    trainer.lengthwise_sampler = sampler
    trainer.data_collator = hold_to_plan(trainer.data_collator, sampler)
    trainer.get_train_dataloader = types.MethodType(
        lambda self: lengthwise_dataloader(self, sampler), trainer)
    trainer.add_callback(_SaveSamplerState(sampler))
    start = _StartStep()
    trainer.add_callback(start)
    plain_train, plain_log = trainer.train, trainer.log

    def train(resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        check_resume(sampler, _resolve_checkpoint(trainer, resume_from_checkpoint))
        return _with_final_loss(plain_train(resume_from_checkpoint, *args, **kwargs))

    def log(logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        true_final_metrics(trainer, sampler, start.step, logs)
        plain_log(logs, *args, **kwargs)

    trainer.train = train
    trainer.log = log
    return sampler


# ------------------------------------------------------------------ final metrics


class _StartStep(TrainerCallback):
    """Remembers the optimizer step a ``train()`` call starts from (after a resume)."""

    step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.step = state.global_step
        return control


def trained_counts(sampler: BucketBatchSampler, start_step: int,
                   end_step: int) -> tuple[int, int]:
    """Samples and real tokens of the micro-batches of optimizer steps ``[start, end)``, all ranks.

    Trainer takes ``gradient_accumulation_steps`` micro-batches per step (fewer for an
    epoch's last step) and counts the steps of an epoch once, from the sampler's length.

    Example::

        >>> s = BucketBatchSampler([5, 6, 7, 8], batch_size=1, grad_accum=2, num_replicas=2,
        ...                        rank=0)
        >>> trained_counts(s, 0, 1)  # one step per epoch: 2 micro-batches x 2 ranks
        (4, 26)
        >>> trained_counts(s, 1, 3)  # epochs 1 and 2
        (8, 52)
    """
    accum = sampler.grad_accum
    steps_per_epoch = max(1, math.ceil(len(sampler) / accum))
    samples = tokens = 0
    for epoch in range(start_step // steps_per_epoch, end_step // steps_per_epoch + 1):
        first = max(start_step - epoch * steps_per_epoch, 0)
        last = min(end_step - epoch * steps_per_epoch, steps_per_epoch)
        if last <= first:
            continue
        probe = copy.copy(sampler)  # another epoch's plan, leaving the sampler as it is
        probe.set_epoch(epoch)
        plan = probe.plan
        if plan is None:
            continue
        world, n = sampler.num_replicas, plan.num_batches
        lo, hi = plan.offsets[min(n, first * accum) * world], plan.offsets[
            min(n, last * accum) * world]
        samples += int(hi - lo)
        tokens += int(plan.lengths[plan.indices[lo:hi]].sum())
    return samples, tokens


def true_final_metrics(trainer: Trainer, sampler: BucketBatchSampler, start_step: int,
                       logs: dict[str, float]) -> None:
    """Correct Trainer's final metrics in ``logs`` (in place): true throughput, one loss.

    Other logs pass unchanged. Runs on every rank (Trainer logs its final metrics on all).
    """
    if "train_runtime" not in logs or "train_loss" not in logs:
        return
    samples, tokens = trained_counts(sampler, start_step, trainer.state.global_step)
    runtime = float(logs["train_runtime"])
    logs["train_samples"] = samples
    logs["train_tokens"] = tokens
    logs["train_samples_per_second"] = round(samples / runtime, 3) if runtime > 0 else 0.0
    logs["train_tokens_per_second"] = round(tokens / runtime, 3) if runtime > 0 else 0.0
    acc = trainer.accelerator
    if acc.num_processes > 1:  # the leftover loss since the last logging step is per rank
        loss = torch.tensor(float(logs["train_loss"]), dtype=torch.float64, device=acc.device)
        logs["train_loss"] = float(acc.reduce(loss, reduction="mean"))


def _with_final_loss(out: TrainOutput) -> TrainOutput:
    """``train()``'s result with the loss of its (corrected) final metrics."""
    loss = out.metrics.get("train_loss") if out.metrics else None
    return out if loss is None else out._replace(training_loss=loss)
