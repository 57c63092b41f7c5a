"""What the batch order does to a DFlash draft: every order x several seeds at equal real tokens.

The corpus is the order-quality experiment's (:func:`~lengthwise.demo.evidence.build_data`:
samples of ``min_len`` to ``max_len`` tokens). A target, a small causal LM, is trained
once on its training samples (cached; every order and seed shares it). Each sample
then becomes a DFlash sample of the same length: its first tokens are the prompt, and
its last ``min(response_len, n // 2)`` tokens are replaced by the target's own greedy
continuation of that prompt (what the draft must learn to predict), so the lengths keep
the corpus's span.

One run trains a draft from its seed with one order up to the budget of real tokens
(``token_budget``, or ``epochs`` times the training set's tokens), the learning rate
following the tokens (:func:`~lengthwise.demo.evidence.lr_at`), steps of ``grad_accum``
micro-batches from a simulated job of ``world`` ranks. Then, on the held-out samples:

* teacher-forced top-1 accuracy of the draft's block slots (every position of the response
  an anchor), overall and per length stratum (the plan's buckets), with the acceptance
  length those accuracies imply;
* real speculative decoding at temperature 0 of ``eval_prompts`` held-out prompts, the same
  number from each stratum (:func:`~lengthwise.dflash.speculative.speculative_batch`): the
  acceptance length (tokens kept per verifying target forward), overall and per stratum,
  and whether every output equals the target's greedy output (``lossless``).

Example::

    >>> cfg = DFlashEvidenceConfig(orders=("random",), seeds=(0,))
    >>> response_length(8, cfg.response_len), response_length(200, cfg.response_len)
    (4, 32)
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.demo.config import check_positive
from lengthwise.demo.evidence import EvidenceConfig, _set_lr, build_data, lr_at
from lengthwise.errors import ConfigError

__all__ = ["DFlashEvidence", "DFlashEvidenceConfig", "build_dflash_data", "load_target",
           "response_length", "run_dflash_one"]

#: version of the target's recipe and of the regenerated data, part of their cache keys
RECIPE = 1


@dataclass
class DFlashEvidenceConfig(EvidenceConfig):
    """The corpus settings of :class:`~lengthwise.demo.evidence.EvidenceConfig` plus the
    target's, the draft's and the evaluation's (``model_size`` is unused: the draft is
    sized from the target)."""

    target_size: str = "small"
    target_epochs: float = 3.0
    target_max_tokens: int = 1024
    block_size: int = 8
    draft_layers: int = 1
    num_features: int = 2
    num_anchors: int = 12
    response_len: int = 32
    eval_prompts: int = 48

    def __post_init__(self) -> None:
        super().__post_init__()
        from lengthwise.demo.model import MODEL_SIZES

        if self.target_size not in MODEL_SIZES:
            raise ConfigError(f"target_size must be among {', '.join(MODEL_SIZES)}, got "
                              f"{self.target_size!r}")
        if not self.target_epochs > 0:
            raise ConfigError(f"target_epochs must be > 0, got {self.target_epochs}")
        check_positive(self, "target_max_tokens", "block_size", "draft_layers", "num_features",
                       "num_anchors", "response_len", "eval_prompts")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if self.min_len < 4:
            raise ConfigError(f"min_len must be >= 4 (two prompt and two response tokens), "
                              f"got {self.min_len}")

    def target_key(self, fingerprint: str) -> str:
        """The cache key of the target trained on the data of ``fingerprint``."""
        parts = {k: getattr(self, k) for k in ("target_size", "target_epochs",
                                               "target_max_tokens", "max_len", "lr",
                                               "warmup_share", "data_seed", "vocab_size")}
        text = json.dumps({"data": fingerprint, "recipe": RECIPE, **parts}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def response_length(n: int, response_len: int) -> int:
    """Tokens of a sample of ``n`` tokens the target writes: half of it, at most
    ``response_len``.

    Example::

        >>> [response_length(n, 32) for n in (4, 9, 64, 256)]
        [2, 4, 32, 32]
    """
    return min(response_len, n // 2)


@dataclass
class DFlashEvidence:
    """The DFlash samples (training, then held-out), the strata and the decoding prompts."""

    data: Any  # lengthwise.demo.dflash_data.DFlashData
    edges: list[int]
    strata: list[str]
    held_stratum: np.ndarray  # stratum of each held-out sample
    prompts: list[list[int]]  # decoding prompts, ``eval_prompts // strata`` per stratum
    prompt_stratum: list[int]
    references: list[list[int]]  # the target's greedy output of each prompt
    target_dir: str
    info: dict[str, Any] = field(default_factory=dict)


def _fingerprint(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for x in arrays:
        h.update(np.asarray(x, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def _train_target(train: list[np.ndarray], held: list[np.ndarray], vocab_size: int,
                  cfg: DFlashEvidenceConfig, folder: Path) -> dict[str, Any]:
    """Train the target on ``train`` (stratified batches, the learning rate over the tokens)
    and save it in ``folder``; what its training measured."""
    from lengthwise.demo.config import DemoConfig
    from lengthwise.demo.lm import LMTask, evaluate_samples
    from lengthwise.demo.model import build_model
    from lengthwise.train.device import configure_torch, pick_device
    from lengthwise.train.loop import TrainLoop

    loop_cfg = DemoConfig(steps=10**9, grad_accum=4, max_tokens=cfg.target_max_tokens,
                          max_len=cfg.max_len, lr=cfg.lr, warmup=0, schedule="constant",
                          seed=cfg.data_seed, buckets=cfg.buckets, model_size=cfg.target_size,
                          threads=cfg.threads, progress=False)
    device = pick_device("cpu")
    configure_torch(device, threads=cfg.threads, deterministic=True)
    model = build_model(cfg.target_size, vocab_size=vocab_size, max_len=cfg.max_len,
                        seed=cfg.data_seed, device=device)
    model.train()
    lengths = np.array([x.size for x in train], dtype=np.int64)
    loop = TrainLoop(LMTask(model, device=device), "stratified", lengths,
                     lambda i: {"input_ids": train[i]}, loop_cfg,
                     run_dir=folder.with_name(folder.name + "-run"), device=device)
    budget = int(round(cfg.target_epochs * lengths.sum()))
    tokens, started = 0, time.perf_counter()
    try:
        while tokens < budget:
            _set_lr(loop, lr_at(tokens, cfg, budget))
            tokens += int(loop.step()["real_tokens"])
    finally:
        loop.close()
    sums, counts = evaluate_samples(model, held, max_tokens=cfg.max_tokens, device=device,
                                    pad_multiple=1)
    info = {"target_eval_loss": float(sums.sum() / counts.sum()), "target_steps": loop.step_count,
            "target_tokens": tokens, "target_train_seconds": time.perf_counter() - started}
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    (folder / "lengthwise.json").write_text(json.dumps(info), encoding="utf-8")
    return info


def load_target(folder: str | Path, cfg: DFlashEvidenceConfig) -> tuple[Any, int]:
    """The cached target as a :class:`~lengthwise.dflash.target.Target` (its vocabulary grown
    by the mask token), and the mask token's id."""
    import transformers

    from lengthwise.dflash.mask_token import grow_vocabulary
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.target import Target

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    model.eval()
    mask_id = int(model.get_input_embeddings().weight.shape[0])
    grow_vocabulary(model, mask_id + 1)
    layers = target_layer_ids(model.config.num_hidden_layers, cfg.num_features)
    return Target(model, layers=layers), mask_id


def build_dflash_data(cfg: DFlashEvidenceConfig, texts: list[str] | None = None,
                      cache_dir: str | Path | None = None,
                      target_cache: str | Path | None = None) -> DFlashEvidence:
    """The corpus, the target (trained once, cached), the samples with the target's responses,
    the strata and the decoding prompts with the target's greedy outputs (cached too).

    The corpus and tokenizer are cached in ``cache_dir``, the target and its responses in
    ``target_cache`` (default: ``cache_dir``).
    """
    from lengthwise.demo.config import DemoConfig
    from lengthwise.demo.dflash_data import DFlashData
    from lengthwise.demo.tokenizer import default_cache_dir
    from lengthwise.dflash.evaluate import greedy_reference
    from lengthwise.dflash.generate import generate_responses
    from lengthwise.train.device import configure_torch, pick_device
    from lengthwise.train.loop import make_sampler

    base = build_data(cfg, texts=texts, cache_dir=cache_dir)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache = Path(target_cache) if target_cache is not None else cache
    cache.mkdir(parents=True, exist_ok=True)
    fp = _fingerprint(base.train + base.eval)
    folder = cache / f"dflash-evidence-target-{cfg.target_key(fp)}"
    if (folder / "lengthwise.json").is_file():
        target_info = json.loads((folder / "lengthwise.json").read_text(encoding="utf-8"))
    else:
        target_info = _train_target(base.train, base.eval, base.vocab_size, cfg, folder)
    configure_torch(pick_device("cpu"), threads=cfg.threads, deterministic=True)
    target, _ = load_target(folder, cfg)
    eos = [0]
    seqs = base.train + base.eval
    keys = {"target": folder.name, "response_len": cfg.response_len,
            "eval_prompts": cfg.eval_prompts, "recipe": RECIPE}
    key = hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]
    path = cache / f"dflash-evidence-data-{key}.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
    else:
        started = time.perf_counter()
        prompts = [x[: x.size - response_length(x.size, cfg.response_len)] for x in seqs]
        resp = generate_responses(target.model, prompts, max_new_tokens=cfg.response_len,
                                  eos=eos, temperature=0.0, seed=cfg.data_seed)
        saved = {"responses": [r[: response_length(x.size, cfg.response_len)].tolist()
                               for x, r in zip(seqs, resp, strict=True)],
                 "seconds": time.perf_counter() - started}
    ids = [np.concatenate([x[: x.size - response_length(x.size, cfg.response_len)],
                           np.asarray(r, dtype=np.int64)]).astype(np.int64)
           for x, r in zip(seqs, saved["responses"], strict=True)]
    plens = np.array([x.size - response_length(x.size, cfg.response_len) for x in seqs])
    n_train = len(base.train)
    data = DFlashData(ids=ids, prompt_lens=plens,
                      held=np.arange(n_train, len(ids), dtype=np.int64))
    lengths = data.lengths
    plan_cfg = DemoConfig(max_len=cfg.max_len, max_tokens=cfg.max_tokens, buckets=cfg.buckets,
                          grad_accum=cfg.grad_accum, progress=False)
    edges = [int(e) for e in make_sampler("stratified", lengths, plan_cfg).edges]
    lows = [int(lengths.min()), *(e + 1 for e in edges[:-1])]
    strata = [f"{lo}-{hi}" for lo, hi in zip(lows, edges, strict=True)]
    held_len = np.array([ids[j].size for j in data.held])
    held_stratum = np.minimum(np.searchsorted(np.asarray(edges), held_len, side="left"),
                              len(edges) - 1)
    per = max(1, cfg.eval_prompts // len(edges))
    picks = [int(j) for k in range(len(edges))
             for j in np.flatnonzero(held_stratum == k)[:per]]
    prompts = [ids[int(data.held[j])][: int(plens[int(data.held[j])])].tolist() for j in picks]
    if "references" not in saved:
        saved["references"] = [greedy_reference(target, p, cfg.response_len, eos)
                               for p in prompts]
        path.write_text(json.dumps(saved), encoding="utf-8")
    supervised = int(sum(ids[i].size - plens[i] for i in data.train_index))
    p50, p99 = (int(v) for v in np.percentile(lengths, [50, 99]))
    info = {**{k: base.info[k] for k in ("corpus", "tokenizer")},
            "train_samples": int(data.train_index.size), "train_tokens": int(lengths.sum()),
            "train_supervised_tokens": supervised, "eval_samples": int(data.held.size),
            "length_min": int(lengths.min()), "length_p50": p50, "length_p99": p99,
            "length_max": int(lengths.max()),
            "length_span": round(float(lengths.max() / lengths.min()), 1),
            "token_budget": cfg.budget(int(lengths.sum())),
            "prompts": len(prompts),
            "prompt_lengths": [min(len(p) for p in prompts), max(len(p) for p in prompts)],
            "regenerate_seconds": saved["seconds"],
            "target": f"{cfg.target_size} Llama-style model trained on the training samples",
            "target_parameters": sum(p.numel() for p in target.model.parameters()),
            "target_layers": target.layers, **target_info}
    return DFlashEvidence(data=data, edges=edges, strata=strata, held_stratum=held_stratum,
                          prompts=prompts, prompt_stratum=[int(held_stratum[j]) for j in picks],
                          references=saved["references"], target_dir=str(folder), info=info)


_TARGETS: dict[str, tuple[Any, int]] = {}


def _target(ev: DFlashEvidence, cfg: DFlashEvidenceConfig) -> tuple[Any, int]:
    """The shared target, loaded once per process."""
    if ev.target_dir not in _TARGETS:
        _TARGETS[ev.target_dir] = load_target(ev.target_dir, cfg)
    return _TARGETS[ev.target_dir]


def _evaluate(draft: Any, target: Any, ev: DFlashEvidence, cfg: DFlashEvidenceConfig,
              ) -> dict[str, Any]:
    """Teacher-forced accuracy per stratum and overall; acceptance from real decoding."""
    from lengthwise.dflash.decode import evaluate_blocks
    from lengthwise.dflash.evaluate import SLOTS_PER_FORWARD
    from lengthwise.dflash.recipe import held_out_batches
    from lengthwise.dflash.speculative import speculative_batch

    held = ev.data.held_samples()
    per: list[dict[str, Any]] = []
    correct = count = 0.0
    weighted = weight = 0.0
    for k in range(len(ev.edges)):
        samples = [s for s, z in zip(held, ev.held_stratum, strict=True) if z == k]
        if not samples:
            per.append({"accuracy": None, "loss": None, "slot_accuracy": None, "count": 0})
            continue
        be = evaluate_blocks(draft, target, held_out_batches(samples, max_tokens=cfg.max_tokens),
                             num_anchors=cfg.max_len, slots_per_forward=SLOTS_PER_FORWARD)
        per.append({"accuracy": be.accuracy, "loss": be.loss, "slot_accuracy": be.slot_accuracy,
                    "simulated_acceptance_length": be.simulated_acceptance_length,
                    "count": be.count})
        correct += be.accuracy * be.count
        count += be.count
        weighted += be.loss * be.weight
        weight += be.weight
    gens = []
    was = draft.training
    draft.eval()
    try:
        for lo in range(0, len(ev.prompts), 16):
            gens += speculative_batch(draft, target, ev.prompts[lo:lo + 16],
                                      max_new_tokens=cfg.response_len, temperature=0.0, eos=[0])
    finally:
        draft.train(was)
    accept = []
    for k in range(len(ev.edges)):
        kept = [a for g, z in zip(gens, ev.prompt_stratum, strict=True) if z == k
                for a in g.accepted]
        accept.append(float(np.mean(kept)) if kept else None)
    kept = [a for g in gens for a in g.accepted]
    return {"accuracy": correct / count if count else None,
            "eval_loss": weighted / weight if weight else None,
            "strata_accuracy": [p["accuracy"] for p in per],
            "strata_acceptance": accept,
            "strata_detail": per,
            "acceptance_length": float(np.mean(kept)) if kept else None,
            "verify_forwards": len(kept),
            "mismatches": sum(g.tokens != r for g, r in zip(gens, ev.references, strict=True)),
            "lossless": all(g.tokens == r for g, r in zip(gens, ev.references, strict=True))}


def run_dflash_one(order: str, seed: int, ev: DFlashEvidence, cfg: DFlashEvidenceConfig, *,
                   out: str | Path) -> dict[str, Any]:
    """Train one order's draft with one seed up to the token budget; its figures.

    Writes ``out/<order>-seed<seed>/train_log.jsonl`` (the step log).
    """
    from lengthwise.dflash.recipe import new_draft
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.dflash.train_config import DFlashTrainConfig
    from lengthwise.train.device import configure_torch, pick_device
    from lengthwise.train.loop import TrainLoop
    from lengthwise.train.simulated import simulated_sampler

    device = pick_device("cpu")
    configure_torch(device, threads=cfg.threads, deterministic=True)
    target, mask_id = _target(ev, cfg)
    # the loop's own schedule is flat (no warm-up): the learning rate is set from the tokens
    loop_cfg = DFlashTrainConfig(steps=10**9, grad_accum=cfg.grad_accum,
                                 max_tokens=cfg.max_tokens, max_len=cfg.max_len, lr=cfg.lr,
                                 warmup=0, schedule="constant", seed=seed, buckets=cfg.buckets,
                                 threads=cfg.threads, progress=False, spike_guard=False,
                                 block_size=cfg.block_size, draft_layers=cfg.draft_layers,
                                 num_features=cfg.num_features, num_anchors=cfg.num_anchors)
    draft = new_draft(target, loop_cfg, mask_token_id=mask_id)
    task = DFlashTask(draft, target, loop_cfg, order=order)
    lengths = ev.data.lengths
    sampler = simulated_sampler(order, lengths, loop_cfg, world=cfg.world)
    run_dir = Path(out) / f"{order}-seed{seed}"
    loop = TrainLoop(task, order, lengths, ev.data.sample, loop_cfg, run_dir=run_dir,
                     device=device, sampler=sampler)
    budget = int(ev.info["token_budget"])
    tokens = padded = 0
    seconds = 0.0
    accuracy: list[float | None] = []
    started, cpu = time.perf_counter(), time.process_time()
    try:
        while tokens < budget:
            _set_lr(loop, lr_at(tokens, cfg, budget))
            rec = loop.step()
            tokens += int(rec["real_tokens"])
            padded += int(rec["padded_tokens"])
            seconds += float(rec["seconds"])
            accuracy.append(rec.get("accuracy"))
        eval_started = time.perf_counter()
        figures = _evaluate(draft, target, ev, cfg)
        loop.logger.event("eval", step=loop.step_count,
                          **{k: v for k, v in figures.items() if k != "strata_detail"})
    finally:
        loop.close()
    return {
        "order": order, "seed": seed, "steps": loop.step_count, "real_tokens": tokens,
        "padded_tokens": padded, "padding_efficiency": tokens / padded if padded else None,
        "train_seconds": seconds, "eval_seconds": time.perf_counter() - eval_started,
        "wall_seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "train_accuracy": accuracy, **figures, "log": str(run_dir / "train_log.jsonl"),
    }
