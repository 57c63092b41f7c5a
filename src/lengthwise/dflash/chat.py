"""Chat conversations: check them, and render them with a target's chat template.

Conversations come in OpenAI form (``role``/``content``) or ShareGPT form
(``from``/``value``; :mod:`lengthwise.dflash.chat_files` reads them from files).
:func:`normalise` turns one row's list into ``[{"role", "content"}]`` and names
the row and field of anything malformed. :class:`ChatRenderer` renders a
conversation with the tokenizer's chat template (with its ``enable_thinking``
switch where the template has one) into token ids and an assistant-only loss
mask: from the template's ``{% generation %}`` marks when it has them, else by
locating each assistant turn in the rendering of the whole conversation (so that
a template that renders earlier turns differently, as Qwen3's drops their
thinking, still has every turn learned).

Prompt sets for evaluating a draft are JSONL files (:func:`read_prompt_file`), each line
``{"prompt": "..."}`` (one user turn) or ``{"messages": [{"role": ..., "content": ...},
...]}`` (a conversation to continue); MT-bench, GSM8K, HumanEval or MATH-500 prompts
converted to either form work as they are. :func:`render_prompts` renders them with the
chat template and the generation prompt added (and the thinking switch, where the template
has one); a tokenizer without a chat template takes a ``prompt`` line's text as it is.
:func:`bundled_prompts` is a small set shipped with lengthwise for tests and smoke runs.

Example::

    >>> chat = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    >>> normalise(chat, where="row 0")
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}]
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lengthwise.dflash.target_match import template_sha256
from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.jsonl import check_text, json_record

__all__ = ["TEMPLATE_ERRORS", "ChatRenderer", "Rendered", "bundled_prompts", "normalise",
           "prompt_set_names", "read_prompt_file", "render_prompts", "template_report"]

#: ShareGPT and OpenAI speaker names and the chat-template role each becomes
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant",
         "gpt": "assistant", "chatgpt": "assistant", "model": "assistant", "tool": "tool",
         "function": "tool", "observation": "tool"}
try:  # what a chat template raises for a conversation it refuses, or past the sandbox's limits
    from jinja2 import TemplateError as _TemplateError

    TEMPLATE_ERRORS: tuple[type[Exception], ...] = (_TemplateError, ValueError, OverflowError,
                                                    RecursionError)
except ImportError:  # pragma: no cover - transformers needs jinja2 for chat templates
    TEMPLATE_ERRORS = (ValueError, OverflowError, RecursionError)
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
_PROBE = "LENGTHWISE_PROBE_7f3a"


def _content(value: Any, where: str) -> str:
    """Text of a message's content: a string, or OpenAI's list of ``{"type": "text"}`` parts."""
    if isinstance(value, list):
        parts = []
        for k, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type", "text") == "text"
                    and isinstance(part.get("text"), str)):
                raise DataError(f"{where}.content[{k}]: only text parts are supported, "
                                f"got {str(part)[:60]!r}")
            parts.append(part["text"])
        value = "".join(parts)
    if not isinstance(value, str):
        raise DataError(f"{where}: content must be text, got {type(value).__name__}")
    return value


def normalise(messages: Any, *, where: str, allow_empty_assistant: bool = False,
              ) -> list[dict[str, str]]:
    """One row's messages as ``[{"role", "content"}]``; a :class:`DataError` names what is wrong.

    ``where`` names the row (e.g. ``"chats.jsonl row 12 field 'messages'"``).

    Example::

        >>> normalise([{"role": "user", "content": ""}], where="row 3")  # whitespace is text
        Traceback (most recent call last):
        ...
        lengthwise.errors.DataError: row 3[0]: empty content (role 'user')
    """
    if not isinstance(messages, (list, tuple)):
        raise DataError(f"{where}: must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise DataError(f"{where}: no messages")
    out = []
    for j, msg in enumerate(messages):
        at = f"{where}[{j}]"
        if not isinstance(msg, dict):
            raise DataError(f"{at}: a message must be an object, got {type(msg).__name__}")
        speaker = msg.get("role", msg.get("from"))
        if speaker is None:
            raise DataError(f"{at}: no 'role' (or ShareGPT 'from') field")
        role = ROLES.get(str(speaker).lower()) if isinstance(speaker, str) else None
        if role is None:
            raise DataError(f"{at}: unknown role {speaker!r} (known: {', '.join(ROLES)})")
        if "content" in msg:
            text = _content(msg["content"], at)
        elif "value" in msg:
            text = _content(msg["value"], at)
        else:
            raise DataError(f"{at}: no 'content' (or ShareGPT 'value') field")
        if not text and not (allow_empty_assistant and role == "assistant"):
            raise DataError(f"{at}: empty content (role {role!r})")
        item = {"role": role, "content": text}
        if isinstance(msg.get("reasoning_content"), str) and role == "assistant":
            item["reasoning_content"] = msg["reasoning_content"]  # thinking templates render it
        out.append(item)
    return out


@dataclass
class Rendered:
    """Token ids of one rendered conversation and its loss mask (1 = assistant token)."""

    input_ids: list[int]
    loss_mask: list[int]


class ChatRenderer:
    """A tokenizer's chat template, rendered to token ids and an assistant-only loss mask.

    ``enable_thinking`` (``None``: the template's default) is passed to the template;
    it is refused when the template has no such switch.
    """

    def __init__(self, tokenizer: Any, *, enable_thinking: bool | None = None,
                 name: str = "the tokenizer") -> None:
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
        if not template:
            raise ConfigError(f"{name} has no chat template" + (
                "" if enable_thinking is None else " (--enable-thinking/--no-enable-thinking "
                "need one with an enable_thinking switch)"))
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"{name} is not a fast tokenizer (tokenizer.json): the loss "
                              "mask needs its character offsets")
        self.tokenizer, self.template, self.name = tokenizer, template, name
        self.has_thinking = "enable_thinking" in template
        if enable_thinking is not None and not self.has_thinking:
            raise ConfigError(f"--enable-thinking/--no-enable-thinking: the chat template of "
                              f"{name} has no enable_thinking switch")
        self.enable_thinking = enable_thinking
        self.uses_generation_marks = bool(_GENERATION.search(template))
        self._check_assistant_role()

    @property
    def template_sha256(self) -> str:
        """Hash of the chat template text (recorded with prepared data)."""
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()

    def text(self, messages: list[dict[str, str]], *, generation_prompt: bool = False) -> str:
        """The conversation rendered as text."""
        kwargs = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=generation_prompt,
                                                  **kwargs)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` followed by the template's assistant generation prompt."""
        return self._encode(self.text(messages, generation_prompt=True))[0]

    def prompt_after(self, messages: list[dict[str, str]], k: int) -> list[int] | None:
        """The ids of :meth:`prompt_ids` that follow the content of turn ``k``: the template's
        end of that turn, the later turns and the generation prompt (``None`` when the
        template does not write that content whole, or no token starts where it ends)."""
        marked = [*messages[:k], {**messages[k], "content": messages[k]["content"] + _PROBE},
                  *messages[k + 1:]]
        at = self.text(marked, generation_prompt=True).find(_PROBE)
        if at < 0:
            return None
        ids, offsets = self._encode(self.text(messages, generation_prompt=True))
        first = next((n for n, (start, _) in enumerate(offsets) if start >= at), len(ids))
        if first and offsets[first - 1][1] > at:  # a token runs across the content's end
            return None
        return ids[first:]

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def _check_assistant_role(self) -> None:
        conv = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = self.text(conv)
        except TEMPLATE_ERRORS as exc:  # a template raising on the role is the user's template
            raise ConfigError(f"the chat template of {self.name} cannot render an assistant "
                              f"turn ({' '.join(str(exc).split())})") from None
        if _PROBE not in text:
            raise ConfigError(f"the chat template of {self.name} has no assistant role: an "
                              "assistant message's content does not appear in its output")

    def spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character span of each assistant turn in it.

        Each span is located in the rendering of the whole conversation, where earlier
        turns appear as the template renders history: it starts where the conversation
        before the turn, with the generation prompt, stops matching (for a turn that opens
        the chat: where its content starts, after any system prompt the template injects
        and the turn's header); its text runs to the
        end of the turn's content (found by rendering the conversation with a marker after
        that content) and on through the end-of-turn text the template writes after a
        last turn (``<|im_end|>``, ``<|eot_id|>``, ...), without trailing whitespace: the
        tokens the target would generate.
        """
        full = self.text(messages)
        out: list[tuple[int, int]] = []
        for k, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            lo = (_common_prefix(self.text(messages[:k], generation_prompt=True), full) if k
                  else self._first_turn_start(messages, full))
            lo = max(lo, out[-1][1] if out else 0)
            hi = max(self._turn_end(messages, k, full), lo)
            while hi > lo and full[hi - 1].isspace():
                hi -= 1
            if hi > lo:
                out.append((lo, hi))
        return full, out

    def _first_turn_start(self, messages: list[dict[str, str]], full: str) -> int:
        """Where the content of an assistant turn that opens the chat starts in ``full``: after
        what the template writes before it (a default system prompt, the turn's header)."""
        marked = [{**messages[0], "content": _PROBE + messages[0]["content"]}, *messages[1:]]
        text = self.text(marked)
        at = text.find(_PROBE)
        return _common_prefix(text[:at], full) if at >= 0 else 0

    def _turn_end(self, messages: list[dict[str, str]], k: int, full: str) -> int:
        """Where assistant turn ``k`` and its end-of-turn text end in ``full``."""
        marked = [*messages[:k], {**messages[k], "content": messages[k]["content"] + _PROBE},
                  *messages[k + 1:]]
        whole, last = self.text(marked), self.text(marked[: k + 1])
        at, at_last = whole.find(_PROBE), last.find(_PROBE)
        if at < 0 or at_last < 0:  # the template drops the content's end: the turn rendered last
            return _common_prefix(self.text(messages[: k + 1]), full)
        end = _common_prefix(whole[:at], full)
        return end + _common_prefix(last[at_last + len(_PROBE):].rstrip(), full[end:])

    def render(self, messages: list[dict[str, str]]) -> Rendered:
        """Token ids and the assistant-only loss mask of one conversation."""
        if self.uses_generation_marks:
            kwargs = ({} if self.enable_thinking is None
                      else {"enable_thinking": self.enable_thinking})
            out = self.tokenizer.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                **kwargs)
            ids = list(out["input_ids"])
            return Rendered(ids, [int(m) for m in out["assistant_masks"]])
        text, spans = self.spans(messages)
        ids, offsets = self._encode(text)
        mask = [0] * len(ids)
        k = 0
        for i, (start, end) in enumerate(offsets):  # a token overlapping a span is learned
            while k < len(spans) and spans[k][1] <= start:
                k += 1
            if k == len(spans):
                break
            if end > spans[k][0]:
                mask[i] = 1
        return Rendered(ids, mask)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


#: the roles a prompt file's messages may have
_PROMPT_ROLES = ("system", "user", "assistant", "tool")


def bundled_prompts() -> Path:
    """The path of the small prompt set shipped with lengthwise (written for tests).

    Example::

        >>> rows = read_prompt_file(bundled_prompts())
        >>> len(rows) >= 8, rows[0][0]["role"]
        (True, 'user')
    """
    return Path(str(resources.files("lengthwise") / "data" / "dflash_prompts.jsonl"))


def read_prompt_file(path: str | os.PathLike) -> list[list[dict[str, str]]]:
    """The conversations of a JSONL prompt file, each a list of ``{"role", "content"}``.

    A malformed line raises :class:`~lengthwise.errors.DataError` naming the file,
    the line and the field; an empty file too.
    """
    path = Path(path)
    out: list[list[dict[str, str]]] = []
    with open(path, encoding="utf-8") as handle:
        for n, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {n}"
            row = json_record(line, path, n, error=DataError)
            check_text(line, row, where, error=DataError)
            out.append(_conversation(row, where))
    if not out:
        raise DataError(f"{path}: no prompts")
    return out


def prompt_set_names(files: list[str | os.PathLike]) -> list[str]:
    """The name of each prompt file's set in a report: its stem, or, where stems repeat, as
    many of its folders before the stem as tell the files apart.

    A file given twice raises :class:`~lengthwise.errors.ConfigError` naming both spellings.

    Example::

        >>> prompt_set_names(["mt_bench.jsonl", "math/test.jsonl", "code/test.jsonl"])
        ['mt_bench', 'math/test', 'code/test']
    """
    paths = [Path(f).resolve() for f in files]
    seen: dict[Path, str | os.PathLike] = {}
    for given, path in zip(files, paths, strict=True):
        if path in seen:
            raise ConfigError(f"--prompts: {seen[path]} and {given} are the same file; give "
                              "each prompt set once")
        seen[path] = given

    def name(path: Path, depth: int) -> str:
        if depth >= len(path.parts):  # the stems and folders alike: the whole path
            return str(path)
        return "/".join([*path.parent.parts[len(path.parent.parts) - depth + 1:], path.stem])

    depth = [1] * len(paths)
    while True:
        names = [name(p, d) for p, d in zip(paths, depth, strict=True)]
        clash = {n for n in names if names.count(n) > 1}
        if not clash:
            return names
        depth = [d + (n in clash) for n, d in zip(names, depth, strict=True)]


def _conversation(row: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: a line must be an object with 'prompt' or 'messages'")
    if "prompt" in row:
        text = row["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: field 'prompt' must be non-empty text")
        return [{"role": "user", "content": text}]
    msgs = row.get("messages")
    if msgs is None:
        raise DataError(f"{where}: no 'prompt' or 'messages' field (has {sorted(row)})")
    if not isinstance(msgs, list) or not msgs:
        raise DataError(f"{where}: field 'messages' must be a non-empty list")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: messages[{i}] must be an object with text 'content'")
        if m.get("role") not in _PROMPT_ROLES:
            raise DataError(f"{where}: messages[{i}].role must be one of "
                            f"{', '.join(_PROMPT_ROLES)}, got {m.get('role')!r}")
    if msgs[-1]["role"] == "assistant":
        raise DataError(f"{where}: the last message is the assistant's; a prompt ends with a "
                        "turn the target answers")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def render_prompts(conversations: list[list[dict[str, str]]], tokenizer: Any, *,
                   thinking: bool | None = False) -> list[list[int]]:
    """Token ids of each conversation under the tokenizer's chat template.

    ``thinking`` is passed as ``enable_thinking`` (templates without the switch
    ignore it; ``None`` passes nothing). Without a chat template, single-turn
    prompts are encoded as plain text; conversations raise ``ConfigError``.
    """
    template = getattr(tokenizer, "chat_template", None)
    out = []
    for conv in conversations:
        if template:
            extra = {} if thinking is None else {"enable_thinking": bool(thinking)}
            text = tokenizer.apply_chat_template(conv, tokenize=False,
                                                 add_generation_prompt=True, **extra)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        elif len(conv) == 1 and conv[0]["role"] == "user":
            ids = tokenizer(conv[0]["content"])["input_ids"]
        else:
            raise ConfigError("the target's tokenizer has no chat template: only one-turn "
                              "'prompt' lines can be rendered")
        out.append([int(t) for t in ids])
    return out


def template_report(tokenizer: Any, *, thinking: bool | None) -> dict[str, str]:
    """The chat template prompts are rendered with, and its thinking switch, for a report.

    ``template``: the tokenizer's name or folder and the template's sha256 (first 12 hex
    digits), or ``none (plain text)``; ``thinking``: ``on``/``off`` where the template
    reads ``enable_thinking``, else ``n/a (the template has no switch)``.

    Example::

        >>> class Tok:
        ...     name_or_path, chat_template = "Qwen3-8B", "{{ enable_thinking }}"
        >>> template_report(Tok(), thinking=False)["thinking"]
        'off'
        >>> template_report(object(), thinking=True)
        {'template': 'none (plain text)', 'thinking': 'n/a (the template has no switch)'}
    """
    digest = template_sha256(tokenizer)
    if digest is None:
        return {"template": "none (plain text)", "thinking": "n/a (the template has no switch)"}
    text = tokenizer.chat_template
    text = text.get("default", "") if isinstance(text, dict) else text
    name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    switch = "n/a (the template has no switch)"
    if "enable_thinking" in text and thinking is not None:
        switch = "on" if thinking else "off"
    return {"template": f"chat template of {name} (sha256 {digest[:12]})", "thinking": switch}
