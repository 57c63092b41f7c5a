"""Assistant turns rewritten by the target itself, turn by turn, in batches.

DFlash drafts learn what the *target* would say, so ``lengthwise dflash prepare
--regenerate`` replaces every assistant turn of a conversation by the target's
own response to the conversation before it (with the regenerated earlier
turns), rendered with the chat template's generation prompt. A conversation
that ends with a user turn gets a new assistant turn. Generation is Hugging
Face ``generate`` (:func:`~lengthwise.dflash.generate.generate_responses`),
or vLLM when it is installed (one process on CUDA; ``backend``), greedy at
temperature 0, sampled above.

Example::

    $ lengthwise dflash prepare chats.jsonl --target ./model --out prepared/ --regenerate
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BACKENDS", "TurnGenerator", "pick_backend", "stop_ids"]


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


def pick_backend(name: str, device: str, world: int) -> str:
    """``hf`` or ``vllm``: ``auto`` is vLLM when it is installed, on CUDA, in one process.

    Example::

        >>> pick_backend("auto", "cpu", 1)
        'hf'
    """
    import importlib.util

    from lengthwise.errors import ConfigError, MissingDependencyError

    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if name == "vllm":
        if not has_vllm:
            raise MissingDependencyError("--backend vllm: the vllm package is not installed "
                                         "(pip install vllm)")
        if not device.startswith("cuda") or world > 1:
            raise ConfigError("--backend vllm needs --device cuda and one process (vLLM "
                              "batches the prompts itself)")
        return "vllm"
    if name == "auto" and has_vllm and device.startswith("cuda") and world == 1:
        return "vllm"
    return "hf"


#: generation backends ``--backend`` names
BACKENDS = ("auto", "hf", "vllm")


class TurnGenerator:
    """The target (loaded once) answering conversation prefixes, as text for the template."""

    def __init__(self, target: str | Path, renderer: Any, cfg: Any, *, info: Any = None,
                 ) -> None:
        import transformers

        from lengthwise.dflash.recipe import check_causal_lm
        from lengthwise.train.device import rank_world

        check_causal_lm(target)
        self.renderer, self.cfg = renderer, cfg
        self.backend = pick_backend(cfg.backend, cfg.device, rank_world(info)[1])
        config = transformers.AutoConfig.from_pretrained(str(target), local_files_only=True)
        try:
            gen_config = transformers.GenerationConfig.from_pretrained(str(target),
                                                                       local_files_only=True)
        except OSError:  # no generation_config.json
            gen_config = None
        self.stops = stop_ids(renderer.tokenizer, config, gen_config)
        if not self.stops:
            from lengthwise.errors import ConfigError

            raise ConfigError(f"--target {target}: neither the tokenizer nor the model names "
                              "an end-of-turn (eos) token, so responses cannot end")
        if self.backend == "vllm":
            from vllm import LLM

            self.engine = LLM(model=str(target), seed=cfg.seed)
        else:
            from lengthwise.dflash.target import load_target
            from lengthwise.train.device import pick_device

            self.device = pick_device(cfg.device, info)
            self.model = load_target(target, dtype=cfg.dtype, device=self.device).eval()

    def _generate(self, prompts: list[np.ndarray], seed: int) -> list[list[int]]:
        """Each prompt's continuation, up to and including its first stop token."""
        if self.backend == "vllm":
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(temperature=self.cfg.temperature,
                                    max_tokens=self.cfg.max_new_tokens,
                                    stop_token_ids=self.stops, seed=seed)
            outs = self.engine.generate([TokensPrompt(prompt_token_ids=p.tolist())
                                         for p in prompts], params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]
        from lengthwise.dflash.generate import generate_responses

        outs = generate_responses(self.model, prompts, max_new_tokens=self.cfg.max_new_tokens,
                                  eos=self.stops, temperature=self.cfg.temperature, seed=seed,
                                  batch_size=self.cfg.batch_size, device=self.device)
        return [o.tolist() for o in outs]

    def rewrite(self, convs: list[list[dict[str, str]]], *, seed: int) -> tuple[int, int]:
        """Replace every assistant turn of ``convs`` in place; (turns written, turns cut short)."""
        for conv in convs:
            if conv[-1]["role"] != "assistant":
                conv.append({"role": "assistant", "content": ""})
        turns = [[j for j, m in enumerate(c) if m["role"] == "assistant"] for c in convs]
        done = unfinished = 0
        for r in range(max((len(t) for t in turns), default=0)):
            todo = [(i, t[r]) for i, t in enumerate(turns) if len(t) > r]
            prompts = [np.asarray(self.renderer.prompt_ids(convs[i][:j]), dtype=np.int64)
                       for i, j in todo]
            for (i, j), toks in zip(todo, self._generate(prompts, seed * 1009 + r), strict=True):
                if toks and toks[-1] in self.stops:
                    toks = toks[:-1]
                else:
                    unfinished += 1
                convs[i][j] = {"role": "assistant", "content": self.renderer.tokenizer.decode(
                    toks, skip_special_tokens=True)}
                done += 1
        return done, unfinished
