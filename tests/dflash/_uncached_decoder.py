"""A reference speculative decoder for the tests: one prompt, no KV cache, greedy.

Every forward reruns the whole sequence, so it shares no cache, mask or compaction code
with :func:`lengthwise.dflash.speculative.speculative_batch`; the batched decoder must keep
the same tokens at every verification.
"""

from __future__ import annotations

import torch

from lengthwise.dflash.blocks import block_attention_mask
from lengthwise.dflash.loss import block_inputs
from lengthwise.dflash.speculative import Generation
from lengthwise.dflash.target import stop_set


@torch.no_grad()
def _propose(draft, target, seq, feats):
    b, a = draft.config.block_size, len(seq) - 1
    device = target.device
    ids = torch.tensor([seq], device=device)
    anchors = torch.tensor([[a]], device=device)
    positions = torch.cat([torch.arange(a, device=device),
                           a + torch.arange(b, device=device)]).unsqueeze(0)
    mask = block_attention_mask(anchors, torch.zeros_like(anchors), a, b)
    hidden = draft(feats[:, :a], block_inputs(draft, target, ids, anchors, b), positions, mask)
    logits = target.lm_head(hidden.to(target.lm_head.weight.dtype))
    return logits[0, 1:].argmax(dim=-1).tolist()


@torch.no_grad()
def uncached_decode(draft, target, prompt, *, max_new_tokens, eos=None, propose=_propose):
    """The greedy speculative decoding of ``prompt``; ``propose(draft, target, seq, feats)``
    gives each block's proposal."""
    stops = stop_set(eos)
    device = target.device
    logits, feats = target.forward(torch.tensor([list(prompt)], device=device))
    seq = [*prompt, int(logits[0, -1].argmax())]
    out = Generation(tokens=[seq[-1]], target_forwards=1)
    while len(out.tokens) < max_new_tokens and seq[-1] not in stops:
        a = len(seq) - 1
        proposal = propose(draft, target, seq, feats)
        logits, feats = target.forward(torch.tensor([seq + proposal], device=device))
        out.target_forwards += 1
        greedy = logits[0, a:].argmax(dim=-1).tolist()  # the target's token after a, a+1, ...
        n = 0
        while n < len(proposal) and proposal[n] == greedy[n]:
            n += 1
        out.drafted.append(n)
        new = proposal[:n] + [greedy[n]]
        ends = [i for i, t in enumerate(new) if t in stops]
        new = new[:ends[0] + 1] if ends else new
        new = new[:max_new_tokens - len(out.tokens)]
        out.accepted.append(len(new))
        out.tokens.extend(new)
        seq.extend(new)
    return out
