"""Loss masks under the chat templates users bring: every assistant turn learned, nothing else.

The templates in ``data/templates`` are the public ones of Qwen3 (tools branch dropped, with
its thinking switch and its history stripping), Llama 3, Mistral, Gemma and DeepSeek-R1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _chat_tiny import chat_tokenizer, texts
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.chat import ChatRenderer, normalise

TEMPLATES = Path(__file__).parent / "data" / "templates"
#: template -> (bos, eos, end of an assistant turn, other special tokens it writes)
TOKENS = {
    "qwen3": (None, "<|im_end|>", "<|im_end|>", ["<|im_start|>"]),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>",
               ["<|start_header_id|>", "<|end_header_id|>"]),
    "mistral": ("<s>", "</s>", "</s>", []),
    "gemma": ("<bos>", "<eos>", "<end_of_turn>", ["<start_of_turn>"]),
    "deepseek_r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                    "<｜end▁of▁sentence｜>", ["<｜User｜>", "<｜Assistant｜>"]),
}
#: templates that refuse a system message (roles must alternate user/assistant)
NO_SYSTEM = {"mistral", "gemma"}


def _renderer(name: str, **kw) -> ChatRenderer:
    tok = chat_tokenizer((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"))
    bos, eos, end, other = TOKENS[name]
    tok.add_tokens([t for t in (bos, eos, end, *other) if t], special_tokens=True)
    tok.eos_token = eos
    if bos:
        tok.bos_token = bos
    return ChatRenderer(tok, name=name, **kw)


@pytest.fixture(scope="module", params=sorted(TOKENS))
def renderer(request):
    return _renderer(request.param)


def _runs(renderer: ChatRenderer, conv: list[dict[str, str]]) -> list[str]:
    """The learned tokens of ``conv``, decoded run by run (a run: consecutive learned tokens)."""
    out = renderer.render(conv)
    runs, cur = [], []
    for t, m in zip(out.input_ids, out.loss_mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    runs += [cur] if cur else []
    return [renderer.tokenizer.decode(r) for r in runs]


def _chat(turns: list[tuple[str, str]], system: bool) -> list[dict[str, str]]:
    conv = [{"role": "system", "content": "be brief"}] if system else []
    for user, reply in turns:
        conv += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return normalise(conv, where="row")


def test_every_turn_of_a_long_chat_is_learned_with_its_end_of_turn(renderer):
    words = texts(8, seed=3)
    conv = _chat(list(zip(words[::2], words[1::2], strict=True)),
                 system=renderer.name not in NO_SYSTEM)
    runs = _runs(renderer, conv)
    replies = [m["content"] for m in conv if m["role"] == "assistant"]
    end = TOKENS[renderer.name][2]
    assert len(runs) == len(replies) == 4
    for run, reply in zip(runs, replies, strict=True):
        assert run.endswith(reply + end), (run, reply)
        assert not any(u["content"] in run for u in conv if u["role"] != "assistant")


def test_qwen3_learns_earlier_turns_as_history_and_the_last_with_its_thinking():
    qwen = _renderer("qwen3")
    conv = normalise([
        {"role": "user", "content": "the cat"},
        {"role": "assistant", "content": "sat on a mat", "reasoning_content": "cats sit"},
        {"role": "user", "content": "two dogs"},
        {"role": "assistant", "content": "ran far away", "reasoning_content": "dogs run"},
    ], where="row")
    # history drops an earlier turn's thinking; the last turn is learned with its own
    assert _runs(qwen, conv) == ["sat on a mat<|im_end|>",
                                 "<think>\ndogs run\n</think>\n\nran far away<|im_end|>"]
    off = _renderer("qwen3", enable_thinking=False)
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in conv]
    assert _runs(off, plain) == ["sat on a mat<|im_end|>", "ran far away<|im_end|>"]


def test_deepseek_learns_the_answer_its_template_keeps():
    ds = _renderer("deepseek_r1")
    conv = normalise([
        {"role": "user", "content": "the cat"},
        {"role": "assistant", "content": "<think>cats sit</think>sat on a mat"},
        {"role": "user", "content": "two dogs"},
        {"role": "assistant", "content": "<think>dogs run</think>ran far away"},
    ], where="row")
    assert _runs(ds, conv) == ["sat on a mat<｜end▁of▁sentence｜>",
                               "ran far away<｜end▁of▁sentence｜>"]


TEXT = st.text(alphabet=st.sampled_from(list("ab cat.,é漢")), min_size=1, max_size=20).filter(
    lambda s: s.strip() == s)


@pytest.mark.parametrize("name", sorted(TOKENS))
@settings(max_examples=15, deadline=None)
@given(turns=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3))
def test_any_chat_learns_each_reply_once_and_no_user_text(name, turns):
    renderer = _RENDERERS.get(name) or _RENDERERS.setdefault(name, _renderer(name))
    conv = _chat([(f"U{k} {u}", f"R{k} {r}") for k, (u, r) in enumerate(turns)], system=False)
    runs = _runs(renderer, conv)
    end = TOKENS[name][2]
    assert [r.endswith(end) for r in runs] == [True] * len(turns)
    learned = "".join(runs)
    for k in range(len(turns)):
        assert learned.count(f"R{k} ") == 1 and f"U{k} " not in learned


_RENDERERS: dict[str, ChatRenderer] = {}
