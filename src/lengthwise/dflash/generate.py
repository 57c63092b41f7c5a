"""The target's own responses to prompts: batched Hugging Face ``generate``, greedy or sampled.

DFlash drafts learn the *target's* distribution, so their training responses are
best written by the target itself. :func:`generate_responses` left-pads prompts
of similar length into batches and returns each continuation up to and including
its first stop token (or ``max_new_tokens`` tokens).

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

__all__ = ["generate_responses"]


def generate_responses(model: Any, prompts: list[np.ndarray], *, max_new_tokens: int,
               eos: int | list[int],
               temperature: float, seed: int, batch_size: int = 64,
               device: Any = "cpu", show: bool = False) -> list[np.ndarray]:
    """The target's own continuation of every prompt (ends at a stop token ``eos`` or the cap).

    ``temperature`` 0 is greedy decoding (the continuation speculative decoding must
    reproduce); above 0 the target samples. ``show``: a progress bar over the prompts.
    """
    import torch

    from lengthwise.progress import progress

    stops = [eos] if isinstance(eos, int) else list(eos)
    pad = stops[0]
    order = np.argsort([p.size for p in prompts], kind="stable")
    sampling: dict[str, Any] = ({"do_sample": False} if temperature == 0 else
                                {"do_sample": True, "temperature": temperature, "top_k": 0,
                                 "top_p": 1.0})
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    gen = torch.Generator().manual_seed(seed)
    was = model.training
    model.eval()
    try:
        starts = range(0, len(order), batch_size)
        for lo in progress(starts, desc=f"the target writes {len(prompts)} responses",
                           unit="batch", total=len(starts), enable=show):
            idx = order[lo:lo + batch_size]
            width = max(prompts[i].size for i in idx)
            ids = torch.full((idx.size, width), pad, dtype=torch.long)
            mask = torch.zeros((idx.size, width), dtype=torch.long)
            for r, i in enumerate(idx):  # left padding
                ids[r, width - prompts[i].size:] = torch.from_numpy(prompts[i])
                mask[r, width - prompts[i].size:] = 1
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            with torch.no_grad():
                seq = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     max_new_tokens=max_new_tokens, pad_token_id=pad,
                                     eos_token_id=stops, use_cache=True, **sampling)
            for r, i in enumerate(idx):
                resp = seq[r, width:].cpu().numpy()
                stop = np.flatnonzero(np.isin(resp, stops))
                out[i] = resp[: int(stop[0]) + 1] if stop.size else resp
    finally:
        model.train(was)
    return out
