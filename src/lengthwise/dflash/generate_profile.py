"""Regeneration's planned batches and a profile timed on them (the torch side of generate_time).

:func:`regenerate_prompts` renders every prompt ``dflash prepare --regenerate`` will give
the target, with the target's tokenizer and chat template: each assistant turn's
conversation before it with the generation prompt (and one more turn where a
conversation ends with another role's). Later rounds' prompts will hold the target's
own earlier answers, not the data's: :meth:`RegeneratePrompts.with_answers` counts each at
the mean length of the target's timed responses in place of the data's answer.
:func:`measure_generate_profile` loads the target as regeneration does
(:class:`~lengthwise.dflash.regenerate.TurnGenerator`), runs a few of the run's own
batches (spread over their widths, from the narrowest to the widest; a later round's
with the data's earlier answers cut to ``--max-new-tokens``, as long as the target's can
be) after a short warm-up, and fits a
:class:`~lengthwise.dflash.generate_time.GenerateProfile` on their seconds and the
responses the target wrote. :func:`estimate_regenerate_time` puts them
together.

Example::

    >>> from lengthwise.dflash.prepare import PrepareConfig
    >>> t, prof = estimate_regenerate_time("chats.jsonl", "./model",
    ...                                    PrepareConfig(regenerate=True))  # doctest: +SKIP
    >>> t.render()  # doctest: +SKIP
    'about ... for ... responses in ... batches (... a batch; ... to start) on ...'
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.dflash.generate_time import (
    GenerateBatches,
    GenerateProfile,
    GenerateTime,
    batch_offsets,
    fit_generate_profile,
    plan_batches,
    predict_generate,
)
from lengthwise.errors import ConfigError, DataError

__all__ = ["PROFILE_BATCHES", "RegeneratePrompts", "cut_answers", "estimate_regenerate_time",
           "measure_generate_profile", "regenerate_prompts", "timed_batches"]

#: batches timed for a profile (after a short warm-up): one more than the profile's terms
PROFILE_BATCHES = 5


@dataclass(frozen=True)
class RegeneratePrompts:
    """The prompts of regeneration, round by round: ``lengths[r]`` in tokens, of conversations
    ``conversation[r]`` in shards ``shard[r]``, with ``answered[r]`` tokens of the data's own
    earlier answers (the ``r`` assistant turns before); ``seconds``: the time rendering them
    took."""

    lengths: list[np.ndarray]
    conversation: list[np.ndarray]
    shard: list[np.ndarray]
    answered: list[np.ndarray]
    seconds: float

    def with_answers(self, answer: float) -> RegeneratePrompts:
        """These prompts with each earlier answer ``answer`` tokens long (the target's mean)
        in place of the data's.

        Example::

            >>> p = RegeneratePrompts([np.array([9]), np.array([40])], [np.array([0])] * 2,
            ...                       [np.array([0])] * 2, [np.array([0]), np.array([25])], 0.0)
            >>> p.with_answers(6.0).lengths[1].tolist()
            [21]
        """
        lengths = [np.maximum(1, np.rint(x - a + r * answer)).astype(np.int64)
                   for r, (x, a) in enumerate(zip(self.lengths, self.answered, strict=True))]
        return dataclasses.replace(self, lengths=lengths)

    def batches(self, cfg: Any) -> GenerateBatches:
        """:func:`~lengthwise.dflash.generate_time.plan_batches` of these prompts under
        ``cfg``'s (a :class:`~lengthwise.dflash.prepare.PrepareConfig`) batch limits."""
        return plan_batches(self.lengths, batch_size=cfg.batch_size, max_tokens=cfg.max_tokens,
                            max_new_tokens=cfg.max_new_tokens, shards=self.shard)

    def members(self, shard: int, rnd: int, index: int, cfg: Any) -> np.ndarray:
        """Conversations of batch ``index`` of ``shard``'s round ``rnd`` (sorted as run)."""
        mine = np.flatnonzero(self.shard[rnd] == shard)
        order = mine[np.argsort(self.lengths[rnd][mine], kind="stable")]
        cuts = batch_offsets(self.lengths[rnd][order], batch_size=cfg.batch_size,
                             max_tokens=cfg.max_tokens, max_new_tokens=cfg.max_new_tokens)
        return self.conversation[rnd][order[cuts[index]:cuts[index + 1]]]


def _conversations(source: str | Path, cfg: Any) -> list[list[dict[str, str]]]:
    """The conversations of ``source``, each ending with an assistant turn to write."""
    from lengthwise.dflash.chat import normalise
    from lengthwise.dflash.chat_files import ChatSource

    path = Path(source)
    if not path.exists():
        raise DataError(f"{source}: no such file or folder")
    chats = ChatSource(path, field=cfg.field, split=cfg.split)
    if len(chats) == 0:
        raise DataError(f"{source}: no conversations")
    convs = []
    for _, where, raw in chats.rows():
        conv = normalise(raw, where=where, allow_empty_assistant=True)
        if conv[-1]["role"] != "assistant":
            conv.append({"role": "assistant", "content": ""})
        convs.append(conv)
    return convs


def regenerate_prompts(source: str | Path, renderer: Any, cfg: Any, *,
                       show: bool = True) -> RegeneratePrompts:
    """The length of every prompt regeneration of ``source`` gives the target (``cfg``: a
    :class:`~lengthwise.dflash.prepare.PrepareConfig`), rendered with ``renderer``.

    ``show``: a progress bar over the conversations.
    """
    from lengthwise.dflash.prepare import _render_or_name
    from lengthwise.progress import progress

    started = time.perf_counter()
    convs = _conversations(source, cfg)
    lengths: list[list[int]] = []
    conv_of: list[list[int]] = []
    answered: list[list[int]] = []
    for i, conv in enumerate(progress(convs, desc="dflash estimate: rendering prompts",
                                      unit="chat", total=len(convs), enable=show)):
        turns = [j for j, m in enumerate(conv) if m["role"] == "assistant"]
        before = 0  # tokens of the data's answers so far
        for r, j in enumerate(turns):
            if r == len(lengths):
                lengths.append([])
                conv_of.append([])
                answered.append([])
            ids = _render_or_name(lambda j=j, conv=conv: renderer.prompt_ids(conv[:j]),
                                  f"{source} row {i}")
            lengths[r].append(len(ids))
            conv_of[r].append(i)
            answered[r].append(before)
            before += len(renderer.tokenizer.encode(conv[j]["content"],
                                                    add_special_tokens=False))
    conv_arr = [np.asarray(c, dtype=np.int64) for c in conv_of]
    return RegeneratePrompts(lengths=[np.asarray(x, dtype=np.int64) for x in lengths],
                             conversation=conv_arr,
                             shard=[c // cfg.shard_rows for c in conv_arr],
                             answered=[np.asarray(a, dtype=np.int64) for a in answered],
                             seconds=time.perf_counter() - started)


def cut_answers(convs: list[list[dict[str, str]]], tokenizer: Any,
                cap: int) -> list[list[dict[str, str]]]:
    """Copies of ``convs`` whose earlier answers (assistant turns a later one follows) hold
    at most their first ``cap`` tokens: the longest an answer of the target's can be under
    ``--max-new-tokens cap``, so that a later round's prompt is no longer than the run's can be.

    Example (a tokenizer of words)::

        >>> class Words:
        ...     def encode(self, text, add_special_tokens=False): return text.split()
        ...     def decode(self, ids, skip_special_tokens=True): return " ".join(ids)
        >>> conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a b c"},
        ...         {"role": "user", "content": "more"}, {"role": "assistant", "content": "d e f"}]
        >>> [m["content"] for m in cut_answers([conv], Words(), 2)[0]]
        ['hi', 'a b', 'more', 'd e f']
    """
    out = []
    for conv in convs:
        turns = [j for j, m in enumerate(conv) if m["role"] == "assistant"]
        copy = [dict(m) for m in conv]
        for j in turns[:-1]:
            ids = tokenizer.encode(conv[j]["content"], add_special_tokens=False)
            if len(ids) > cap:
                copy[j]["content"] = tokenizer.decode(ids[:cap], skip_special_tokens=True)
        out.append(copy)
    return out


def timed_batches(plan: GenerateBatches, k: int) -> np.ndarray:
    """Positions of the ``k`` batches a profile times: spread evenly over the run's batches
    ordered by width (the narrowest and the widest among them), so that the fit sees what
    grows with the width.

    Example::

        >>> from lengthwise.dflash.generate_time import plan_batches
        >>> plan = plan_batches([np.array([5, 90, 7]), np.array([3, 40])], batch_size=1)
        >>> plan.width.tolist(), timed_batches(plan, 3).tolist()
        ([5, 7, 90, 3, 40], [1, 2, 3])
    """
    if k < 1:
        raise ConfigError(f"--profile-steps must be at least 1 batch, got {k}")
    by_width = np.lexsort((plan.rows, plan.width))
    pick = np.unique(np.linspace(0, plan.batches - 1, min(k, plan.batches)).round()
                     ).astype(np.int64)
    return np.sort(by_width[pick])


def measure_generate_profile(source: str | Path, target: str | Path, cfg: Any, *,
                             prompts: RegeneratePrompts, batches: int = PROFILE_BATCHES,
                             renderer: Any = None) -> GenerateProfile:
    """Time ``batches`` of the run's own batches (after a warm-up of two short prompts) with
    the target loaded as regeneration loads it, and fit a profile.

    A later round's timed prompts hold the data's earlier answers cut to ``--max-new-tokens``
    (:func:`cut_answers`): the target's are not written yet, and no longer than that, so no
    timed batch is wider than the run's can be. On CPU the process first gives large freed
    buffers back as regeneration's does (:func:`~lengthwise.dflash.process.follow_live_tensors`),
    which costs time. Its start is loading the target plus rendering every prompt
    (``prompts.seconds``). Prints one line to stderr.
    """
    from lengthwise.dflash.regenerate import TurnGenerator
    from lengthwise.pytorch.dist import launched_world

    if launched_world() is not None:
        raise ConfigError("--time measures a profile in one process: run the estimate "
                          "without torchrun, with --world N for the ranks of the run")
    if renderer is None:
        renderer = _renderer(target, cfg)
    data = _conversations(source, cfg)
    convs = cut_answers(data, renderer.tokenizer, cfg.max_new_tokens)
    timed = _rerendered(prompts, convs, renderer,
                        [i for i, (a, b) in enumerate(zip(data, convs, strict=True)) if a != b])
    plan = timed.batches(cfg)
    if plan.batches == 0:
        raise DataError(f"{source}: no assistant turn to write")
    picked = timed_batches(plan, batches)
    print(f"lengthwise dflash estimate: timing {picked.size} generate batches of this run on "
          f"{cfg.device} (of {plan.batches:,}; after a warm-up)", file=sys.stderr, flush=True)
    from lengthwise.dflash.process import follow_live_tensors

    follow_live_tensors(cfg.device)  # as dflash prepare --regenerate runs: its malloc's cost
    started = time.perf_counter()
    gen = TurnGenerator(target, renderer, cfg)
    if gen.backend != "hf":
        raise ConfigError("--time prices Hugging Face generate; this machine would regenerate "
                          f"with {gen.backend}: time it with --backend hf or price it there")
    loaded = time.perf_counter() - started
    index = _index_in_group(plan)
    first = _prompts(renderer, convs, timed.members(int(plan.shard[0]), int(plan.round[0]),
                                                      0, cfg)[:2], 0)
    from lengthwise.dflash.generate import generate_responses

    generate_responses(gen.model, first, max_new_tokens=2, eos=gen.stops, temperature=0.0,
                       seed=0, batch_size=2, device=gen.device)  # warm-up
    rows, width, steps, seconds, responses = [], [], [], [], []
    for b in picked:
        k, r = int(plan.shard[b]), int(plan.round[b])
        batch = _prompts(renderer, convs, timed.members(k, r, int(index[b]), cfg), r)
        t0 = time.perf_counter()
        outs = gen._generate(batch, seed=int(b))
        seconds.append(time.perf_counter() - t0)
        lens = [max(1, len(o)) for o in outs]
        rows.append(len(batch))
        width.append(max(p.size for p in batch))
        steps.append(max(lens))
        responses += lens
    import torch

    from lengthwise.dflash.time_profile import device_name

    prof = fit_generate_profile(rows, width, steps, seconds,
                                device=device_name(cfg.device, torch.get_num_threads()),
                                responses=responses, max_new_tokens=cfg.max_new_tokens,
                                start_seconds=loaded + prompts.seconds)
    return dataclasses.replace(prof, fit={**prof.fit, "load_seconds": round(loaded, 3),
                                          "render_seconds": round(prompts.seconds, 3)})


def _rerendered(prompts: RegeneratePrompts, convs: list[list[dict[str, str]]], renderer: Any,
                changed: list[int]) -> RegeneratePrompts:
    """``prompts`` with the later rounds' lengths of conversations ``changed`` rendered again
    from ``convs`` (the others', and every first round's, are as they were)."""
    lengths = [x.copy() for x in prompts.lengths]
    for i in changed:
        turns = [j for j, m in enumerate(convs[i]) if m["role"] == "assistant"]
        for r, j in enumerate(turns[1:], start=1):
            at = int(np.searchsorted(prompts.conversation[r], i))  # conversations ascend
            lengths[r][at] = len(renderer.prompt_ids(convs[i][:j]))
    return dataclasses.replace(prompts, lengths=lengths)


def _index_in_group(plan: GenerateBatches) -> np.ndarray:
    """Each batch's position within its shard's round."""
    out = np.zeros(plan.batches, dtype=np.int64)
    seen: dict[tuple[int, int], int] = {}
    for b in range(plan.batches):
        key = (int(plan.shard[b]), int(plan.round[b]))
        out[b] = seen.get(key, 0)
        seen[key] = out[b] + 1
    return out


def _prompts(renderer: Any, convs: list[list[dict[str, str]]], members: np.ndarray,
             rnd: int) -> list[np.ndarray]:
    """The prompt ids of round ``rnd`` of conversations ``members``."""
    out = []
    for i in members:
        conv = convs[int(i)]
        j = [t for t, m in enumerate(conv) if m["role"] == "assistant"][rnd]
        out.append(np.asarray(renderer.prompt_ids(conv[:j]), dtype=np.int64))
    return out


def _renderer(target: str | Path, cfg: Any) -> Any:
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.target import load_tokenizer

    return ChatRenderer(load_tokenizer(target), enable_thinking=cfg.enable_thinking,
                        name=f"--target {target}")


def estimate_regenerate_time(source: str | Path, target: str | Path, cfg: Any, *,
                             world: int = 1, profile: GenerateProfile | None = None,
                             batches: int = PROFILE_BATCHES, show: bool = True,
                             ) -> tuple[GenerateTime, GenerateProfile, RegeneratePrompts]:
    """The predicted time of ``dflash prepare --regenerate`` of ``source`` at ``world``
    ranks: priced by ``profile``, else by one measured here (:func:`measure_generate_profile`).
    Returns the time, the profile and the prompts priced (later rounds' with the target's
    answers: :meth:`RegeneratePrompts.with_answers`; their longest sizes the memory
    estimate)."""
    renderer = _renderer(target, cfg)
    prompts = regenerate_prompts(source, renderer, cfg, show=show)
    if profile is None:
        profile = measure_generate_profile(source, target, cfg, prompts=prompts,
                                           batches=batches, renderer=renderer)
    answered = prompts.with_answers(profile.mean_answer(cfg.max_new_tokens))
    timing = predict_generate(answered.batches(cfg), profile, world=world,
                              max_new_tokens=cfg.max_new_tokens)
    return timing, profile, answered
