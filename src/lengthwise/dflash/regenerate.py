"""Assistant turns rewritten by the target itself, turn by turn.

DFlash drafts learn what the *target* would say, so ``lengthwise dflash prepare
--regenerate`` replaces every assistant turn of a conversation by the target's
own response to the conversation before it (with the regenerated earlier
turns), rendered with the chat template's generation prompt. A conversation
that ends with a user turn gets a new assistant turn. With Hugging Face models
the conversations are decoded together, each in a row that keeps its KV cache
between its turns, at most ``--batch-size`` of them within ``--max-tokens``
(:func:`~lengthwise.dflash.generate.decode_conversations`). vLLM
(installed, one process on CUDA; ``backend``) writes round by round: the
``r``-th assistant turn of every conversation, in batches of prompts sorted by
length. Greedy at temperature 0, sampled above. Each sample keeps the target's
own token ids of the turns it wrote (:func:`splice`), and each shard's finished
turns are logged (:class:`TurnLog`) so that an interrupted run resumes with them.

Example::

    $ lengthwise dflash prepare chats.jsonl --target ./model --out prepared/ --regenerate
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.atomic import atomic_open
from lengthwise.dflash.chat import Rendered
from lengthwise.dflash.generate import conversation_seed, decode_conversations
from lengthwise.dflash.prompt_batches import batch_offsets
from lengthwise.errors import ConfigError, MissingDependencyError
from lengthwise.train.device import pick_device, rank_world

__all__ = ["BACKENDS", "TurnGenerator", "TurnLog", "assistant_turns", "pick_backend", "splice",
           "stop_ids", "turns_to_write"]


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

        from lengthwise.dflash.target import check_causal_lm

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
        self.decode_counts = None  # the last hf regeneration's DecodeCounts
        self.trace: list[tuple[int, int, int, float]] | None = None  # a list: its forwards
        if not self.stops:
            from lengthwise.errors import ConfigError

            raise ConfigError(f"--target {target}: neither the tokenizer nor the model names "
                              "an end-of-turn (eos) token, so responses cannot end")
        if self.backend == "vllm":
            from vllm import LLM

            self.engine = LLM(model=str(target), seed=cfg.seed)
        else:
            from lengthwise.dflash.target import load_target

            self.device = pick_device(cfg.device, info)
            self.model = load_target(target, dtype=cfg.dtype, device=self.device).eval()

    def _generate(self, prompts: list[np.ndarray], seed: int) -> list[list[int]]:
        """Each prompt's continuation by vLLM, up to and including its first stop token."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=self.cfg.temperature,
                                max_tokens=self.cfg.max_new_tokens,
                                stop_token_ids=self.stops, seed=seed)
        outs = self.engine.generate([TokensPrompt(prompt_token_ids=p.tolist())
                                     for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def regenerate(self, convs: list[list[dict[str, str]]], *, seed: int,
                   done: dict[tuple[int, int], list[int]] | None = None,
                   record: Callable[[list[tuple[int, int, list[int]]]], None] | None = None,
                   ) -> Generator[int, None, tuple[list[Rendered], int, int]]:
        """Rewrite every assistant turn of ``convs``; yields once per turn written and
        returns ``(samples, turns written, turns cut at max_new_tokens)``.

        Each sample (a :class:`~lengthwise.dflash.chat.Rendered`) holds the target's own
        token ids of every turn it wrote (:func:`splice`), its end-of-turn token only
        where it wrote one. ``done`` maps ``(conversation, turn)`` to the ids written
        before (a resumed run); ``record`` receives ``(conversation, turn, ids)`` after
        each batch. ``convs`` get the turns as text (the next turn's prompt).
        """
        done = done or {}
        for conv in convs:
            if conv[-1]["role"] != "assistant":
                conv.append({"role": "assistant", "content": ""})
        turns = [assistant_turns(c) for c in convs]
        samples = [Rendered([], []) for _ in convs]
        last: list[int | None] = [None] * len(convs)  # each conversation's turn written last
        tally = {"written": 0, "cut": 0}

        def accept(i: int, r: int, prompt: list[int], toks: list[int]) -> None:
            j = turns[i][r]
            ended = bool(toks) and toks[-1] in self.stops
            tally["cut"] += not ended
            tally["written"] += 1
            samples[i] = splice(
                samples[i], prompt, toks,
                after=lambda: (None if last[i] is None else
                               self.renderer.prompt_after(convs[i][:j], last[i])),
                history=lambda: self.renderer.render(convs[i][:j]))
            last[i] = j
            convs[i][j] = {"role": "assistant", "content": self.renderer.tokenizer.decode(
                toks[:-1] if ended else toks, skip_special_tokens=True)}

        write = self._conversations if self.backend == "hf" else self._rounds
        yield from write(convs, turns, accept, seed=seed, done=done, record=record)
        return samples, tally["written"], tally["cut"]

    def _rounds(self, convs: list[list[dict[str, str]]], turns: list[list[int]],
                accept: Callable[[int, int, list[int], list[int]], None], *, seed: int,
                done: dict[tuple[int, int], list[int]],
                record: Callable[[list[tuple[int, int, list[int]]]], None] | None,
                ) -> Generator[int, None, None]:
        """Round ``r`` writes the ``r``-th turn of every conversation, in batches of prompts
        sorted by length (the backend batches them its own way)."""
        for r in range(max((len(t) for t in turns), default=0)):
            todo = [(i, t[r]) for i, t in enumerate(turns) if len(t) > r]
            prompts = {i: self.renderer.prompt_ids(convs[i][:j]) for i, j in todo}
            new = {i: list(done[(i, r)]) for i, _ in todo if (i, r) in done}
            yield from range(len(new))
            rest = sorted((i for i, _ in todo if i not in new), key=lambda i: len(prompts[i]))
            cuts = batch_offsets(np.array([len(prompts[i]) for i in rest], dtype=np.int64),
                                 batch_size=self.cfg.batch_size, max_tokens=self.cfg.max_tokens,
                                 max_new_tokens=self.cfg.max_new_tokens).tolist()
            for b, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
                batch = rest[lo:hi]
                outs = self._generate([np.asarray(prompts[i], dtype=np.int64) for i in batch],
                                      (seed * 1009 + r) * 7919 + b)
                new.update(zip(batch, outs, strict=True))
                if record is not None:
                    record([(i, r, new[i]) for i in batch])
                yield from range(len(batch))
            for i, _ in todo:
                accept(i, r, prompts[i], new[i])

    def _conversations(self, convs: list[list[dict[str, str]]], turns: list[list[int]],
                       accept: Callable[[int, int, list[int], list[int]], None], *, seed: int,
                       done: dict[tuple[int, int], list[int]],
                       record: Callable[[list[tuple[int, int, list[int]]]], None] | None,
                       ) -> Generator[int, None, None]:
        """Each conversation's turns one after another in a row of one continuous batch
        (:func:`~lengthwise.dflash.generate.decode_conversations`), the
        conversations with the most turns admitted first."""

        nxt = [0] * len(convs)  # each conversation's next turn
        prompts: dict[int, list[int]] = {}  # each conversation's prompt being answered
        finished: list[tuple[int, int, list[int]]] = []
        resumed = [0]

        def prompt(i: int, written: list[int] | None) -> list[int] | None:
            if written is not None:
                accept(i, nxt[i], prompts[i], written)
                finished.append((i, nxt[i], written))
                nxt[i] += 1
            while nxt[i] < len(turns[i]):
                ids = self.renderer.prompt_ids(convs[i][:turns[i][nxt[i]]])
                if (i, nxt[i]) not in done:
                    prompts[i] = ids
                    return ids
                accept(i, nxt[i], ids, list(done[(i, nxt[i])]))
                resumed[0] += 1
                nxt[i] += 1
            return None

        order = sorted(range(len(convs)), key=lambda i: -len(turns[i]))
        run = decode_conversations(
            self.model, order, prompt, max_new_tokens=self.cfg.max_new_tokens,
            stops=self.stops, rows=self.cfg.batch_size, max_tokens=self.cfg.max_tokens,
            temperature=self.cfg.temperature, seed=lambda i: conversation_seed(seed, i),
            device=self.device, trace=self.trace)
        while True:
            try:
                next(run)
            except StopIteration as end:
                self.decode_counts = end.value
                break
            if record is not None and finished:
                record(finished)
            yield from range(len(finished) + resumed[0])
            finished.clear()
            resumed[0] = 0
        yield from range(resumed[0])


def splice(sample: Rendered, prompt: list[int], written: list[int], *,
           after: Callable[[], list[int] | None], history: Callable[[], Rendered]) -> Rendered:
    """``sample`` (a :class:`~lengthwise.dflash.chat.Rendered`) continued by a turn the target
    wrote: the prompt's new tokens unlearned, then ``written`` (the target's ids) learned.

    The new tokens are those of ``prompt`` past ``sample`` when ``sample`` begins it;
    else (the template's text of the earlier turns encodes to other ids than the target
    wrote) ``after()``, the prompt's ids after the turn written last, without an
    end-of-turn token the target already wrote. When neither is known the sample restarts
    from ``prompt``, with the loss mask ``history()`` (the conversation before the turn
    rendered) gives its tokens.

    Example::

        >>> from lengthwise.dflash.chat import Rendered
        >>> s = splice(Rendered([], []), [1, 2], [7, 8], after=None, history=None)
        >>> s = splice(s, [1, 2, 7, 8, 3], [9], after=None, history=None)
        >>> s.input_ids, s.loss_mask
        ([1, 2, 7, 8, 3, 9], [0, 0, 1, 1, 0, 1])
        >>> s = splice(s, [1, 2, 5, 8, 3, 9, 4], [6], after=lambda: [4], history=None)
        >>> s.input_ids, s.loss_mask
        ([1, 2, 7, 8, 3, 9, 4, 6], [0, 0, 1, 1, 0, 1, 0, 1])
        >>> s = splice(s, [5, 4], [3], after=lambda: None, history=lambda: Rendered([5], [1]))
        >>> s.input_ids, s.loss_mask
        ([5, 4, 3], [1, 0, 1])
    """
    n = len(sample.input_ids)
    tail = None if prompt[:n] == sample.input_ids else after()
    if prompt[:n] == sample.input_ids:
        ids, mask = sample.input_ids + prompt[n:], sample.loss_mask + [0] * (len(prompt) - n)
    elif tail is not None:
        if sample.input_ids and tail[:1] == sample.input_ids[-1:] and sample.loss_mask[-1]:
            tail = tail[1:]  # the target wrote the end-of-turn token the template writes
        ids, mask = sample.input_ids + tail, sample.loss_mask + [0] * len(tail)
    else:
        before = history()
        m = len(before.input_ids)
        known = prompt[:m] == before.input_ids
        ids, mask = list(prompt), (before.loss_mask if known else []) + [0] * (
            len(prompt) - (m if known else 0))
    return Rendered(ids + list(written), mask + [1] * len(written))


def assistant_turns(conv: list[dict[str, str]]) -> list[int]:
    """Positions of ``conv``'s assistant turns: the turns regeneration writes in their place.

    Example::

        >>> assistant_turns([{"role": "user", "content": "hi"},
        ...                  {"role": "assistant", "content": "hello"}])
        [1]
    """
    return [j for j, m in enumerate(conv) if m["role"] == "assistant"]


def turns_to_write(conv: list[dict[str, str]]) -> int:
    """How many turns regeneration writes in ``conv``: each assistant turn, and one more
    when the conversation ends with another role's turn.

    Example::

        >>> turns_to_write([{"role": "user", "content": "hi"}])
        1
    """
    return sum(m["role"] == "assistant" for m in conv) + (conv[-1]["role"] != "assistant")


class TurnLog:
    """The turns regeneration finished in one shard, as JSON lines beside the shard.

    The first line is ``{"header": ...}`` (the shard's settings and tokenizer); each
    next line is ``{"row": i, "turn": r, "ids": [...]}``, appended and flushed after
    every batch, so that a run stopped by Ctrl-C or a kill resumes with them. A log
    with another header is started again; a line cut by a kill is ignored.
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path, self.header = Path(path), header

    def read(self) -> dict[tuple[int, int], list[int]]:
        """The turns written before under the same header (none when the log is another's)."""

        if not self.path.is_file():
            return {}
        lines = self.path.read_text(encoding="utf-8").splitlines()
        out: dict[tuple[int, int], list[int]] = {}
        try:
            if not lines or json.loads(lines[0]) != {"header": self.header}:
                return {}
        except ValueError:
            return {}
        for line in lines[1:]:
            try:
                row = json.loads(line)
                out[(int(row["row"]), int(row["turn"]))] = [int(t) for t in row["ids"]]
            except (ValueError, KeyError, TypeError):
                continue  # the last line, cut by a kill mid-write
        return out

    def start(self, done: dict[tuple[int, int], list[int]]) -> None:
        """Write the log afresh: the header and the turns of ``done``."""


        with atomic_open(self.path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"header": self.header}) + "\n")
            fh.writelines(json.dumps({"row": i, "turn": r, "ids": ids}) + "\n"
                          for (i, r), ids in done.items())

    def append(self, turns: list[tuple[int, int, list[int]]]) -> None:
        """Add turns ``(row, turn, ids)`` and flush them to the disk."""

        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"row": i, "turn": r, "ids": [int(t) for t in ids]})
                          + "\n" for i, r, ids in turns)
            fh.flush()
            os.fsync(fh.fileno())
