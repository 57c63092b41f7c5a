"""A draft's figures per prompt set: acceptance, its prediction, a baseline, the lossless check.

For every prompt set and temperature, :func:`evaluate_set` decodes the prompts
with :func:`~lengthwise.dflash.speculative.speculative_batch` (batched, the
target's KV cache) and reports:

- ``acceptance_length``: tokens kept per verifying target forward (the prefill's
  first token is not counted), the mean over prompts with its 95 % Student-t interval
  over prompts, and ``acceptance_length_pooled`` over every verification of the set;
  ``conditional_acceptance``: per block position, how often it was kept when the
  position before it was (:func:`decoding_figures`);
- ``mismatches`` (temperature 0, with ``check``): the number of prompts whose output
  differs from the target's own greedy ``generate`` (0: the decoding is lossless);
- ``alpha`` and ``expected_acceptance`` (with ``accuracy``, every temperature): per block
  slot the mean ``1 - TV(p_draft, p_target)`` at that temperature on the outputs just
  decoded, and ``1 + sum_k prod_{j<=k} alpha_j``;
- ``draft_accuracy`` and ``slot_accuracy`` (temperature 0, with ``accuracy``): the
  draft's teacher-forced top-1 accuracy on the target's own greedy outputs, overall
  and per block slot (:func:`~lengthwise.dflash.teacher_forced.evaluate_blocks`, every
  position an anchor, in draft forwards of at most
  :data:`~lengthwise.dflash.teacher_forced.SLOTS_PER_FORWARD` slots),
  with the acceptance length those accuracies imply. With training's budgets
  (``max_tokens``, ``max_slots``) the pass is batched and split as training's held-out
  evaluation is (:func:`~lengthwise.dflash.teacher_forced.teacher_forced`);
- with ``lookup_tokens``: prompt-lookup decoding of the same prompts as a training-free
  baseline (:func:`baseline_figures`, :mod:`~lengthwise.dflash.lookup`).

The figures over prompts are NumPy: :func:`acceptance_interval` (the mean over prompts of
each prompt's acceptance length, with a 95 % Student-t interval over prompts: prompts are
the unit that varies between sets; the steps of one prompt are not independent of each
other), :func:`conditional_acceptance` and :func:`expected_acceptance`.

Example::

    >>> import torch, transformers
    >>> from lengthwise.dflash import DFlashConfig, DFlashDraft, Target
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> _ = torch.manual_seed(18)  # a target whose greedy output holds its eos id, 2
    >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
    >>> draft = DFlashDraft(DFlashConfig.from_target(cfg, block_size=4, target_layers=[0, 1],
    ...                                                   mask_token_id=29))
    >>> rows = evaluate_set(draft, target, [[1, 2, 3], [4, 5]], name="tiny",
    ...                     temperatures=[0.0], max_new_tokens=8)
    >>> rows[0]["set"], rows[0]["mismatches"], 1.0 <= rows[0]["acceptance_length"] <= 4.0
    ('tiny', 0, True)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import numpy as np

from lengthwise.dflash.lookup import LOOKUP_NGRAM, prompt_lookup, target_generate
from lengthwise.dflash.loss import HEAD_CHUNK
from lengthwise.dflash.objective import simulated_acceptance_length
from lengthwise.dflash.speculative import speculative_batch
from lengthwise.dflash.teacher_forced import check_budgets, teacher_forced
from lengthwise.errors import ConfigError
from lengthwise.intervals import t_interval
from lengthwise.progress import progress as bar

__all__ = ["INTERVAL", "acceptance_interval", "baseline_figures",
           "conditional_acceptance", "decoding_figures", "evaluate_set", "expected_acceptance",
           "greedy_reference"]

#: how :func:`acceptance_interval` is computed (named in every report)
INTERVAL = "95% Student-t over prompts"



def greedy_reference(target: Any, prompt: list[int], max_new_tokens: int,
                     eos: int | Collection[int] | None = None) -> list[int]:
    """The target's own greedy continuation by Hugging Face ``generate`` (KV cache)."""

    return target_generate(target, prompt, max_new_tokens, eos)


def decoding_figures(gens: Sequence[Any], *, name: str, temperature: float, block_size: int,
                     ) -> dict[str, Any]:
    """The figures of one set's real decoding (:class:`~lengthwise.dflash.speculative.Generation`).

    ``acceptance_length`` is the mean over prompts of each prompt's tokens per verifying
    forward, with its 95 % t-interval over prompts (``acceptance_interval``) and the
    prompts that had a verification (``acceptance_prompts``); ``acceptance_length_pooled``
    pools every verification of the set; ``conditional_acceptance[k - 1]`` is the share of
    verifications that kept proposal ``k`` among those that kept ``k - 1``.
    """

    kept = [k for g in gens for k in g.accepted]
    iv = acceptance_interval([g.acceptance_length for g in gens])
    return {
        "set": name, "temperature": float(temperature), "prompts": len(gens),
        "new_tokens": sum(len(g.tokens) for g in gens), "verify_forwards": len(kept),
        "acceptance_length": iv["mean"], "acceptance_interval": [iv["lo"], iv["hi"]],
        "interval": INTERVAL, "acceptance_prompts": iv["n"],
        "acceptance_length_pooled": float(np.mean(kept)) if kept else float("nan"),
        "conditional_acceptance": conditional_acceptance(
            [k for g in gens for k in g.drafted], block_size=block_size),
    }


def baseline_figures(gens: Sequence[Any], runs: Sequence[Any], lookup_tokens: int,
                     refs: Sequence[list[int]] | None = None) -> dict[str, Any]:
    """Prompt lookup's figures beside the draft's, on the same prompts.

    ``baseline_acceptance_length``: its mean tokens per target forward over prompts, with
    the 95 % t-interval; ``vs_baseline``: the draft's acceptance length minus the
    baseline's, paired by prompt, with its t-interval (a draft worth serving has it above
    0); ``baseline_mismatches`` (with the greedy references ``refs``): prompts whose
    lookup output differs from the target's greedy output.
    """

    base = acceptance_interval([r.acceptance_length for r in runs])
    out: dict[str, Any] = {
        "baseline": f"prompt lookup, {lookup_tokens} tokens from {LOOKUP_NGRAM}-grams "
                    "(transformers generate)",
        "baseline_acceptance_length": base["mean"],
        "baseline_acceptance_interval": [base["lo"], base["hi"]],
        "vs_baseline": _paired(gens, runs),
    }
    if refs is not None:
        out["baseline_mismatches"] = sum(r.tokens != ref
                                         for r, ref in zip(runs, refs, strict=True))
    return out


def combined_figures(gens: Sequence[Any], refs: Sequence[list[int]] | None = None,
                     runs: Sequence[Any] | None = None) -> dict[str, Any]:
    """The combined proposer's figures (prompt lookup where it finds a match, the draft
    elsewhere: ``speculative_batch(..., lookup_ngram=...)``) on the same prompts.

    ``combined_acceptance_length`` with its 95 % t-interval over prompts; with the greedy
    references ``refs``, ``combined_mismatches`` (lossless: 0); with prompt lookup's runs of
    the same prompts ``runs``, ``combined_vs_baseline``: the combined acceptance length minus
    lookup's, paired by prompt, with its t-interval.
    """

    iv = acceptance_interval([g.acceptance_length for g in gens])
    out: dict[str, Any] = {"combined_acceptance_length": iv["mean"],
                           "combined_acceptance_interval": [iv["lo"], iv["hi"]]}
    if refs is not None:
        out["combined_mismatches"] = sum(g.tokens != ref for g, ref in zip(gens, refs,
                                                                         strict=True))
    if runs is not None:
        out["combined_vs_baseline"] = _paired(gens, runs)
    return out


def _paired(gens: Sequence[Any], runs: Sequence[Any]) -> dict[str, Any]:
    """``gens``' acceptance length minus ``runs``', paired by prompt: mean and t-interval."""

    diff = acceptance_interval([g.acceptance_length - r.acceptance_length
                                for g, r in zip(gens, runs, strict=True)])
    return {"mean": diff["mean"], "lo": diff["lo"], "hi": diff["hi"]}


def evaluate_set(draft: Any, target: Any, prompts: list[list[int]], *, name: str,
                 temperatures: Sequence[float] = (0.0, 1.0), max_new_tokens: int = 256,
                 batch_size: int = 16, eos: int | Collection[int] | None = None,
                 seed: int = 0, check: bool = True, accuracy: bool = True,
                 max_tokens: int | None = None, max_slots: int | None = None,
                 head_chunk: int = HEAD_CHUNK, progress: bool = False,
                 lookup_tokens: int | None = None) -> list[dict[str, Any]]:
    """One row of figures per temperature for the prompt set ``name`` (see the module doc).

    ``check``: the lossless check; ``accuracy``: the teacher-forced pass (each costs about
    as much as the decoding, or more), within training's budgets ``max_tokens``,
    ``max_slots`` and ``head_chunk`` (:func:`teacher_forced`); ``progress``: bars on stderr;
    ``lookup_tokens``: also prompt-lookup decoding of the same prompts at the same
    temperature, with that many candidate tokens a forward (:func:`baseline_figures`), and
    the combined proposer's (:func:`combined_figures`).
    """

    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if not prompts:
        raise ConfigError(f"prompt set {name}: no prompts")
    if accuracy:
        check_budgets(max_tokens, max_slots, draft.config.block_size)
    def decode(temp: float, lookup_ngram: int | None = None) -> Iterator[Any]:
        """The prompts decoded speculatively in batches (``lookup_ngram``: combined)."""
        for lo in range(0, len(prompts), batch_size):
            yield from speculative_batch(draft, target, prompts[lo:lo + batch_size],
                                         max_new_tokens=max_new_tokens, temperature=temp,
                                         eos=eos, seed=seed + lo, lookup_ngram=lookup_ngram)

    was = draft.training
    draft.eval()
    rows = []
    try:
        for temp in temperatures:
            decoded = decode(temp)
            gens = list(bar(decoded, unit="prompt", total=len(prompts), enable=progress,
                            desc=f"{name} T={temp:g}: decoding"))
            row = decoding_figures(gens, name=name, temperature=temp,
                                   block_size=draft.config.block_size)
            outs = [g.tokens for g in gens]
            refs = None
            if temp == 0 and check:
                refs = [greedy_reference(target, p, max_new_tokens, eos)
                        for p in bar(prompts, desc=f"{name}: lossless check", unit="prompt",
                                     enable=progress)]
                row["mismatches"] = sum(o != r for o, r in zip(outs, refs, strict=True))
            if lookup_tokens:
                runs = [prompt_lookup(target, p, max_new_tokens=max_new_tokens,
                                      num_tokens=lookup_tokens, eos=eos, temperature=temp,
                                      seed=seed + i)
                        for i, p in enumerate(bar(prompts, unit="prompt", enable=progress,
                                                  desc=f"{name} T={temp:g}: prompt lookup"))]
                row.update(baseline_figures(gens, runs, lookup_tokens, refs))
                row.update(combined_figures(list(decode(temp, LOOKUP_NGRAM)), refs, runs))
            if accuracy:
                ev = teacher_forced(draft, target, prompts, outs, max_tokens=max_tokens,
                                    max_slots=max_slots, head_chunk=head_chunk,
                                    progress=progress, temperature=temp)
                if temp == 0:
                    row.update(draft_accuracy=ev.accuracy, slot_accuracy=ev.slot_accuracy,
                               simulated_acceptance_length=ev.simulated_acceptance_length)
                row.update(alpha=ev.alpha, expected_acceptance=ev.expected_acceptance)
            rows.append(row)
    finally:
        draft.train(was)
    return rows


def acceptance_interval(per_prompt: Sequence[float]) -> dict[str, Any]:
    """Mean of the prompts' acceptance lengths, its 95 % t-interval (``lo``, ``hi``) and ``n``.

    Prompts without a verifying forward (``nan``: the first token ended them) are left
    out of the mean and of ``n``; one prompt gives no interval (``lo``/``hi`` ``None``),
    no prompt no mean (``nan``).

    Per block position ``k``, :func:`conditional_acceptance` gives the share of verifications
    that kept proposal ``k`` among those that kept proposal ``k - 1`` (position 0, the
    anchor, is always kept); :func:`expected_acceptance` ``1 + sum_k prod_{j<=k} alpha_j``
    from per-position acceptance rates ``alpha_j`` (``1 - TV(p_draft, p_target)`` from a
    teacher-forced pass, or the conditional acceptance).

    Example::

        >>> conditional_acceptance([0, 1, 3, 3], block_size=4)
        [0.75, 0.6666666666666666, 1.0]
        >>> conditional_acceptance([0, 1], block_size=4)
        [0.5, 0.0, None]
        >>> expected_acceptance([0.5, 0.5, 0.0])
        1.75
        >>> iv = acceptance_interval([2.0, 3.0, 4.0])
        >>> iv["mean"], round(iv["lo"], 3), round(iv["hi"], 3), iv["n"]
        (3.0, 0.516, 5.484, 3)
    """
    iv = t_interval([float(x) for x in per_prompt])
    if iv["n"] == 0:
        return {"mean": math.nan, "lo": None, "hi": None, "n": 0}
    if iv["n"] == 1:
        return {"mean": iv["mean"], "lo": None, "hi": None, "n": 1}
    return {"mean": iv["mean"], "lo": iv["lo"], "hi": iv["hi"], "n": iv["n"]}


def conditional_acceptance(drafted: Sequence[int], *, block_size: int) -> list[float | None]:
    """Per block position ``k = 1 .. block_size - 1``: P(proposal ``k`` kept | ``k - 1`` kept).

    ``drafted``: proposed tokens each verification kept (before a stop token or the
    token limit cut the output), pooled over the prompts of a set. ``None`` where no
    verification reached position ``k - 1``.
    """
    d = np.asarray(drafted, dtype=np.int64)
    if d.size and (d.min() < 0 or d.max() > block_size - 1):
        raise ValueError(f"kept proposals must lie in [0, {block_size - 1}], got "
                        f"[{d.min()}, {d.max()}]")
    reached = [int((d >= k).sum()) for k in range(block_size)]
    return [reached[k] / reached[k - 1] if reached[k - 1] else None
            for k in range(1, block_size)]


def expected_acceptance(alpha: Sequence[float | None]) -> float:
    """``1 + sum_k prod_{j<=k} alpha_j``: tokens per target forward if position ``j`` is kept
    with probability ``alpha_j`` once the positions before it were (``None``, ``nan``: 0)."""
    return simulated_acceptance_length(
        np.array([math.nan if a is None else a for a in alpha], dtype=np.float64))
