"""compute_lengths on real datasets with a tokenizer trained here (no downloads)."""

from __future__ import annotations

import codecs
import os
import subprocess
import sys
import this

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from lengthwise.hf.lengths import compute_lengths
from lengthwise.planning.lengths import LengthError

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
ZEN = codecs.decode(this.s, "rot13")


def _corpus(n=300, seed=0):
    words = ZEN.replace(".", " ").replace(",", " ").split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=rng.integers(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def raw_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"]
    tok.train_from_iterator(ZEN.splitlines() * 3 + _corpus(),
                            trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


class CountingTokenizer(PreTrainedTokenizerFast):
    """A real fast tokenizer that counts how often it is asked to tokenize."""

    calls = 0

    def __call__(self, *args, **kwargs):
        type(self).calls += 1
        return super().__call__(*args, **kwargs)


@pytest.fixture()
def tokenizer(raw_tokenizer):
    tok = CountingTokenizer(tokenizer_object=raw_tokenizer, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    CountingTokenizer.calls = 0
    return tok


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHWISE_CACHE", str(tmp_path / "cache"))


def _chats(n=40, seed=1):
    texts = _corpus(2 * n, seed)
    return [[{"role": "user", "content": texts[2 * i]},
             {"role": "assistant", "content": texts[2 * i + 1]}][: 1 + i % 2] for i in range(n)]


def test_length_column_is_reused():
    ds = datasets.Dataset.from_dict({"num_tokens": [7, 2, 9], "text": ["a", "b", "c"]})
    out = compute_lengths(ds)
    assert out.dtype == np.int64 and out.tolist() == [7, 2, 9]
    assert compute_lengths(ds.select([2, 0])).tolist() == [9, 7]
    ds2 = datasets.Dataset.from_dict({"size": [3.0, 4.0]})
    assert compute_lengths(ds2, column="size").tolist() == [3, 4]
    with pytest.raises(LengthError, match="row 1"):
        compute_lengths(datasets.Dataset.from_dict({"length": [3.0, 4.5]}))
    with pytest.raises(LengthError, match="negative"):
        compute_lengths(datasets.Dataset.from_dict({"length": [3, -1]}))


def test_token_ids_column_is_counted_in_row_order():
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 100, n).tolist() for n in rng.integers(1, 50, 200)]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "other": list(range(200))})
    assert compute_lengths(ds).tolist() == [len(x) for x in ids]
    shuffled = ds.shuffle(seed=3)
    assert compute_lengths(shuffled).tolist() == [len(x) for x in shuffled["input_ids"]]


def test_text_column_is_tokenized(tokenizer):
    texts = _corpus(150, seed=4)
    ds = datasets.Dataset.from_dict({"text": texts})
    expected = [len(tokenizer(t)["input_ids"]) for t in texts]
    CountingTokenizer.calls = 0
    out = compute_lengths(ds, tokenizer, column="text", cache=False)
    assert out.tolist() == expected
    assert CountingTokenizer.calls > 0
    no_bos = compute_lengths(ds, tokenizer, add_special_tokens=False, cache=False)
    assert (out - no_bos).tolist() == [1] * len(texts)


def test_bare_tokenizers_tokenizer_for_text(raw_tokenizer):
    texts = _corpus(30, seed=5)
    ds = datasets.Dataset.from_dict({"body": texts})
    out = compute_lengths(ds, raw_tokenizer, column="body")
    assert out.tolist() == [len(raw_tokenizer.encode(t).ids) for t in texts]


def test_chat_messages_use_the_chat_template(tokenizer):
    chats = _chats()
    ds = datasets.Dataset.from_dict({"messages": chats, "id": list(range(len(chats)))})
    out = compute_lengths(ds, tokenizer, messages_column="messages")
    rendered = ["".join(f"<|{m['role']}|>{m['content']}</s>" for m in c) for c in chats]
    expected = [len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in rendered]
    assert out.tolist() == expected
    # auto-detected from the column name when a tokenizer is given
    assert compute_lengths(ds, tokenizer).tolist() == expected
    prompt = compute_lengths(ds, tokenizer, chat_template_kwargs={"add_generation_prompt": True})
    assert (prompt - out).tolist() == [1] * len(chats)


def test_second_call_is_served_from_cache(tokenizer, tmp_path):
    chats = _chats(60, seed=2)
    ds = datasets.Dataset.from_dict({"messages": chats})
    first = compute_lengths(ds, tokenizer, messages_column="messages")
    calls = CountingTokenizer.calls
    assert calls > 0
    assert len(list((tmp_path / "cache").glob("lengths-*.npy"))) == 1

    again = compute_lengths(ds, tokenizer, messages_column="messages")
    assert CountingTokenizer.calls == calls  # nothing was tokenized
    assert np.array_equal(first, again) and again.dtype == np.int64

    # anything that changes the lengths misses the cache
    compute_lengths(ds.select(range(10)), tokenizer, messages_column="messages")
    assert CountingTokenizer.calls > calls
    calls = CountingTokenizer.calls
    tokenizer.chat_template = CHAT_TEMPLATE.replace("</s>", "</s></s>")
    longer = compute_lengths(ds, tokenizer, messages_column="messages")
    assert CountingTokenizer.calls > calls
    assert (longer - first).tolist() == [len(c) for c in chats]
    calls = CountingTokenizer.calls
    compute_lengths(ds, tokenizer, messages_column="messages", cache=False)
    assert CountingTokenizer.calls > calls

    # an explicit folder
    compute_lengths(ds, tokenizer, messages_column="messages", cache=tmp_path / "mine")
    assert len(list((tmp_path / "mine").glob("lengths-*.npy"))) == 1


def test_parallel_map_gives_the_same_lengths(tokenizer):
    texts = _corpus(400, seed=6)
    ds = datasets.Dataset.from_dict({"text": texts})
    serial = compute_lengths(ds, tokenizer, cache=False, batch_size=50)
    parallel = compute_lengths(ds, tokenizer, cache=False, num_proc=2, batch_size=50)
    assert np.array_equal(serial, parallel)


def test_errors(tokenizer, raw_tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["a b", "c"], "messages": [
        [{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]})
    with pytest.raises(TypeError, match=r"pass one split, e.g. dataset\['train'\]"):
        compute_lengths(datasets.DatasetDict({"train": ds, "test": ds}))
    with pytest.raises(TypeError, match="IterableDataset"):
        compute_lengths(ds.to_iterable_dataset())
    with pytest.raises(TypeError, match="expected a datasets.Dataset"):
        compute_lengths([[1, 2], [3]])
    with pytest.raises(KeyError, match="no column 'body'"):
        compute_lengths(ds, tokenizer, column="body")
    with pytest.raises(ValueError, match="pass a tokenizer"):
        compute_lengths(ds, column="text")
    with pytest.raises(ValueError, match="cannot tell which column"):
        compute_lengths(ds)
    with pytest.raises(ValueError, match="not both"):
        compute_lengths(ds, tokenizer, column="text", messages_column="messages")
    with pytest.raises(TypeError, match="not chat"):
        compute_lengths(ds, tokenizer, messages_column="text")
    with pytest.raises(TypeError, match="no apply_chat_template"):
        compute_lengths(ds, raw_tokenizer, messages_column="messages")
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        compute_lengths(ds, tokenizer, messages_column="messages")
    with pytest.raises(TypeError, match="where text was expected"):
        compute_lengths(datasets.Dataset.from_dict({"text": ["a", None]}), tokenizer,
                        column="text", cache=False)
    with pytest.raises(TypeError, match="has type"):
        compute_lengths(datasets.Dataset.from_dict({"flag": [[True], [False]]}), column="flag")


def test_module_import_stays_light():
    code = ("import sys, lengthwise.hf.lengths, lengthwise.pytorch.calibrate; "
            "bad = {'torch', 'datasets', 'transformers'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_parallel_map_leaves_os_environ_the_same_object(tokenizer, monkeypatch):
    """``Dataset.map(num_proc=...)`` swaps ``os.environ`` for a copy; compute_lengths puts the
    real one back, so a variable set before (here by monkeypatch) is undone after the test."""
    environ = os.environ
    monkeypatch.setenv("LENGTHWISE_PROBE_VARIABLE", "1")
    ds = datasets.Dataset.from_dict({"text": _corpus(40, seed=2)})
    compute_lengths(ds, tokenizer, cache=False, num_proc=2, batch_size=10)
    assert os.environ is environ
    assert os.environ["LENGTHWISE_PROBE_VARIABLE"] == "1" == os.getenv("LENGTHWISE_PROBE_VARIABLE")
