"""Prompt sets for evaluating a draft: JSONL files rendered with the target's chat template.

Each line is ``{"prompt": "..."}`` (one user turn) or ``{"messages": [{"role": ...,
"content": ...}, ...]}`` (a conversation to continue); MT-bench, GSM8K, HumanEval or
MATH-500 prompts converted to either form work as they are. Rendering uses the
tokenizer's chat template with the generation prompt added (and the thinking
switch, where the template has one); a tokenizer without a chat template takes a
``prompt`` line's text as it is. :func:`bundled_prompts` is a small set shipped
with lengthwise for tests and smoke runs.

Example::

    >>> rows = read_prompt_file(bundled_prompts())
    >>> len(rows) >= 8, rows[0][0]["role"]
    (True, 'user')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.jsonl import check_text, json_record

__all__ = ["bundled_prompts", "prompt_set_names", "read_prompt_file", "render_prompts",
           "template_report"]

_ROLES = ("system", "user", "assistant", "tool")


def bundled_prompts() -> Path:
    """The path of the small prompt set shipped with lengthwise (written for tests)."""
    from importlib.resources import files

    return Path(str(files("lengthwise") / "data" / "dflash_prompts.jsonl"))


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
        if m.get("role") not in _ROLES:
            raise DataError(f"{where}: messages[{i}].role must be one of {', '.join(_ROLES)}, "
                            f"got {m.get('role')!r}")
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
    from lengthwise.dflash.tokenizer_id import template_sha256

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
