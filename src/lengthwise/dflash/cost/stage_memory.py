"""The peak memory of a whole DFlash stage (train, regenerate, eval, features).

Each estimate reads the target's ``config.json`` (never its weights) and traces the phases
the stage runs (:data:`COVERS`) under fake tensors (:mod:`~lengthwise.dflash.cost.trace`),
its target at two shallow depths extrapolated to its own. On CPU the figure is the
process's resident memory: its own baseline
(:func:`~lengthwise.dflash.cost.resident.process_baseline`), the weights and the largest
phase; on CUDA the memory allocated per GPU: the weights and the largest phase.
See docs/dflash.md, "The whole process of each stage".

Example::

    >>> import transformers
    >>> t = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4,
    ...                              num_attention_heads=4, intermediate_size=64)
    >>> est = estimate_regenerate(t, batch_size=2, max_len=32, max_new_tokens=8,
    ...                           device="cpu", baseline=0)
    >>> est.stage, est.peak == sum(est.parts.values()), est.parts["weights"] > 0
    ('regenerate', True, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lengthwise.dflash.cost.device_memory import GIB
from lengthwise.dflash.cost.trace import (
    LiveBytes,
    checkpoint_dtype,
    fake_causal_lm,
    few_head_chunks,
    kernels,
    per_layer,
    storage_bytes,
    weight_bytes,
    weight_dtype,
    with_layers,
)
from lengthwise.errors import ConfigError

__all__ = ["STAGES", "StageMemory", "estimate_eval", "estimate_features", "estimate_regenerate",
           "estimate_train", "grown_rows"]

#: what each stage's estimate covers, as printed
COVERS = {
    "train": "loading the target (and growing and saving it for the mask token), then a "
             "training step at the worst micro-batch of the settings",
    "regenerate": "generate of --batch-size prompts of --max-len tokens: the prefill and "
                  "the last of --max-new-tokens decoding steps",
    "eval": "speculative decoding of --batch-size prompts of --max-len tokens (prefill, "
            "verification), and the teacher-forced accuracy pass on their outputs",
    "features": "the target's forward of the pass's largest batch (--max-tokens padded "
                "tokens, every layer's hidden states) and the features it returns",
}
STAGES = tuple(COVERS)



@dataclass
class StageMemory:
    """The predicted peak of a stage's process (bytes), its parts and the phase it falls in."""

    stage: str
    device: str
    peak: int
    parts: dict[str, int]
    phase: str
    phases: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)
    step: Any = None  # train: the step's StepMemory

    @property
    def what(self) -> str:
        """What the figure is: resident memory of the process (CPU), or allocated per GPU."""
        if self.device == "cuda":
            return "predicted peak allocated memory per GPU (CUDA; outside it: the CUDA " \
                   "context, library workspaces and the caching allocator's reserve)"
        return "predicted peak resident memory of the process (CPU)"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (bytes and GiB)."""
        return {"stage": self.stage, "device": self.device, "measure": self.what,
                "covers": COVERS[self.stage], "peak_bytes": self.peak,
                "peak_gib": self.peak / GIB, "phase": self.phase,
                "parts_gib": {k: v / GIB for k, v in self.parts.items()},
                "phases_gib": {k: v / GIB for k, v in self.phases.items()},
                "settings": self.settings}

    def render(self) -> str:
        """A few lines: what is predicted, the peak, the phase and the parts."""
        return "\n".join(
            [f"{self.what}: {self.peak / GIB:.2f} GiB ({self.stage}: {COVERS[self.stage]})",
             f"  the peak falls in: {self.phase}; phases: "
             + ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.phases.items()) + " GiB",
             *(f"  {name:<22} {size / GIB:8.2f} GiB" for name, size in self.parts.items())])


def grown_rows(tokenizer: Any, target_config: Any, generation_config: Any = None) -> int:
    """Rows of the target's embedding once the mask token is in it, as ``dflash train``
    chooses on a stand-in of the target (no weights); adds ``<|MASK|>`` to ``tokenizer``
    where that is the choice."""
    from types import SimpleNamespace

    from lengthwise.dflash.mask_token import mask_token_choice

    rows = int(target_config.vocab_size)
    model = SimpleNamespace(config=target_config, generation_config=generation_config,
                            get_input_embeddings=lambda: SimpleNamespace(
                                weight=SimpleNamespace(shape=(rows,))))
    return max(rows, mask_token_choice(tokenizer, model)[1] + 1)


def _device(device: str) -> str:
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: the estimate knows cpu and cuda")
    return kind


def _check(**sizes: int | None) -> None:
    for name, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 1, "
                              f"got {value!r}")


def _finish(stage: str, kind: str, baseline: int, held: dict[str, int],
            phases: dict[str, dict[str, int]], settings: dict[str, Any]) -> StageMemory:
    """The peak: the process (CPU), what is held, and the parts of the largest phase."""
    totals = {name: sum(p.values()) for name, p in phases.items()}
    top = max(totals, key=lambda n: totals[n])
    parts = ({"process": baseline} if kind == "cpu" else {}) | held | phases[top]
    before = sum(parts.values()) - totals[top]
    return StageMemory(stage=stage, device=kind, peak=sum(parts.values()), parts=parts,
                       phase=top, phases={n: before + t for n, t in totals.items()},
                       settings=settings)


@contextlib.contextmanager
def _fake(kind: str) -> Iterator[None]:
    """Fake tensors, the kernels of ``kind``, no gradients."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), kernels(kind), torch.no_grad():
        yield


def _batch(rows: int, cols: int, pad: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token ids of ``rows x cols`` and their mask: ``left`` padding (generate's) or
    ``right`` (the feature pass's) in every row but the first, or none."""
    ids = torch.zeros(rows, cols, dtype=torch.long)
    if pad is None:
        return ids, None
    mask = torch.ones(rows, cols, dtype=torch.long)
    mask[1:, slice(None, cols // 2) if pad == "left" else slice(cols // 2, None)] = 0
    return ids, mask


def _cached_step(model: Any, live: LiveBytes, ids: torch.Tensor, mask: Any, cols: int, *,
                 keep_first: bool = False, **kwargs: Any) -> None:
    """A forward of ``model`` on ``ids[:, :cols]`` with the cache of ``ids`` held: the peak
    from the cache on (``keep_first``: the first forward's output held too, as generate's)."""
    from lengthwise.dflash.speculative import _cache_kwarg, _cache_of

    res = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    live.restart()  # what the prefill freed on returning; the cache is held
    cache = _cache_of(res)
    if not keep_first:
        del res
    if mask is not None:
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], cols)], dim=1)
    res = model(input_ids=ids[:, :cols], attention_mask=mask, use_cache=True,
                **{_cache_kwarg(model): cache}, **kwargs)
    del res, cache


def _generate_trace(config: Any, layers: int, dtype: torch.dtype, rows: int, prompt: int,
                    new: int, kind: str) -> dict[str, int]:
    """Weights, the prefill's peak and the last decoding step's peak (cache included)."""
    with _fake(kind):
        model = fake_causal_lm(config, layers, dtype)
        out = {"weights": weight_bytes(model)}
        for name, cols, step in (("prefill", prompt, False), ("decode", prompt + new - 1, True)):
            ids, mask = _batch(rows, cols, "left")
            live = LiveBytes(int(config.vocab_size))
            with live:
                if step:
                    _cached_step(model, live, ids, mask, 1, keep_first=True, logits_to_keep=1)
                else:
                    model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            out[name] = live.peak
    return out


def estimate_regenerate(target_config: Any, *, batch_size: int = 32, max_len: int = 1024,
                        max_new_tokens: int = 512, device: str = "cpu", dtype: Any = None,
                        baseline: int = 0) -> StageMemory:
    """The peak of ``dflash prepare --regenerate``: ``batch_size`` prompts of ``max_len``
    tokens each writing ``max_new_tokens``; ``baseline``: the process's own bytes on CPU."""
    _check(batch_size=batch_size, max_len=max_len, max_new_tokens=max_new_tokens)
    kind = _device(device)
    dt = weight_dtype(dtype, kind, target_config)
    depth = int(target_config.num_hidden_layers)
    fig = per_layer(lambda n: _generate_trace(target_config, n, dt, batch_size, max_len,
                                              max_new_tokens, kind), depth, 0)
    phases = {"prefill": {"prefill (KV cache, activations)": fig["prefill"]},
              "last decoding step": {"KV cache and the step": fig["decode"]}}
    settings = {"batch_size": batch_size, "max_len": max_len, "max_new_tokens": max_new_tokens,
                "dtype": str(dt).removeprefix("torch."), "target_layers": depth}
    return _finish("regenerate", kind, baseline, {"weights": fig["weights"]}, phases, settings)


def _features_peak(target: Any, rows: int, cols: int, pad: str | None = None,
                   ) -> tuple[int, int]:
    """``(held after, peak)`` of ``target.features_and_output`` on ``rows x cols`` tokens."""
    live = LiveBytes(target.vocab_size)
    with live:
        ids, mask = _batch(rows, cols, pad)
        feats, last = target.features_and_output(ids, attention_mask=mask)
        live.sweep()  # the hidden states of every layer, freed on returning
        held = live.now
        del feats, last
    return held, live.peak


def _eval_target_trace(config: Any, layers: int, dtype: torch.dtype, rows: int, prompt: int,
                       cache_cols: int, block: int, text_rows: int, text: int,
                       feature_layers: int, kind: str) -> dict[str, int]:
    """Weights; the decoding prefill, a verification, the accuracy pass's target forward."""
    from lengthwise.dflash.target import Target

    with _fake(kind):
        model = fake_causal_lm(config, layers, dtype)
        target = Target(model, layers=list(range(feature_layers)))
        out = {"weights": weight_bytes(model)}
        ids, mask = _batch(rows, prompt, "left")
        live = LiveBytes(int(config.vocab_size))
        with live:  # speculative_batch's prefill
            res = model(input_ids=ids, attention_mask=mask, use_cache=True,
                        output_hidden_states=True, logits_to_keep=1)
            feats = torch.cat([res.hidden_states[i + 1] for i in target.layers], dim=-1)
            del res
        out["prefill"] = live.peak
        del feats
        live = LiveBytes(int(config.vocab_size))
        with live:  # a verification of a block with the cache at its most
            _cached_step(model, live, _batch(rows, cache_cols, None)[0], None, block,
                         output_hidden_states=True)
        out["verify"] = live.peak
        out["features_held"], out["features"] = _features_peak(target, text_rows, text)
    return out


def _eval_draft_trace(config: Any, dtype: torch.dtype, draft_cfg: Any, rows: int, text: int,
                      anchors: int, head_chunk: int, kind: str) -> dict[str, int]:
    """The draft's weights and one forward of the accuracy pass's slots, with the LM heads."""
    from lengthwise.dflash.cost.step_memory import step_blocks
    from lengthwise.dflash.head import chunked_agreement
    from lengthwise.dflash.loss import block_hidden, supervised_cross_entropy
    from lengthwise.dflash.model import DFlashDraft
    from lengthwise.dflash.target import Target

    vocab, k = int(config.vocab_size), len(draft_cfg.target_layers)
    with _fake(kind), few_head_chunks():
        target = Target(fake_causal_lm(config, k, dtype), layers=list(range(k)))
        saved = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the draft's .to(dtype)
        try:
            draft = DFlashDraft(draft_cfg).eval()
        finally:
            torch.set_default_dtype(saved)
        blocks = step_blocks(rows, rows * text, anchors, draft_cfg.block_size, vocab)
        feats = torch.zeros(rows, text, k * int(config.hidden_size), dtype=dtype)
        last = torch.zeros(rows, text, int(config.hidden_size), dtype=dtype)
        r, a, b = blocks.labels.shape
        idx = torch.arange(r * a * b).view(r * a, b)[:, 1:].reshape(-1)  # all but anchors
        head_w = target.lm_head.weight
        live = LiveBytes(vocab)
        with live:  # evaluate_blocks: head_loss, then slot_agreement, on the same slots
            hidden = block_hidden(draft, target, blocks, feats=feats, flex=kind == "cuda")
            loss = supervised_cross_entropy(hidden, target.lm_head, blocks.labels.reshape(-1),
                                            blocks.weights.reshape(-1).float(), idx,
                                            chunk=head_chunk)
            del loss
            pos = torch.zeros(idx.numel(), dtype=torch.long)
            agree = chunked_agreement(
                hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx).to(head_w.dtype),
                last.reshape(-1, last.shape[-1]).index_select(0, pos).to(head_w.dtype), head_w,
                None, temperature=1.0, chunk=head_chunk, dtype=head_w.dtype)
            del hidden, agree
    return {"draft": weight_bytes(draft), "slots": live.peak}


def estimate_eval(target_config: Any, *, block_size: int = 16, draft_layers: int = 5,
                  num_features: int | None = None, batch_size: int = 16, max_len: int = 1024,
                  max_new_tokens: int = 256, max_tokens: int = 16384,
                  max_slots: int = 32768, head_chunk: int = 1024, device: str = "cpu",
                  dtype: Any = None, baseline: int = 0) -> StageMemory:
    """The peak of ``dflash eval`` for prompts of at most ``max_len`` tokens: the draft's
    sizes are training's, the others eval's flags; ``baseline``: the process's own bytes."""
    from lengthwise.dflash.evaluate import SLOTS_PER_FORWARD
    from lengthwise.dflash.model import DFlashConfig
    from lengthwise.dflash.objective import target_layer_ids

    _check(block_size=block_size, draft_layers=draft_layers, num_features=num_features,
           batch_size=batch_size, max_len=max_len, max_new_tokens=max_new_tokens,
           max_tokens=max_tokens, max_slots=max_slots, head_chunk=head_chunk)
    if block_size < 2:
        raise ConfigError(f"--block-size must be >= 2, got {block_size}")
    if max_slots < block_size:
        raise ConfigError(f"--max-slots {max_slots} holds no block of --block-size "
                          f"{block_size}")
    kind = _device(device)
    dt = weight_dtype(dtype, kind, target_config)
    depth = int(target_config.num_hidden_layers)
    layers = target_layer_ids(depth, num_features or draft_layers)
    text = min(max_len + max_new_tokens, max_tokens)  # a prompt and its output, cut as eval does
    slots = min(max_slots, SLOTS_PER_FORWARD)
    text_rows = max(1, min(8, slots // block_size, max_tokens // text))
    # anchors: every position of an output (at most max_new_tokens), split into forwards
    per_row = max(1, min(max_new_tokens, text - 1, slots // (text_rows * block_size)))
    cache_cols = 2 * (max_len + max_new_tokens)  # compacted when dead columns match live ones
    fig = per_layer(lambda n: _eval_target_trace(target_config, n, dt, batch_size, max_len,
                                                 cache_cols, block_size, text_rows, text,
                                                 len(layers), kind), depth, len(layers))
    draft_cfg = DFlashConfig.from_target(target_config, num_layers=draft_layers,
                                         block_size=block_size, target_layers=layers,
                                         mask_token_id=int(target_config.vocab_size) - 1)
    dfig = _eval_draft_trace(target_config, dt, draft_cfg, text_rows, text, per_row,
                             head_chunk, kind)
    phases = {"decoding prefill": {"prefill (KV cache, hidden states)": fig["prefill"]},
              "verification": {"KV cache and the verification": fig["verify"]},
              "accuracy pass": {"target features": fig["features_held"],
                                "draft forward and heads": dfig["slots"]}}
    if fig["features"] > fig["features_held"] + dfig["slots"]:
        phases["accuracy pass"] = {"target forward": fig["features"]}
    settings = {"batch_size": batch_size, "max_len": max_len, "max_new_tokens": max_new_tokens,
                "block_size": block_size, "draft_layers": draft_layers,
                "target_layers": layers, "max_tokens": max_tokens, "max_slots": max_slots,
                "accuracy_batch": [text_rows, text],
                "accuracy_slots": text_rows * per_row * block_size,
                "dtype": str(dt).removeprefix("torch.")}
    return _finish("eval", kind, baseline, {"weights": fig["weights"], "draft": dfig["draft"]},
                   phases, settings)


def _pass_trace(config: Any, layers: int, dtype: torch.dtype, rows: int, cols: int,
                feature_layers: int, kind: str) -> dict[str, int]:
    """Weights and the peak of one batch of the feature pass (its target forward)."""
    from lengthwise.dflash.target import Target

    with _fake(kind):
        model = fake_causal_lm(config, layers, dtype)
        target = Target(model, layers=list(range(feature_layers)))
        peak = _features_peak(target, rows, cols, "right" if rows > 1 else None)[1]
        return {"weights": weight_bytes(model), "peak": peak}


def estimate_features(target_config: Any, cfg: Any, *, stored: Any = None,
                      device: str = "cpu", baseline: int = 0) -> StageMemory:
    """The peak of ``dflash features`` with ``cfg`` (a ``FeaturesConfig``).

    ``stored``: the tokens stored per sample (cut to ``max_len``): the pass's own first
    batch (the longest row) and its most padded one are traced; without it, rows of
    ``max_len`` (else ``max_tokens``) tokens, as many as ``max_tokens`` holds. On CPU the
    shard being written counts too (its largest, else ``shard_mib``).

    Example::

        >>> import transformers
        >>> from lengthwise.dflash.features import FeaturesConfig
        >>> t = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4,
        ...                              num_attention_heads=4, intermediate_size=64)
        >>> est = estimate_features(t, FeaturesConfig(num_features=2, max_tokens=64))
        >>> est.settings["batch"], est.peak > est.parts["weights"] > 0
        ([1, 64], True)
    """
    from lengthwise.dflash.features import cache_bytes, plan_pass
    from lengthwise.dflash.objective import target_layer_ids

    kind = _device(device)
    dt = weight_dtype(cfg.target_dtype, kind, target_config)
    depth = int(target_config.num_hidden_layers)
    layers = cfg.layer_list() or target_layer_ids(depth, cfg.num_features)
    if layers[-1] >= depth:
        raise ConfigError(f"--layers {cfg.layers}: the target has layers 0 to {depth - 1}")
    per = cache_bytes(1, len(layers), int(target_config.hidden_size), cfg.dtype, cfg.last_hidden)
    if stored is None:
        cols = min(cfg.max_len or cfg.max_tokens, cfg.max_tokens)
        shapes = {(max(1, cfg.max_tokens // cols), cols)}
        shard = cfg.shard_mib * 2**20
    else:
        plan = plan_pass(stored, max_tokens=cfg.max_tokens,
                         shard_tokens=max(1, cfg.shard_mib * 2**20 // per))
        shard = per * max(plan.shard_tokens(s) for s in range(plan.shards.size - 1))
        rows = np.diff(plan.batches)
        cols = stored[plan.order[plan.batches[:-1]]]  # longest first: a batch's first member
        shapes = {(int(rows[b]), int(cols[b])) for b in (0, int(np.argmax(rows * cols)))}
    figs = {(r, c): per_layer(lambda n, r=r, c=c: _pass_trace(target_config, n, dt, r, c,
                                                              len(layers), kind),
                              depth, len(layers)) for r, c in sorted(shapes)}
    (rows, cols), fig = max(figs.items(), key=lambda kv: kv[1]["peak"])
    settings = {"max_tokens": cfg.max_tokens, "max_len": cfg.max_len, "batch": [rows, cols],
                "target_layers": layers, "dtype": str(dt).removeprefix("torch."),
                "stored_dtype": cfg.dtype, "last_hidden": cfg.last_hidden}
    held = {"weights": fig["weights"]} | ({"shard being written": shard} if kind == "cpu" else {})
    return _finish("features", kind, baseline, held,
                   {"target forward": {"forward, hidden states": fig["peak"]}}, settings)


def estimate_train(target_config: Any, cfg: Any, *, rows: int = 1, world: int = 1,
                   grown: int | None = None, baseline: int = 0,
                   cached: bool = False) -> StageMemory:
    """The peak of ``dflash train`` for ``cfg`` (a ``DFlashTrainConfig``).

    ``grown``: rows of the target's embedding with the mask token (:func:`grown_rows`;
    ``None``: not grown); ``baseline``: the process's bytes on CPU; the step is
    :func:`~lengthwise.dflash.cost.step_memory.estimate_step`'s (``cached``: its features
    read from a feature cache).
    """
    from lengthwise.dflash.cost.step_memory import estimate_step

    kind = "cuda" if str(cfg.device).startswith("cuda") else "cpu"
    vocab = int(target_config.vocab_size)
    rows_after = max(vocab, grown or vocab)
    step = estimate_step(with_layers(target_config, int(target_config.num_hidden_layers),
                                     rows_after), cfg, rows=rows, world=world, cached=cached)
    weights = step.target_weights
    phases = {"training step": {"draft": step.parts["weights"] - weights,
                                **{k: v for k, v in step.parts.items() if k != "weights"}}}
    held = {"weights": weights}
    if rows_after > vocab:  # the embedding (and an untied LM head) before growing
        with _fake(kind):
            model = fake_causal_lm(target_config, 1, torch.bfloat16 if kind == "cuda"
                                   else torch.float32)
            old = storage_bytes([model.get_input_embeddings().weight,
                                 model.get_output_embeddings().weight])
        if kind == "cpu" and checkpoint_dtype(target_config) == torch.float32:
            # the checkpoint's tensors are views of its mapped file, which stays mapped
            # (and resident) while any of them lives: the old embedding's pages too
            held["embedding before growing (file still mapped)"] = old
        else:
            phases["loading and growing the target"] = {"embedding before growing": old}
        if kind == "cpu":  # save_pretrained serialises every tensor before writing
            phases["saving the grown target"] = {"serialised weights": weights}
    settings = {**step.settings, "grown_rows": rows_after if rows_after > vocab else None}
    out = _finish("train", kind, baseline, held, phases, settings)
    out.step = step
    return out
