"""The target's own responses to prompts: a batched decode loop with a KV cache, greedy or sampled.

DFlash drafts learn the *target's* distribution, so their training responses are
best written by the target itself. :func:`generate_responses` sorts the prompts
by length and cuts them into batches of at most ``batch_size`` rows whose padded
prompt and new tokens fit ``max_tokens``
(:func:`~lengthwise.dflash.prompt_batches.batch_offsets`). Each batch is
left-padded, prefilled once, then decoded one token a step from the model's KV
cache; a row that writes a stop token (or its ``max_new_tokens``-th token)
leaves the batch and the cache at once, and cache columns that only padding
still holds are cut, so later steps cost only the rows still writing. Greedy
responses are those of Hugging Face ``generate`` (up to ties of the argmax:
other batches round differently).

Example::

    >>> import numpy as np, torch, transformers
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> model = transformers.LlamaForCausalLM(cfg)
    >>> out = generate_responses(model, [np.array([1, 2, 3])], max_new_tokens=4, eos=0,
    ...                          temperature=0.0, seed=0)
    >>> 1 <= out[0].size <= 4
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lengthwise.dflash.prompt_batches import batch_offsets

__all__ = ["decode_batch", "generate_responses"]


def generate_responses(model: Any, prompts: list[np.ndarray], *, max_new_tokens: int,
                       eos: int | list[int], temperature: float, seed: int,
                       batch_size: int = 64, max_tokens: int | None = None,
                       device: Any = "cpu", show: bool = False) -> list[np.ndarray]:
    """The target's own continuation of every prompt (ends at a stop token ``eos`` or the cap).

    ``temperature`` 0 is greedy decoding (the continuation speculative decoding must
    reproduce); above 0 the target samples, seeded by ``seed``. Batches hold at most
    ``batch_size`` prompts and ``max_tokens`` padded prompt plus new tokens (None: no
    token limit). ``show``: a progress bar over the batches.
    """
    import torch

    from lengthwise.progress import progress

    stops = [eos] if isinstance(eos, int) else list(eos)
    sizes = np.array([p.size for p in prompts], dtype=np.int64)
    order = np.argsort(sizes, kind="stable")
    offsets = batch_offsets(sizes[order], batch_size=batch_size, max_tokens=max_tokens,
                            max_new_tokens=max_new_tokens)
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    for lo, hi in progress(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True),
                           desc=f"the target writes {len(prompts)} responses", unit="batch",
                           total=offsets.size - 1, enable=show):
        idx = order[lo:hi]
        for i, resp in zip(idx, decode_batch(model, [prompts[i] for i in idx],
                                             max_new_tokens=max_new_tokens, stops=stops,
                                             temperature=temperature, generator=gen,
                                             device=device), strict=True):
            out[i] = resp
    return out


def decode_batch(model: Any, prompts: list[np.ndarray], *, max_new_tokens: int,
                 stops: list[int], temperature: float, generator: Any,
                 device: Any = "cpu") -> list[np.ndarray]:
    """Each prompt's continuation, decoded together: up to and including its first stop
    token, else ``max_new_tokens`` tokens. Rows that finish leave the batch.

    ``generator``: the ``torch.Generator`` (on ``device``) of sampled tokens.
    """
    import torch

    from lengthwise.dflash.speculative import _cache_kwarg, _cache_of, _last_logits_only, _pick

    rows = len(prompts)
    width = max(p.size for p in prompts)
    ids = torch.full((rows, width), stops[0], dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for r, p in enumerate(prompts):  # left padding
        ids[r, width - p.size:] = torch.from_numpy(p)
        mask[r, width - p.size:] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    stop = torch.tensor(stops, device=device)
    written: list[list[int]] = [[] for _ in prompts]
    live = list(range(rows))  # the prompt of each row of the batch
    kw, cache = _cache_kwarg(model), None
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for step in range(max_new_tokens):
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                            **_last_logits_only(model), **{kw: cache})
                cache = _cache_of(out)
                tok, _ = _pick(out.logits[:, -1].float(), temperature, generator)
                for r, t in zip(live, tok.tolist(), strict=True):
                    written[r].append(t)
                going = ~torch.isin(tok, stop)
                if step + 1 == max_new_tokens or not bool(going.any()):
                    break
                if not bool(going.all()):
                    keep = going.nonzero().squeeze(1)
                    live = [live[i] for i in keep.tolist()]
                    tok, mask, pos = tok[keep], mask[keep], pos[keep]
                    cache.batch_select_indices(keep)
                    pad = int(mask.argmax(dim=1).min())  # columns only padding holds
                    if pad:
                        mask = mask[:, pad:]
                        for layer in cache.layers:
                            layer.keys, layer.values = (layer.keys[:, :, pad:],
                                                        layer.values[:, :, pad:])
                ids, pos = tok[:, None], pos[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
    finally:
        model.train(was)
    return [np.asarray(w, dtype=np.int64) for w in written]
