"""The ```python blocks of the README and docs/pytorch.md run, in order, on real data.

Each file's blocks share one namespace, as a reader's session would. The names the
blocks take as given are real objects: ``train.parquet`` / ``data.parquet`` with a
``num_tokens`` column (a sample of the bundled ``sft_mix`` with its longest samples),
``dataset`` (a ``datasets.Dataset`` of samples of exactly those lengths, untruncated),
``tok``/``tokenizer`` (a word-level tokenizer with a pad token), ``model`` (a small
torch language model that records the largest micro-batch it was given),
``training_args``, ``accelerator`` and ``optimizer``. A block whose optional
dependency is missing skips the rest of its file; a block right after a
``<!-- docs-test: skip (reason) -->`` line is not run (the reason says why).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ["README.md", "docs/pytorch.md"]
#: the largest budget of a micro-batch the model is fed in these files
BUDGET = 16384


#: a block right after this comment is not run; the comment says why
SKIP = re.compile(r"<!-- docs-test: skip \((.+?)\) -->\s*$")


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, reason to skip or None)`` of every ```python block of a Markdown file."""
    text = path.read_text()
    out = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        skip = SKIP.search(text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1] + "\n")
        out.append((text[: match.start()].count("\n") + 2, match.group(1),
                    skip.group(1) if skip else None))
    return out


def test_blocks_are_found():
    assert len(python_blocks(ROOT / "README.md")) >= 2
    blocks = python_blocks(ROOT / "docs/pytorch.md")
    assert len(blocks) >= 6
    skipped = [b for b in blocks if b[2] is not None]
    assert len(skipped) <= 1  # only what cannot run on a CPU


def _lengths() -> np.ndarray:
    from lengthwise import load_lengths

    raw = load_lengths("sft_mix")
    rng = np.random.default_rng(0)
    longest = np.argsort(raw)[-12:]  # samples over max_len and over the budget
    picked = np.concatenate((rng.choice(raw.size, 1500, replace=False), longest))
    return raw[np.unique(picked)]


def _namespace(tmp_path: Path) -> dict:
    torch = pytest.importorskip("torch")
    datasets = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import CausalLMOutput

    lengths = _lengths()
    for name in ("train.parquet", "data.parquet"):
        pq.write_table(pa.table({"num_tokens": lengths}), tmp_path / name)
    rng = np.random.default_rng(1)
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [rng.integers(2, 60, n).astype(np.int32) for n in lengths]})
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, 60)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]",
                                               unk_token="[UNK]")

    class TinyLM(torch.nn.Module):
        """Embedding -> linear next-token model; records the largest micro-batch."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 8)
            self.head = torch.nn.Linear(8, 64)
            self.largest = 0

        def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
            self.largest = max(self.largest, input_ids.numel())
            logits = self.head(self.embed(input_ids))
            labels = input_ids if labels is None else labels
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, 64), labels[:, 1:].reshape(-1), ignore_index=-100)
            return CausalLMOutput(loss=loss, logits=logits)

    model = TinyLM()
    ns = dict(__name__="__docs__", dataset=dataset, tok=tok, tokenizer=tok, model=model,
              epochs=1, num_epochs=1,
              optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    ns["training_args"] = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=3, use_cpu=True, report_to=[],
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0)
    try:
        import accelerate

        ns["accelerator"] = accelerate.Accelerator(cpu=True)
    except ImportError:
        pass
    return ns


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_python_blocks_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    ns = _namespace(tmp_path)
    blocks = python_blocks(ROOT / name)
    ran = 0
    for line, code, skip in blocks:
        if skip is not None:
            ran += 1
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the data are truncated on purpose
            try:
                exec(compile(code, f"{name}, line {line}", "exec"), ns)
            except ImportError as exc:
                pytest.skip(f"{name}, line {line} needs {exc.name}")
        ran += 1
    assert ran == len(blocks)
    # every micro-batch the model saw was inside the budget, and the blocks fed it
    assert 0 < ns["model"].largest <= BUDGET
    if name == "docs/pytorch.md":
        assert SimpleNamespace(**ns).trainer.state.global_step == 3
