"""The peak memory of a whole DFlash stage (train, regenerate, eval), from the target's config.

Each estimate reads the target's ``config.json`` (and its tokenizer, where the folder
has one) and the stage's settings, never its weights, and predicts the peak of the
whole process:

- on CPU, the peak **resident memory of the process**: the process itself
  (:func:`process_baseline`: Python, torch, transformers, the target's model code and
  its tokenizer, measured in the estimating process after importing what the stage
  imports), the target's weights in their dtype, and the largest of the stage's phases;
- on CUDA, the peak **allocated memory per GPU** (``torch.cuda.max_memory_allocated``):
  the weights and the largest phase; the CUDA context, library workspaces and the
  caching allocator's reserve are outside it (about 0.5 to 1 GiB).

The phases, each traced under fake tensors (shapes, no storage) through the code the
stage runs, with a tracker of every storage created and freed
(:class:`~lengthwise.dflash.memory._Tracker`):

- ``train``: loading the target, growing its vocabulary by the mask token's row and
  saving it into the run (where the tokenizer needs the row), then a training step at
  its worst micro-batch (:func:`~lengthwise.dflash.memory.estimate_step`: the draft,
  AdamW's state, gradients, activations, the LM head's chunk; with a feature cache,
  no target forward);
- ``features``: ``dflash features``, the target's forward of its largest batch
  (``max_tokens`` padded tokens, every layer's hidden states kept until it returns);
- ``regenerate``: Hugging Face ``generate`` of ``batch_size`` prompts of ``max_len``
  tokens: the prefill (KV cache, last-position logits) and the last decoding step
  (the cache of ``max_len + max_new_tokens - 1`` tokens);
- ``eval``: speculative decoding of ``batch_size`` prompts (the prefill with every
  layer's hidden states, a verification with the cache at its most, twice the
  longest row), and the teacher-forced accuracy pass (the target's features of a batch
  of prompt + output texts, one draft forward of its slots with the LM heads). The
  lossless check and the prompt-lookup baseline decode one prompt at a time, less.

Forward passes are traced on targets of two shallow depths (``k + 1`` and ``k + 2``
layers, ``k`` the layers feeding the draft; 2 and 3 for regeneration) and extrapolated
to the target's depth: from the second layer on each layer adds the same bytes
(weights, cache, hidden states; tested against a trace at full depth), so the trace
takes about a second whatever the depth. The training step is traced likewise
(:data:`~lengthwise.dflash.memory.SHALLOW_TARGET`).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lengthwise.dflash.memory import _bytes
from lengthwise.errors import ConfigError

__all__ = ["STAGES", "StageMemory", "estimate_eval", "estimate_features", "estimate_regenerate",
           "estimate_train", "grown_rows", "process_baseline"]

GIB = 2**30
#: the stages an estimate covers
STAGES = ("train", "regenerate", "eval", "features")
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
    step: Any = None  # train: the step's MemoryEstimate (its parts, as `dflash estimate` had)

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
        lines = [f"{self.what}: {self.peak / GIB:.2f} GiB ({self.stage}: "
                 f"{COVERS[self.stage]})",
                 f"  the peak falls in: {self.phase}; phases: "
                 + ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.phases.items()) + " GiB"]
        for name, size in self.parts.items():
            lines.append(f"  {name:<22} {size / GIB:8.2f} GiB")
        return "\n".join(lines)


def process_baseline(stage: str, target_config: Any, tokenizer_dir: str | Path | None = None,
                     ) -> int:
    """Resident bytes of this process after importing what ``stage`` imports (CPU baseline).

    Imports the stage's modules, the target's model code and pyarrow, loads the
    target's tokenizer from ``tokenizer_dir`` when given, and reads the resident set
    (:func:`~lengthwise.dflash.process.resident_bytes`). The estimating process holds
    what the stage's process holds before it reads any weights.
    """
    import importlib

    import transformers

    from lengthwise.dflash.process import resident_bytes

    modules = {"train": ("lengthwise.dflash.recipe", "pyarrow.parquet"),
               "regenerate": ("lengthwise.dflash.prepare", "lengthwise.dflash.regenerate",
                              "pyarrow.parquet"),
               "eval": ("lengthwise.dflash.evaluate", "lengthwise.dflash.speculative",
                        "lengthwise.dflash.lookup"),
               "features": ("lengthwise.dflash.features", "lengthwise.dflash.prepared")}[stage]
    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _model_class(target_config)
    if tokenizer_dir is not None:
        transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return resident_bytes()


def _model_class(config: Any) -> Any:
    """The causal-LM class of ``config`` (importing its module)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def grown_rows(tokenizer: Any, target_config: Any, generation_config: Any = None) -> int:
    """Rows of the target's embedding once the mask token is in it (as ``dflash train`` does).

    :func:`~lengthwise.dflash.mask_token.ensure_mask_token`'s choice on a stand-in of the
    target (its config and embedding size, no weights): more rows than ``vocab_size`` when
    the tokenizer has no mask token nor a special token the target never writes. Adds
    ``<|MASK|>`` to ``tokenizer`` where that is the choice, as the stage does.
    """
    from types import SimpleNamespace

    from lengthwise.dflash.mask_token import mask_token_choice

    rows = int(target_config.vocab_size)
    model = SimpleNamespace(config=target_config, generation_config=generation_config,
                            get_input_embeddings=lambda: SimpleNamespace(
                                weight=SimpleNamespace(shape=(rows,))))
    return max(rows, mask_token_choice(tokenizer, model)[1] + 1)


def _shallow(config: Any, layers: int, vocab: int | None = None) -> Any:
    """``config`` with ``layers`` decoder layers (and ``vocab`` rows)."""
    from lengthwise.dflash.memory import _with_layers

    out = _with_layers(config, layers)
    if vocab is not None:
        out.vocab_size = vocab
    return out


def _dtype(name: Any, device: str, config: Any) -> torch.dtype:
    """The weights' dtype the stage loads: ``name``, else float32 on CPU, the config's on CUDA."""
    from lengthwise.dflash.target import WEIGHT_DTYPES

    if name is not None:
        if str(name) not in WEIGHT_DTYPES:
            raise ConfigError(f"--dtype must be one of float32, bfloat16, float16, got {name!r}")
        return WEIGHT_DTYPES[str(name)]
    if device == "cuda":
        own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(own, torch.dtype):
            return own
        return WEIGHT_DTYPES.get(str(own).removeprefix("torch."), torch.bfloat16)
    return torch.float32


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Any:
    """Modules built inside have ``dtype`` weights (as the stage's ``.to(dtype)`` gives)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _per_layer(trace: Callable[[int], dict[str, int]], depth: int, k: int) -> dict[str, int]:
    """``trace(n)``'s figures at ``depth`` layers, from traces at two shallow depths.

    ``k``: the fewest layers the trace takes. From the second layer on every layer adds
    the same bytes (its weights, its cache, its hidden state); the first one differs
    (the embedding's output is freed there), so the two depths are 2 or more.
    """
    lo_n = max(2, k + 1)
    if depth <= lo_n + 1:
        return trace(depth)
    lo, hi = trace(lo_n), trace(lo_n + 1)
    return {name: lo[name] + (depth - lo_n) * (hi[name] - lo[name]) for name in lo}


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


def _kernels(kind: str) -> Any:
    from lengthwise.dflash.memory import _fused_kernels

    return _fused_kernels() if kind == "cuda" else contextlib.nullcontext()


def _finish(stage: str, kind: str, baseline: int, weights: dict[str, int],
            phases: dict[str, dict[str, int]], settings: dict[str, Any]) -> StageMemory:
    """The peak: the process (CPU), the weights, and the parts of the largest phase."""
    totals = {name: sum(p.values()) for name, p in phases.items()}
    top = max(totals, key=lambda n: totals[n])
    parts = ({"process": baseline} if kind == "cpu" else {}) | weights | phases[top]
    held = sum(parts.values()) - totals[top]
    return StageMemory(stage=stage, device=kind, peak=sum(parts.values()), parts=parts,
                       phase=top, phases={n: held + t for n, t in totals.items()},
                       settings=settings)


# ---------------------------------------------------------------- regenerate


def _generate_trace(config: Any, layers: int, dtype: torch.dtype, rows: int, prompt: int,
                    new: int, kind: str) -> dict[str, int]:
    """Weights, the prefill's peak and the last decoding step's peak (cache included)."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.memory import _Tracker
    from lengthwise.dflash.speculative import _cache_kwarg, _cache_of

    with FakeTensorMode(), _kernels(kind), torch.no_grad():
        model = transformers.AutoModelForCausalLM.from_config(
            _shallow(config, layers), dtype=dtype).eval()
        weights = _bytes([*model.parameters(), *model.buffers()])
        vocab = int(config.vocab_size)
        out = {"weights": weights}
        for name, cols, step in (("prefill", prompt, False), ("decode", prompt + new - 1, True)):
            ids = torch.zeros(rows, cols, dtype=torch.long)
            mask = torch.ones(rows, cols, dtype=torch.long)
            mask[1:, : cols // 2] = 0  # left padding: generate's attention mask
            tracker = _Tracker(vocab)
            with tracker:
                res = model(input_ids=ids, attention_mask=mask, use_cache=True,
                            logits_to_keep=1)
                if step:
                    tracker._sweep()  # what the prefill freed on returning
                    tracker.peak = tracker.now  # the last step: the cache before it is held
                    mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
                    res = model(input_ids=ids[:, :1], attention_mask=mask, use_cache=True,
                                logits_to_keep=1, **{_cache_kwarg(model): _cache_of(res)})
                del res
            out[name] = tracker.peak
    return out


def estimate_regenerate(target_config: Any, *, batch_size: int = 32, max_len: int = 1024,
                        max_new_tokens: int = 512, device: str = "cpu", dtype: Any = None,
                        baseline: int = 0) -> StageMemory:
    """The peak of ``dflash prepare --regenerate`` (Hugging Face ``generate``, see the module doc).

    ``batch_size`` prompts of ``max_len`` tokens (the longest prompt) each write
    ``max_new_tokens`` tokens; ``baseline``: the process's own bytes on CPU
    (:func:`process_baseline`).
    """
    _check(batch_size=batch_size, max_len=max_len, max_new_tokens=max_new_tokens)
    kind = _device(device)
    dt = _dtype(dtype, kind, target_config)
    depth = int(target_config.num_hidden_layers)
    fig = _per_layer(lambda n: _generate_trace(target_config, n, dt, batch_size, max_len,
                                               max_new_tokens, kind), depth, 0)
    phases = {"prefill": {"prefill (KV cache, activations)": fig["prefill"]},
              "last decoding step": {"KV cache and the step": fig["decode"]}}
    settings = {"batch_size": batch_size, "max_len": max_len, "max_new_tokens": max_new_tokens,
                "dtype": str(dt).removeprefix("torch."), "target_layers": depth}
    return _finish("regenerate", kind, baseline, {"weights": fig["weights"]}, phases, settings)


# ---------------------------------------------------------------- eval


def _eval_target_trace(config: Any, layers: int, dtype: torch.dtype, rows: int, prompt: int,
                       cache_cols: int, block: int, text_rows: int, text: int,
                       feature_layers: int, kind: str) -> dict[str, int]:
    """Weights; the decoding prefill, a verification, the accuracy pass's target forward."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.memory import _Tracker
    from lengthwise.dflash.speculative import _cache_kwarg, _cache_of
    from lengthwise.dflash.target import Target

    with FakeTensorMode(), _kernels(kind), torch.no_grad():
        model = transformers.AutoModelForCausalLM.from_config(
            _shallow(config, layers), dtype=dtype).eval()
        target = Target(model, layers=list(range(feature_layers)))
        out = {"weights": _bytes([*model.parameters(), *model.buffers()])}
        vocab = int(config.vocab_size)
        ids = torch.zeros(rows, prompt, dtype=torch.long)
        mask = torch.ones(rows, prompt, dtype=torch.long)
        mask[1:, : prompt // 2] = 0
        tracker = _Tracker(vocab)
        with tracker:  # speculative_batch's prefill
            res = model(input_ids=ids, attention_mask=mask, use_cache=True,
                        output_hidden_states=True, logits_to_keep=1)
            feats = torch.cat([res.hidden_states[i + 1] for i in target.layers], dim=-1)
            del res
        out["prefill"] = tracker.peak
        del feats
        tracker = _Tracker(vocab)
        with tracker:  # a verification of a block with the cache at its most
            ids = torch.zeros(rows, cache_cols, dtype=torch.long)
            res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            tracker._sweep()
            tracker.peak = tracker.now
            cache = _cache_of(res)
            del res
            res = model(input_ids=ids[:, :block], use_cache=True, output_hidden_states=True,
                        **{_cache_kwarg(model): cache})
            del res, cache
        out["verify"] = tracker.peak
        out["features_held"], out["features"] = _features_peak(target, text_rows, text)
    return out


def _features_peak(target: Any, rows: int, cols: int, *, padded: bool = False,
                   ) -> tuple[int, int]:
    """``(held after, peak)`` of ``target.features_and_output`` on ``rows x cols`` tokens
    (``padded``: right padding in all rows but the first, as ``dflash features`` pads)."""
    from lengthwise.dflash.memory import _Tracker

    tracker = _Tracker(target.vocab_size)
    with tracker:  # the features and final hidden states of a batch
        ids = torch.zeros(rows, cols, dtype=torch.long)
        mask = None
        if padded:
            mask = torch.ones(rows, cols, dtype=torch.long)
            mask[1:, cols // 2:] = 0
        feats, last = target.features_and_output(ids, attention_mask=mask)
        tracker._sweep()  # the hidden states of every layer, freed on returning
        held = tracker.now
        del feats, last
    return held, tracker.peak


def _eval_draft_trace(config: Any, dtype: torch.dtype, draft_cfg: Any, rows: int, text: int,
                      anchors: int, head_chunk: int, kind: str) -> dict[str, int]:
    """The draft's weights and one forward of the accuracy pass's slots, with the LM heads."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.head import chunked_agreement
    from lengthwise.dflash.loss import block_hidden, supervised_cross_entropy
    from lengthwise.dflash.memory import _few_head_chunks, _Tracker, step_blocks
    from lengthwise.dflash.model import DFlashDraft
    from lengthwise.dflash.target import Target

    vocab = int(config.vocab_size)
    k = len(draft_cfg.target_layers)
    with FakeTensorMode(), _kernels(kind), _few_head_chunks(), torch.no_grad():
        model = transformers.AutoModelForCausalLM.from_config(
            _shallow(config, k), dtype=dtype).eval()
        target = Target(model, layers=list(range(k)))
        with _default_dtype(dtype):
            draft = DFlashDraft(draft_cfg).eval()
        weights = _bytes([*draft.parameters(), *draft.buffers()])
        blocks = step_blocks(rows, rows * text, anchors, draft_cfg.block_size, vocab)
        feats = torch.zeros(rows, text, k * int(config.hidden_size), dtype=dtype)
        last = torch.zeros(rows, text, int(config.hidden_size), dtype=dtype)
        r, a, b = blocks.labels.shape
        idx = torch.arange(r * a * b).view(r * a, b)[:, 1:].reshape(-1)  # all but anchors
        lab, w = blocks.labels.reshape(-1), blocks.weights.reshape(-1).float()
        head_w = target.lm_head.weight
        tracker = _Tracker(vocab)
        with tracker:  # evaluate_blocks: head_loss, then slot_agreement, on the same slots
            hidden = block_hidden(draft, target, blocks, feats=feats, flex=kind == "cuda")
            weighted, ce, hit = supervised_cross_entropy(hidden, target.lm_head, lab, w, idx,
                                                         chunk=head_chunk)
            del weighted, ce, hit
            pos = torch.zeros(idx.numel(), dtype=torch.long)
            agree = chunked_agreement(
                hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx).to(head_w.dtype),
                last.reshape(-1, last.shape[-1]).index_select(0, pos).to(head_w.dtype), head_w,
                None, temperature=1.0, chunk=head_chunk, dtype=head_w.dtype)
            del hidden, agree
    return {"draft": weights, "slots": tracker.peak}


def estimate_eval(target_config: Any, *, block_size: int = 16, draft_layers: int = 5,
                  num_features: int | None = None, batch_size: int = 16, max_len: int = 1024,
                  max_new_tokens: int = 256, max_tokens: int = 16384,
                  max_slots: int = 32768, head_chunk: int = 1024, device: str = "cpu",
                  dtype: Any = None, baseline: int = 0) -> StageMemory:
    """The peak of ``dflash eval`` (see the module doc) for prompts of at most ``max_len`` tokens.

    The draft's sizes (``block_size``, ``draft_layers``, ``num_features``) are training's;
    ``batch_size``, ``max_new_tokens``, ``max_tokens``, ``max_slots`` and ``head_chunk``
    are eval's flags; ``baseline``: the process's own bytes on CPU.
    """
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
    dt = _dtype(dtype, kind, target_config)
    depth = int(target_config.num_hidden_layers)
    layers = target_layer_ids(depth, num_features or draft_layers)
    k = len(layers)
    text = min(max_len + max_new_tokens, max_tokens)  # a prompt and its output, cut as eval does
    slots = min(max_slots, SLOTS_PER_FORWARD)
    text_rows = max(1, min(8, slots // block_size, max_tokens // text))
    # anchors: every position of an output (at most max_new_tokens), split into forwards
    per_row = max(1, min(max_new_tokens, text - 1, slots // (text_rows * block_size)))
    cache_cols = 2 * (max_len + max_new_tokens)  # compacted when dead columns match live ones
    fig = _per_layer(lambda n: _eval_target_trace(target_config, n, dt, batch_size, max_len,
                                                  cache_cols, block_size, text_rows, text, k,
                                                  kind),
                     depth, k)
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
                "accuracy_batch": [text_rows, text], "accuracy_slots": text_rows * per_row
                * block_size, "dtype": str(dt).removeprefix("torch.")}
    return _finish("eval", kind, baseline, {"weights": fig["weights"], "draft": dfig["draft"]},
                   phases, settings)


# ---------------------------------------------------------------- features


def _pass_trace(config: Any, layers: int, dtype: torch.dtype, rows: int, cols: int,
                feature_layers: int, kind: str) -> dict[str, int]:
    """Weights and the peak of one batch of the feature pass (its target forward)."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.target import Target

    with FakeTensorMode(), _kernels(kind), torch.no_grad():
        model = transformers.AutoModelForCausalLM.from_config(
            _shallow(config, layers), dtype=dtype).eval()
        target = Target(model, layers=list(range(feature_layers)))
        peak = _features_peak(target, rows, cols, padded=rows > 1)[1]
        return {"weights": _bytes([*model.parameters(), *model.buffers()]), "peak": peak}


def estimate_features(target_config: Any, cfg: Any, *, stored: Any = None,
                      device: str = "cpu", baseline: int = 0) -> StageMemory:
    """The peak of ``dflash features`` with ``cfg`` (a ``FeaturesConfig``; see the module doc).

    ``stored``: the tokens stored per sample (the prepared lengths cut to ``max_len``): the
    pass's own batches, its first (the longest row) and its most padded tokens, are traced.
    Without it: rows of ``max_len`` (else ``max_tokens``) tokens, as many as ``max_tokens``
    holds. On CPU the shard being written counts too: its memory-mapped pages are resident
    once written (its largest, else ``shard_mib``). ``baseline``: the process's bytes on CPU.

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
    dt = _dtype(cfg.target_dtype, kind, target_config)
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
    figs = [_per_layer(lambda n, r=r, c=c: _pass_trace(target_config, n, dt, r, c, len(layers),
                                                       kind), depth, len(layers))
            for r, c in sorted(shapes)]
    fig = max(figs, key=lambda f: f["peak"])
    rows, cols = sorted(shapes)[figs.index(fig)]
    phases = {"target forward": {"forward, hidden states": fig["peak"]}}
    settings = {"max_tokens": cfg.max_tokens, "max_len": cfg.max_len, "batch": [rows, cols],
                "target_layers": layers, "dtype": str(dt).removeprefix("torch."),
                "stored_dtype": cfg.dtype, "last_hidden": cfg.last_hidden}
    held = {"weights": fig["weights"]} | ({"shard being written": shard} if kind == "cpu" else {})
    return _finish("features", kind, baseline, held, phases, settings)


# ---------------------------------------------------------------- train


def estimate_train(target_config: Any, cfg: Any, *, rows: int = 1, world: int = 1,
                   grown: int | None = None, baseline: int = 0,
                   cached: bool = False) -> StageMemory:
    """The peak of ``dflash train`` for ``cfg`` (a ``DFlashTrainConfig``; see the module doc).

    ``grown``: rows of the target's embedding with the mask token (:func:`grown_rows`;
    ``None``: its ``vocab_size``, not grown); ``baseline``: the process's bytes on CPU.
    The step's parts are :func:`~lengthwise.dflash.memory.estimate_step`'s; ``cached``:
    its features read from a feature cache (``dflash train --features``).
    """
    from lengthwise.dflash.memory import estimate_step

    kind = "cuda" if str(cfg.device).startswith("cuda") else "cpu"
    vocab = int(target_config.vocab_size)
    rows_after = max(vocab, grown or vocab)
    tcfg = _shallow(target_config, int(target_config.num_hidden_layers), rows_after)
    step = estimate_step(tcfg, cfg, rows=rows, world=world, cached=cached)
    weights = _target_weights(tcfg, step)
    phases: dict[str, dict[str, int]] = {
        "training step": {"draft": step.parts["weights"] - weights,
                          "optimizer": step.parts["optimizer"],
                          **{k: v for k, v in step.parts.items()
                             if k not in ("weights", "optimizer")}}}
    held = {"weights": weights}
    if rows_after > vocab:
        old = _embedding_bytes(target_config, vocab, 2 if kind == "cuda" else 4)
        if kind == "cpu" and _checkpoint_dtype(target_config) == torch.float32:
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


def _checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype ``config.json`` gives the checkpoint's weights (``None``: not given)."""
    from lengthwise.dflash.target import WEIGHT_DTYPES

    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, torch.dtype):
        return own
    return WEIGHT_DTYPES.get(str(own).removeprefix("torch.")) if own else None


def _target_weights(config: Any, step: Any) -> int:
    """The target's share of the step's weights (the rest is the draft's)."""
    per = 2 if step.device == "cuda" else 4  # bf16 on CUDA, fp32 on CPU (estimate_step's)
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    def trace(n: int) -> dict[str, int]:
        with FakeTensorMode():
            m = transformers.AutoModelForCausalLM.from_config(_shallow(config, n),
                                                              dtype=torch.float32)
            return {"w": _bytes([*m.parameters(), *m.buffers()]) // 4 * per}

    return _per_layer(trace, int(config.num_hidden_layers), 0)["w"]


def _embedding_bytes(config: Any, vocab: int, elt: int) -> int:
    """Bytes of the embedding (and an untied LM head) before growing: held while it grows."""
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return vocab * int(config.hidden_size) * elt * (1 if tied else 2)
