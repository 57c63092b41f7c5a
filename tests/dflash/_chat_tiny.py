"""A tiny Qwen3-shaped target saved to a local folder, with a chat tokenizer, and chat files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: a ChatML template with a thinking switch, assistant turns marked for generation
TEMPLATE_MARKED = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['role'] == 'assistant' -%}"
    "{% generation %}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- m['content'] + '<|im_end|>' -}}"
    "{% endgeneration %}{{- '\\n' -}}"
    "{%- else -%}{{- m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)
#: the same template without the generation marks (the turns located in the rendering)
TEMPLATE = TEMPLATE_MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")
#: a template that renders every message as "role: content" but drops assistant turns
TEMPLATE_NO_ASSISTANT = (
    "{%- for m in messages -%}{%- if m['role'] != 'assistant' -%}"
    "{{- m['role'] + ': ' + m['content'] + '\\n' -}}{%- endif -%}{%- endfor -%}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ("the cat sat on a mat while two dogs ran far away from home and then came back "
         "to eat some red apples under the old tree near our small house by the river").split()


def texts(n: int, seed: int = 0) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(3, 14)))) for _ in range(n)]


def chat_tokenizer(template: str = TEMPLATE):
    """A byte-level BPE tokenizer trained on toy sentences, with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(300), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[1:])
    fast.add_tokens(["<think>", "</think>"])
    fast.chat_template = template
    return fast


def save_target(folder: Path, *, template: str = TEMPLATE, seed: int = 0, layers: int = 4,
                causal_lm: bool = True) -> Path:
    """A random Qwen3-shaped causal LM (hidden 32) and its chat tokenizer in ``folder``."""
    tok = chat_tokenizer(template)
    cfg = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = (transformers.Qwen3ForCausalLM(cfg) if causal_lm
             else transformers.Qwen3Model(cfg))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def conversations(n: int, seed: int = 0, *, sharegpt: bool = False) -> list[dict]:
    """``n`` chats of 1-2 exchanges (every assistant turn 8-14 words, well above 1 token)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i, t in enumerate(texts(3 * n, seed + 1)[::3]):
        msgs = [{"role": "system", "content": "be brief"}] if i % 3 == 0 else []
        for _ in range(1 + i % 2):
            msgs.append({"role": "user", "content": t})
            msgs.append({"role": "assistant",
                         "content": " ".join(rng.choice(WORDS, int(rng.integers(8, 15))))})
        if sharegpt:
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            out.append({"conversations": [{"from": names[m["role"]], "value": m["content"]}
                                          for m in msgs]})
        else:
            out.append({"messages": msgs})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


#: SmolLM2's ChatML template: a default system prompt when the chat opens without one
TEMPLATE_DEFAULT_SYSTEM = (
    "{%- for m in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' -}}{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def save_instruct_target(folder: Path, *, seed: int = 0, dtype: str = "bfloat16",
                         extra_special: tuple[str, ...] = ()) -> Path:
    """A random Llama with tied embeddings saved in ``dtype``, and a ChatML tokenizer whose
    template injects a default system prompt (as SmolLM2-Instruct's); ``extra_special``:
    more special tokens the chat template never writes."""
    tok = chat_tokenizer(TEMPLATE_DEFAULT_SYSTEM)
    if extra_special:
        tok.add_special_tokens({"additional_special_tokens": [*SPECIAL[1:], *extra_special]})
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def prepared_chats(root: Path) -> tuple[Path, Path]:
    """``(target folder, prepared folder)`` under ``root``: a tiny chat target and 40 chats
    prepared for it."""
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    target = save_target(root / "target")
    chats = write_jsonl(root / "chats.jsonl", conversations(40))
    prepare_chats(chats, target, root / "prepared",
                  PrepareConfig(min_supervised=16, shard_rows=16, progress=False))
    return target, root / "prepared"
