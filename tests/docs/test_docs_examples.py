"""The ```python blocks of the README and docs/*.md run, in order, on real data.

Each file's blocks share one namespace, as a reader's session would. The names the
blocks take as given are real objects: ``train.parquet`` / ``data.parquet`` with a
``num_tokens`` column (a sample of the bundled ``sft_mix`` with its longest samples),
``dataset`` (a ``datasets.Dataset`` of samples of exactly those lengths, untruncated),
``tok``/``tokenizer`` (a word-level tokenizer with a pad token), ``model`` (a small
torch language model that records the largest micro-batch it was given),
``training_args``, ``accelerator`` and ``optimizer``. docs/training.md's loop needs
nothing given; docs/dflash.md's takes ``PATH`` (a tiny Llama and a word-level
tokenizer saved with ``save_pretrained``), ``lengths`` and ``sample`` as given, and runs
on the CPU at toy size through the replacements of :data:`ON_CPU`. A block whose optional
dependency is missing skips the rest of its file; a block right after a
``<!-- docs-test: skip (reason) -->`` line is not run (the reason says why).
"""

from __future__ import annotations

import re
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ["README.md", "docs/first-ten-minutes.md", "docs/pytorch.md", "docs/training.md",
         "docs/dflash.md"]
#: a block written for a GPU and a long run, made to run on the CPU at toy size: each
#: ``(text, replacement)``; every text must occur in the file's blocks
ON_CPU = {
    "docs/dflash.md": [(".cuda()", ""), ('"cuda"', '"cpu"'), ("steps=20_000", "steps=3"),
                       ("max_tokens=16384", "max_tokens=512"), ("max_len=8192", "max_len=64"),
                       ("num_anchors=512", "num_anchors=4")],
}
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
    assert len(python_blocks(ROOT / "README.md")) >= 1
    blocks = python_blocks(ROOT / "docs/pytorch.md")
    assert len(blocks) >= 6
    skipped = [b for b in blocks if b[2] is not None]
    assert len(skipped) <= 2  # only what cannot run on a CPU
    for name in FILES:  # every file runs at least one block
        assert any(skip is None for _, _, skip in python_blocks(ROOT / name)), name
    for name, swaps in ON_CPU.items():
        code = "".join(c for _, c, _ in python_blocks(ROOT / name))
        assert all(text in code for text, _ in swaps), name


def _on_cpu(name: str, code: str) -> str:
    for text, replacement in ON_CPU.get(name, []):
        code = code.replace(text, replacement)
    return code


def _lengths() -> np.ndarray:
    from lengthwise import load_lengths

    raw = load_lengths("sft_mix")
    rng = np.random.default_rng(0)
    longest = np.argsort(raw)[-12:]  # samples over max_len and over the budget
    picked = np.concatenate((rng.choice(raw.size, 1500, replace=False), longest))
    return raw[np.unique(picked)]


def _dflash_namespace(tmp_path: Path) -> dict:
    """A tiny saved target (``PATH``), lengths and samples with the prompt masked."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=6, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "target")
    from tokenizers import Tokenizer, models

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(
        tmp_path / "target")  # no mask token: the docs add one
    lengths = np.random.default_rng(0).integers(8, 60, 120)

    def sample(i):
        ids = np.random.default_rng(int(i)).integers(0, 64, int(lengths[i])).tolist()
        return {"input_ids": ids, "labels": [-100] * 4 + ids[4:]}

    return dict(__name__="__docs__", PATH=str(tmp_path / "target"), lengths=lengths,
                sample=sample)


def _check(name: str, ns: dict, tmp_path: Path) -> None:
    """What the blocks of ``name`` must have done."""
    if name in ("README.md", "docs/pytorch.md"):
        # every micro-batch the model saw was inside the budget, and the blocks fed it
        assert 0 < ns["model"].largest <= BUDGET
    if name == "docs/first-ten-minutes.md":  # one rank's micro-batches of the planned epoch
        assert ns["plan"].stats["padding_efficiency"] > 0.5 and ns["batch"].size > 0
    if name == "docs/pytorch.md":
        assert SimpleNamespace(**ns).trainer.state.global_step == 3
        assert ns["lit_trainer"].current_epoch == ns["num_epochs"]  # Lightning ran its epochs
    if name == "docs/training.md":
        assert ns["step"] == 30 and ns["ckpt"].latest().name == "step_30"
        log = (ns["run_dir"] / "train_log.jsonl").read_text().splitlines()
        assert sum('"event"' not in line for line in log) == 30
    if name == "docs/dflash.md":
        assert ns["loop"].done
        log = (tmp_path / "runs/draft/train_log.jsonl").read_text().splitlines()
        assert sum('"event"' not in line for line in log) == 3
        assert ns["mask"].id == 64 and ns["served"].config.mask_token_id == 64


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

        ns["accelerator"] = accelerate.Accelerator(cpu=not torch.accelerator.is_available())
    except ImportError:
        pass
    return ns


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_python_blocks_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # mkdtemp() in a block
    if name in ("README.md", "docs/first-ten-minutes.md", "docs/pytorch.md"):
        ns = _namespace(tmp_path)
    elif name == "docs/dflash.md":
        ns = _dflash_namespace(tmp_path)
    else:
        ns = {"__name__": "__docs__"}
    blocks = python_blocks(ROOT / name)
    ran = 0
    for line, code, skip in blocks:
        if skip is not None:
            ran += 1
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the data are truncated on purpose
            try:
                exec(compile(_on_cpu(name, code), f"{name}, line {line}", "exec"), ns)
            except ImportError as exc:
                pytest.skip(f"{name}, line {line} needs {exc.name}")
        ran += 1
    assert ran == len(blocks)
    _check(name, ns, tmp_path)


@pytest.mark.parametrize("name", ["StepLogger", "Checkpointer", "SpikeGuard"])
def test_documented_signatures_match(name):
    """docs/training.md's signature listings (not run) name the real parameters and defaults."""
    import ast
    import inspect

    train = pytest.importorskip("lengthwise.train")
    code = "".join(c for _, c, skip in python_blocks(ROOT / "docs/training.md") if skip)
    match = re.search(rf"\b{name}\((.*?)\)\n", code, flags=re.S)
    assert match, f"no {name}(...) listing in docs/training.md"
    documented = ast.parse(f"def f({match.group(1)}): pass").body[0].args
    real = [p for p in inspect.signature(getattr(train, name)).parameters.values()]
    args = documented.args + documented.kwonlyargs
    assert [a.arg for a in args] == [p.name for p in real]
    assert len(documented.kwonlyargs) == sum(p.kind is p.KEYWORD_ONLY for p in real)
    positional = [a.arg for a in documented.args][len(documented.args) - len(documented.defaults):]
    defaults = dict(zip(positional, documented.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(documented.kwonlyargs, documented.kw_defaults,
                                              strict=True) if d is not None})
    for p in real:
        if p.default is not p.empty:
            assert ast.literal_eval(defaults[p.name]) == p.default, p.name
