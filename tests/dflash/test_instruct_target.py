"""The recipe on an instruct target shaped like SmolLM2: a Llama with tied embeddings saved in
bfloat16 and a ChatML template that injects a default system prompt."""

from __future__ import annotations

import pytest
from _chat_tiny import save_instruct_target

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return save_instruct_target(tmp_path_factory.mktemp("instruct") / "target")


def test_a_bfloat16_checkpoint_runs_in_float32_on_cpu_unless_told(instruct):
    from lengthwise.dflash.target import load_target

    assert load_target(instruct).dtype == torch.float32
    assert load_target(instruct, dtype="bfloat16").dtype == torch.bfloat16


def test_regeneration_loads_the_target_in_the_dtype_asked(instruct):
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.prepare import PrepareConfig
    from lengthwise.dflash.recipe import load_tokenizer
    from lengthwise.dflash.regenerate import TurnGenerator

    renderer = ChatRenderer(load_tokenizer(instruct))
    for dtype, want in ((None, torch.float32), ("bfloat16", torch.bfloat16)):
        cfg = PrepareConfig(regenerate=True, dtype=dtype, progress=False)
        assert TurnGenerator(instruct, renderer, cfg).model.dtype == want


def _learned(renderer, conv):
    r = renderer.render(conv)
    tok = renderer.tokenizer
    runs, run = [], []
    for t, m in zip(r.input_ids, r.loss_mask, strict=True):
        if m:
            run.append(t)
        elif run:
            runs.append(tok.decode(run))
            run = []
    return runs + ([tok.decode(run)] if run else [])


def test_an_opening_assistant_turn_learns_its_content_not_the_injected_system_prompt(instruct):
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.recipe import load_tokenizer

    renderer = ChatRenderer(load_tokenizer(instruct))
    conv = [{"role": "assistant", "content": "hello there"},
            {"role": "user", "content": "the cat"},
            {"role": "assistant", "content": "sat on a mat"}]
    assert "You are a helpful assistant" in renderer.text(conv)
    assert _learned(renderer, conv) == ["hello there<|im_end|>", "sat on a mat<|im_end|>"]
