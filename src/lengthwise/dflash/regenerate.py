"""Assistant turns rewritten by the target itself, turn by turn, in batches.

DFlash drafts learn what the *target* would say, so ``lengthwise dflash prepare
--regenerate`` replaces every assistant turn of a conversation by the target's
own response to the conversation before it (with the regenerated earlier
turns), rendered with the chat template's generation prompt. A conversation
that ends with a user turn gets a new assistant turn. Generation is Hugging
Face ``generate`` (:func:`~lengthwise.dflash.generate.generate_responses`),
greedy at temperature 0, sampled above.

Example::

    $ lengthwise dflash prepare chats.jsonl --target ./model --out prepared/ --regenerate
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TurnGenerator", "stop_ids"]


def stop_ids(tokenizer: Any, model_config: Any, generation_config: Any = None) -> list[int]:
    """End-of-turn token ids: the tokenizer's eos, then the model's and generation config's.

    Example::

        >>> from types import SimpleNamespace as NS
        >>> stop_ids(NS(eos_token_id=5), NS(eos_token_id=[2, 5]))
        [5, 2]
    """
    out: list[int] = []
    for src in (tokenizer, model_config, generation_config):
        value = getattr(src, "eos_token_id", None) if src is not None else None
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            if t is not None and int(t) not in out:
                out.append(int(t))
    return out


class TurnGenerator:
    """The target (loaded once) answering conversation prefixes, as text for the template."""

    def __init__(self, target: str | Path, renderer: Any, cfg: Any, *, info: Any = None,
                 ) -> None:
        import torch

        from lengthwise.dflash.recipe import check_causal_lm
        from lengthwise.dflash.target import load_target
        from lengthwise.train.device import pick_device

        check_causal_lm(target)
        self.renderer, self.cfg = renderer, cfg
        device = pick_device(cfg.device, info)
        dtype = torch.bfloat16 if device.type == "cuda" else None
        self.model = load_target(target, dtype=dtype, device=device).eval()
        self.device = device
        tok = renderer.tokenizer
        self.stops = stop_ids(tok, self.model.config, getattr(self.model, "generation_config",
                                                              None))
        if not self.stops:
            from lengthwise.errors import ConfigError

            raise ConfigError(f"--target {target}: neither the tokenizer nor the model names "
                              "an end-of-turn (eos) token, so responses cannot end")

    def rewrite(self, convs: list[list[dict[str, str]]], *, seed: int) -> tuple[int, int]:
        """Replace every assistant turn of ``convs`` in place; (turns written, turns cut short)."""
        from lengthwise.dflash.generate import generate_responses

        for conv in convs:
            if conv[-1]["role"] != "assistant":
                conv.append({"role": "assistant", "content": ""})
        turns = [[j for j, m in enumerate(c) if m["role"] == "assistant"] for c in convs]
        done = unfinished = 0
        for r in range(max((len(t) for t in turns), default=0)):
            todo = [(i, t[r]) for i, t in enumerate(turns) if len(t) > r]
            prompts = [np.asarray(self.renderer.prompt_ids(convs[i][:j]), dtype=np.int64)
                       for i, j in todo]
            outs = generate_responses(self.model, prompts, max_new_tokens=self.cfg.max_new_tokens,
                                      eos=self.stops, temperature=self.cfg.temperature,
                                      seed=seed * 1009 + r, batch_size=self.cfg.batch_size,
                                      device=self.device)
            for (i, j), toks in zip(todo, outs, strict=True):
                toks = toks.tolist()
                if toks and toks[-1] in self.stops:
                    toks = toks[:-1]
                else:
                    unfinished += 1
                convs[i][j] = {"role": "assistant", "content": self.renderer.tokenizer.decode(
                    toks, skip_special_tokens=True)}
                done += 1
        return done, unfinished
