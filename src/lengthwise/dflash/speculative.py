"""Batched speculative decoding with the target's KV cache, greedy or sampled.

:func:`speculative_batch` decodes many prompts at once. The target prefills the
(left-padded) prompts once into a KV cache; then every cycle the draft proposes
``B - 1`` tokens per row from the row's last token (the anchor) and the target's
features of everything before it, and the target verifies anchor + proposal of
every row in one cached forward. Columns of the cache that hold rejected tokens
are masked out for the rest of the run (positions stay the rows' own), so rows
keep different lengths in one cache; once the dead columns are as many as the
longest row's live ones they are dropped (:func:`_compact`), so the cache holds at
most about twice the longest row however many proposals are rejected. The target
computes logits only where a token is chosen: the prefill scores each prompt's last
position (``logits_to_keep``), a verification its block, and the draft's proposal
slots go through the LM head.

- ``temperature == 0``: the longest prefix of the proposal equal to the target's
  greedy choices is kept, plus one token of the target's: the output is the
  target's greedy output.
- ``temperature > 0``: speculative sampling. Draft token ``d_i ~ q_i`` is kept
  with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection a token
  is drawn from ``max(0, p_i - q_i)`` normalised; when all are kept a token is
  drawn from the target's next distribution. Each output token is distributed as
  the target's own sampling at that temperature.

Tokens kept per verifying forward is the *acceptance length*; :func:`acceptance` pools it
over prompts and checks the greedy output against the target's own.

Example::

    >>> import torch, transformers
    >>> from lengthwise.dflash import DFlashConfig, DFlashDraft, Target
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> _ = torch.manual_seed(0)
    >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
    >>> draft = DFlashDraft(DFlashConfig.from_target(cfg, block_size=4, target_layers=[0, 1],
    ...                                                   mask_token_id=29))
    >>> gens = speculative_batch(draft, target, [[1, 2, 3], [4, 5]], max_new_tokens=10)
    >>> [g.tokens == target.greedy(p, 10) for g, p in zip(gens, [[1, 2, 3], [4, 5]])]
    [True, True]
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lengthwise.dflash.blocks import block_attention_mask
from lengthwise.dflash.lookup import lookup_candidates
from lengthwise.dflash.loss import block_inputs
from lengthwise.dflash.model import check_target
from lengthwise.dflash.target import stop_set
from lengthwise.errors import ConfigError

__all__ = ["Generation", "acceptance", "check_decoding", "speculative_batch"]


@dataclass
class Generation:
    """Tokens generated after the prompt, and what the verification kept per target forward."""

    tokens: list[int]
    target_forwards: int
    accepted: list[int] = field(default_factory=list)  # tokens kept by each verifying forward
    #: proposed tokens each verification kept, before a stop token or the limit cut them
    drafted: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per verifying target forward (``nan`` when there was none)."""
        return float(np.mean(self.accepted)) if self.accepted else float("nan")


def check_decoding(draft: Any, target: Any, prompt: Any, max_new_tokens: Any) -> None:
    """Refuse decoding parameters that cannot work, naming them (a ``ConfigError``).

    Example::

        >>> check_decoding(None, None, [], 8)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: prompt is empty: give at least one token id
    """
    if prompt is None or len(prompt) == 0:
        raise ConfigError("prompt is empty: give at least one token id")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 1):
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if draft is None:
        return
    check_target(draft.config, target)
    vocab = target.vocab_size
    bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, (int, np.integer))
           or not 0 <= t < vocab]
    if bad:
        raise ConfigError(f"prompt token {bad[0]!r} is not a token id of the target's "
                          f"vocabulary [0, {vocab})")


def acceptance(draft: Any, target: Any, prompts: list[list[int]], *, max_new_tokens: int,
               eos: int | Collection[int] | None = None, check: bool = True,
               ) -> dict[str, Any]:
    """Greedy acceptance length over ``prompts`` and whether every output is the target's own.

    ``acceptance_length`` pools the verifying forwards of every prompt (tokens kept /
    forwards); ``lossless`` is ``None`` when ``check`` is off.

    Example::

        >>> import torch, transformers
        >>> from lengthwise.dflash import DFlashConfig, DFlashDraft, Target
        >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
        ...                                num_attention_heads=2, intermediate_size=32)
        >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
        >>> draft = DFlashDraft(DFlashConfig.from_target(cfg, block_size=4,
        ...                                              target_layers=[0, 1], mask_token_id=29))
        >>> res = acceptance(draft, target, [[1, 2, 3], [4, 5]], max_new_tokens=8)
        >>> res["lossless"], res["prompts"], 1.0 <= res["acceptance_length"] <= 4.0
        (True, 2, True)
    """
    was = draft.training
    draft.eval()
    try:
        gens = speculative_batch(draft, target, prompts, max_new_tokens=max_new_tokens, eos=eos)
    finally:
        draft.train(was)
    kept = sum(sum(g.accepted) for g in gens)
    forwards = sum(len(g.accepted) for g in gens)
    same = check and all(g.tokens == target.greedy(p, max_new_tokens, eos)
                         for g, p in zip(gens, prompts, strict=True))
    return {"acceptance_length": kept / forwards if forwards else float("nan"),
            "verify_forwards": forwards, "prompts": len(prompts),
            "lossless": same if check else None}


class _Rows:
    """Per-row state: tokens so far, done flags."""

    def __init__(self, prompts: list[list[int]], n_new: int) -> None:
        self.seqs = [list(p) for p in prompts]
        self.gens = [Generation(tokens=[], target_forwards=1) for _ in prompts]
        self.done = [False] * len(prompts)
        self.n_new = n_new

    def add(self, r: int, new: list[int], stops: frozenset[int], *,
            drafted: int | None = None) -> None:
        """Append ``new`` to row ``r`` (a verification's when ``drafted`` proposals were kept)."""
        new = new[: self.n_new - len(self.gens[r].tokens)]
        ends = [i for i, t in enumerate(new) if t in stops]
        if ends:
            new = new[: ends[0] + 1]
        if drafted is not None:
            self.gens[r].drafted.append(drafted)
            self.gens[r].accepted.append(len(new))
            self.gens[r].target_forwards += 1
        self.gens[r].tokens.extend(new)
        self.seqs[r].extend(new)
        if len(self.gens[r].tokens) >= self.n_new or (new and new[-1] in stops):
            self.done[r] = True


class _DraftContext:
    """Each row's draft keys and values of the positions before its anchor, across cycles.

    A context position's keys and values depend on its target features and position
    only (:meth:`~lengthwise.dflash.model.DFlashDraft.context_keys_values`), so each is
    computed once, when the target has verified it, and the draft's cost per cycle
    does not grow with the context.
    """

    def __init__(self, draft: Any, n: int, device: Any) -> None:
        self.draft = draft
        self.kv: list[list[torch.Tensor]] = []  # per layer: keys, values (n, heads, cap, dim)
        self.lens = torch.zeros(n, dtype=torch.long, device=device)

    def add(self, feats: torch.Tensor, positions: torch.Tensor, starts: list[int],
            counts: list[int]) -> None:
        """Append ``feats[r, starts[r]:starts[r] + counts[r]]`` (at ``positions``) to row ``r``."""
        new = self.draft.context_keys_values(feats, positions)
        need = int((self.lens + torch.tensor(counts, device=self.lens.device)).max())
        if not self.kv:
            self.kv = [[torch.zeros(*t.shape[:2], need, t.shape[3], dtype=t.dtype,
                                    device=t.device) for t in pair] for pair in new]
        cap = self.kv[0][0].shape[2]
        if need > cap:  # room for about as many positions again
            grow = max(need - cap, cap)
            self.kv = [[torch.cat([t, t.new_zeros(*t.shape[:2], grow, t.shape[3])], dim=2)
                        for t in pair] for pair in self.kv]
        for r, (start, count) in enumerate(zip(starts, counts, strict=True)):
            at = int(self.lens[r])
            for pair, fresh in zip(self.kv, new, strict=True):
                for t, f in zip(pair, fresh, strict=True):
                    t[r, :, at:at + count] = f[r, :, start:start + count]
        self.lens += torch.tensor(counts, device=self.lens.device)

    def view(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """Each layer's keys and values up to the longest row, and that length."""
        longest = int(self.lens.max())
        return [(k[:, :, :longest], v[:, :, :longest]) for k, v in self.kv], longest


def _cache_kwarg(model: Any) -> str:
    """The name under which this ``transformers`` version takes the KV cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _last_logits_only(model: Any) -> dict[str, int]:
    """The keyword that makes a forward score its last position only, where the model has one.

    A prefill needs the next token of each row: full-vocabulary logits over every prompt
    position would be the largest tensor of the run.
    """
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def _cache_of(out: Any) -> Any:
    """The KV cache a forward returned (``cache`` on transformers >= 5.2x)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens chosen from ``logits (..., V)``: argmax, or a draw and the distribution."""
    if temperature == 0:
        return logits.argmax(dim=-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1]), probs


@torch.no_grad()
def speculative_batch(draft: Any, target: Any, prompts: list[list[int]], *,
                      max_new_tokens: int, temperature: float = 0.0,
                      eos: int | Collection[int] | None = None,
                      seed: int = 0, lookup_ngram: int | None = None) -> list[Generation]:
    """Decode every prompt with ``draft`` proposing and ``target`` verifying (module doc).

    ``seed`` seeds the draws when ``temperature > 0`` (a generator on the target's device).
    ``lookup_ngram``: the combined proposer: a row whose text repeats its last n-gram (up
    to ``lookup_ngram`` tokens) proposes what followed it, as prompt lookup does
    (:func:`~lengthwise.dflash.lookup.lookup_candidates`), the draft's tokens after them;
    a point mass is their proposal distribution, so verification stays lossless.
    """
    if not prompts:
        raise ConfigError("prompts: give at least one prompt")
    for prompt in prompts:
        check_decoding(draft, target, prompt, max_new_tokens)
    if not temperature >= 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    stops = stop_set(eos)
    model, dev, b = target.model, target.device, draft.config.block_size
    rows = _Rows(prompts, max_new_tokens)
    n = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(n, width, dtype=torch.long)
    valid = torch.zeros(n, width, dtype=torch.long)
    for r, p in enumerate(prompts):  # left padding
        ids[r, width - len(p):] = torch.tensor(p)
        valid[r, width - len(p):] = 1
    ids, valid = ids.to(dev), valid.to(dev)
    pos = (valid.cumsum(dim=1) - 1).clamp(min=0)
    cache_name = _cache_kwarg(model)
    generator = torch.Generator(device=dev).manual_seed(int(seed))
    out = model(input_ids=ids, attention_mask=valid, position_ids=pos, use_cache=True,
                output_hidden_states=True, **_last_logits_only(model))
    cache = _cache_of(out)
    feats = torch.cat([out.hidden_states[i + 1] for i in target.layers], dim=-1)
    first, _ = _pick(out.logits[:, -1], temperature, generator)
    del out  # every layer's hidden states of the prompts
    context = _DraftContext(draft, n, dev)
    context.add(feats, pos, [width - len(p) for p in prompts], [len(p) for p in prompts])
    for r in range(n):
        rows.add(r, [int(first[r])], stops)
    slots = torch.arange(b, device=dev)
    while not all(rows.done):
        active = torch.tensor([not d for d in rows.done], device=dev)
        context_kv, longest = context.view()
        lens = context.lens  # tokens in the target's cache: all but each row's anchor
        anchors = torch.tensor([[s[-1]] for s in rows.seqs], device=dev)
        embeds = block_inputs(draft, target, anchors, torch.zeros_like(anchors), b)
        block_pos = lens.unsqueeze(1) + slots
        mask = block_attention_mask(lens.unsqueeze(1), torch.zeros_like(anchors), longest, b)
        found = _lookup(rows, b - 1, lookup_ngram) if lookup_ngram else {}
        if found and all(rows.done[r] or len(found.get(r, ())) == b - 1 for r in range(n)):
            # prompt lookup fills every active row's block: the draft is not needed
            proposal = torch.zeros(n, b - 1, dtype=torch.long, device=dev)
            q = (None if temperature == 0 else
                 torch.zeros(n, b - 1, target.lm_head.weight.shape[0], device=dev))
        else:
            hidden = draft(None, embeds, block_pos, mask, context_kv=context_kv)
            # every slot through the head, the anchor's too: B rows a prompt (a multiple of
            # 8 for blocks of 8 or 16) run faster on CPU BLAS than the B - 1 proposals alone
            draft_logits = target.lm_head(hidden.to(target.lm_head.weight.dtype))[:, 1:]
            proposal, q = _pick(draft_logits, temperature, generator)
        _overlay(found, proposal, q)
        block = torch.cat([anchors, proposal], dim=1)
        valid = torch.cat([valid, active.long().unsqueeze(1).expand(n, b)], dim=1)
        out = model(input_ids=block, attention_mask=valid, position_ids=block_pos,
                    use_cache=True, output_hidden_states=True, **{cache_name: cache})
        cache = _cache_of(out)
        feats = torch.cat([out.hidden_states[i + 1] for i in target.layers], dim=-1)
        kept = _verify(proposal, out.logits, q, temperature, generator)
        start = valid.shape[1] - b
        counts = [0] * n
        for r in range(n):
            if rows.done[r]:
                continue
            k, bonus = kept[r]
            valid[r, start + k + 1:] = 0  # rejected proposals leave the cache
            counts[r] = k + 1
            rows.add(r, proposal[r, :k].tolist() + [bonus], stops, drafted=k)
        context.add(feats, block_pos, [0] * n, counts)
        valid = _compact(cache, valid)
    return rows.gens


def _lookup(rows: _Rows, num_tokens: int, max_ngram: int) -> dict[int, list[int]]:
    """Prompt lookup's proposal of each active row that finds one (its first tokens)."""

    found = {r: lookup_candidates(seq, num_tokens, max_ngram)
             for r, seq in enumerate(rows.seqs) if not rows.done[r]}
    return {r: f for r, f in found.items() if f}


def _overlay(found: dict[int, list[int]], proposal: torch.Tensor,
             q: torch.Tensor | None) -> None:
    """Replace, in place, the first proposals of each row by prompt lookup's (their
    distribution ``q``, when sampling, a point mass)."""
    for r, tokens in found.items():
        k = len(tokens)
        proposal[r, :k] = torch.tensor(tokens, device=proposal.device)
        if q is not None:
            q[r, :k] = 0
            q[r, torch.arange(k, device=q.device), proposal[r, :k]] = 1


def _compact(cache: Any, valid: torch.Tensor) -> torch.Tensor:
    """Drop the cache's masked-out columns once they are as many as the longest row's kept ones.

    Every verification appends a block to every row and masks out its rejected proposals:
    with a poor draft most columns of the cache are dead. The kept columns of each row
    move to the right, in order (rows stay left-padded; positions are the rows' own, given
    explicitly, so nothing else changes), and the cache holds at most about twice the
    longest row. Returns the mask of the columns kept; a cache whose layers are not plain
    dynamic key/value tensors is left as it is.
    """
    keep = valid.bool()
    width = int(keep.sum(dim=1).max())
    if valid.shape[1] - width < max(width, 1):
        return valid
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - a transformers without cache layers
        return valid
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or layer.keys.ndim != 4
                         for layer in layers):
        return valid
    order = torch.sort(keep.to(torch.int8), dim=1, stable=True).indices[:, -width:]
    for layer in layers:
        n, heads, _, dim = layer.keys.shape
        at = order[:, None, :, None].expand(n, heads, width, dim)
        layer.keys, layer.values = layer.keys.gather(2, at), layer.values.gather(2, at)
    return valid.gather(1, order)


def _verify(proposal: torch.Tensor, logits: torch.Tensor, q: torch.Tensor | None,
            temperature: float, gen: torch.Generator | None) -> list[tuple[int, int]]:
    """Per row: how many proposed tokens are kept, and the target's own next token."""
    if temperature == 0:
        greedy = logits.argmax(dim=-1)
        same = (proposal == greedy[:, :-1]).long().cumprod(dim=1).sum(dim=1)
        return [(int(k), int(greedy[r, k])) for r, k in enumerate(same)]
    assert q is not None
    p = torch.softmax(logits.float() / temperature, dim=-1)  # (n, B, V)
    m = proposal.shape[1]
    p_d = p[:, :m].gather(-1, proposal.unsqueeze(-1)).squeeze(-1)
    q_d = q.gather(-1, proposal.unsqueeze(-1)).squeeze(-1)
    u = torch.rand(p_d.shape, generator=gen, device=p_d.device)
    ok = (u * q_d < p_d).long().cumprod(dim=1).sum(dim=1)
    out = []
    for r, k in enumerate(ok.tolist()):
        if k == m:
            dist = p[r, m]
        else:
            dist = (p[r, k] - q[r, k]).clamp(min=0)
            total = dist.sum()
            dist = dist / total if total > 0 else p[r, k]
        out.append((k, int(torch.multinomial(dist, 1, generator=gen))))
    return out
