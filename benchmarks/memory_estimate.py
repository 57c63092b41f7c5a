"""The peak memory of a DFlash training step: predicted against measured on CPU, and at scale.

``lengthwise dflash estimate`` (:func:`lengthwise.dflash.cost.memory.estimate_step`)
traces one training step under fake tensors. This script checks it against the
real step on CPU at a few small shapes (``--measure``, one shape per process: the
measured peak is the high-water resident set above the one before the step, with
every large buffer in fresh mapped memory) and prints the estimate at the reference
shape: a Qwen3-8B target (its ``config.json`` only), 16,384-token micro-batches,
512 anchors, block 16, 32,768 slots, bf16, on one GPU and on each of 8 DDP ranks.
With ``--docs`` it rewrites the ``dflash-estimate`` region of ``docs/dflash.md``::

    python benchmarks/memory_estimate.py --docs     # the table and the reference figures
    python benchmarks/memory_estimate.py --measure '{"target": [...], "run": {...}}'

With ``--real-target PATH`` it checks the whole-process estimate of each stage
(``dflash estimate --stage train|regenerate|eval``, :mod:`lengthwise.dflash.cost.memory`)
against the real command on that target, on CPU in float32, at three shapes a stage
(:data:`STAGE_SHAPES`): each command runs in its own process on a small chat set made
from the OpenAI evals registry wheel (``--wheel``; its user turns are the texts), and the
peak resident memory of its own process is read (``command_peak``, not this runner's);
with ``--docs`` the table goes into the ``dflash-stage-memory`` region. ``--render`` writes
that region's text again around the table it holds (the committed figures), running nothing::

    python benchmarks/memory_estimate.py --real-target ./SmolLM2-135M-Instruct \\
        --wheel evals-3.0.1.post1-py3-none-any.whl --docs
    python benchmarks/memory_estimate.py --render
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "dflash.md"
#: Qwen3-8B's sizes (what its config.json holds)
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=12288, max_position_embeddings=40960, rope_theta=1e6,
                tie_word_embeddings=False, rms_norm_eps=1e-6)
#: the reference commands: one GPU with the defaults of ``dflash train``, then a rank of 8
REFERENCE = [["--device-memory", "h200"],
             ["--world", "8", "--grad-accum", "4", "--device-memory", "h100-80g"]]
#: CPU shapes: target (hidden, layers, heads, kv heads, intermediate, vocabulary), run settings
SHAPES = [
    {"target": [128, 4, 4, 2, 256, 8192],
     "run": {"max_tokens": 1024, "max_len": 1024, "block_size": 8, "max_slots": 2048,
             "head_chunk": 256, "draft_layers": 1, "grad_accum": 1}},
    {"target": [128, 4, 4, 2, 256, 8192],
     "run": {"max_tokens": 1024, "max_len": 1024, "block_size": 16, "max_slots": 2048,
             "head_chunk": 256, "draft_layers": 2, "grad_accum": 2}},
    {"target": [64, 4, 4, 2, 128, 32000],
     "run": {"max_tokens": 512, "max_len": 256, "block_size": 4, "head_chunk": 128,
             "draft_layers": 1, "grad_accum": 1}, "rows": 2},
]


def status_bytes(key: str) -> int:
    """A size of this process in ``/proc/self/status`` (``VmRSS:``, ``VmHWM:``), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_high_water() -> int:
    """Reset the resident high-water mark to the resident set now (Linux); that size."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current resident set
    return status_bytes("VmRSS:")


def measure(shape: dict) -> dict:
    """Predicted and measured bytes one training step adds at its peak, in this process.

    The prediction is traced first (fake tensors, nothing real exists yet); then the
    step runs for real as the training loop runs it (``DFlashTask.forward``, backward,
    clipping, AdamW, ``zero_grad``), twice: the second one is measured.
    """
    import torch
    import transformers

    from lengthwise.dflash.cost.memory import estimate_step, step_blocks, step_shape
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.recipe import new_draft
    from lengthwise.dflash.target import Target
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.dflash.train_config import DFlashTrainConfig
    from lengthwise.train.device import autocast_dtype

    torch.set_num_threads(1)
    h, layers, heads, kv, inter, vocab = shape["target"]
    tcfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv,
                                    head_dim=h // heads, intermediate_size=inter,
                                    tie_word_embeddings=False, use_cache=False)
    cfg = DFlashTrainConfig(steps=2, device="cpu", progress=False, warmup=0, **shape["run"])
    rows = shape.get("rows", 1)
    est = estimate_step(tcfg, cfg, rows=rows)

    torch.manual_seed(0)
    target = Target(transformers.AutoModelForCausalLM.from_config(tcfg),
                    layers=target_layer_ids(layers, cfg.num_features or cfg.draft_layers))
    draft = new_draft(target, cfg, mask_token_id=vocab - 1)
    task = DFlashTask(draft, target, cfg, order="stratified",
                      amp=autocast_dtype(cfg.dtype, "cpu"))
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=cfg.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    tokens, per_row = step_shape(cfg, rows)
    micro = [step_blocks(rows, tokens, per_row, cfg.block_size, vocab)
             for _ in range(min(cfg.grad_accum, 2))]

    def step() -> None:
        for b in micro:
            out = task.forward(draft, b)
            (out.loss * (1.0 / out.norm)).backward()
            del out
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's state and torch's one-time allocations
    base = reset_high_water()
    step()
    measured = status_bytes("VmHWM:") - base
    return {"predicted": est.step_peak, "measured": measured, "slots": est.slots,
            "tokens": est.tokens}


def measure_in_subprocess(shape: dict) -> dict:
    """:func:`measure` in a fresh process whose large buffers are each mapped (Linux)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--measure", json.dumps(shape)], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _label(shape: dict) -> str:
    h, layers, _, _, _, vocab = shape["target"]
    r = shape["run"]
    return (f"hidden {h}, vocab {vocab}, {r['max_tokens']} tokens x {shape.get('rows', 1)} "
            f"row(s), block {r['block_size']}, {r['draft_layers']} draft layer(s), "
            f"grad_accum {r['grad_accum']}, head chunk {r['head_chunk']}")


def validation_table() -> list[str]:
    """The markdown table of predicted against measured step peaks at :data:`SHAPES`."""
    lines = ["| CPU shape | slots | predicted MiB | measured MiB | error |",
             "|---|---:|---:|---:|---:|"]
    for shape in SHAPES:
        got = measure_in_subprocess(shape)
        err = (got["predicted"] - got["measured"]) / got["measured"]
        lines.append(f"| {_label(shape)} | {got['slots']} | {got['predicted'] / 2**20:.1f} | "
                     f"{got['measured'] / 2**20:.1f} | {100 * err:+.1f} % |")
    return lines


def reference() -> list[str]:
    """The output of ``lengthwise dflash estimate`` at the reference shape, with its command."""
    import transformers

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "Qwen3-8B"
        transformers.Qwen3Config(**QWEN3_8B).save_pretrained(folder)  # config.json only
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        for flags in REFERENCE:
            cmd = ["lengthwise", "dflash", "estimate", "--target", "Qwen3-8B", *flags]
            proc = subprocess.run([sys.executable, "-m", "lengthwise", *cmd[1:]], env=env,
                                  cwd=tmp, capture_output=True, text=True, timeout=1800)
            if proc.returncode not in (0, 1):  # 1: it does not fit
                raise RuntimeError(proc.stderr[-3000:])
            out += ["$ " + " ".join(cmd), *proc.stdout.rstrip().splitlines()]
    return out


def context_conversion() -> list[str]:
    """The reference peak with the draft's ``[context | block]`` converted to bf16 once for the
    key and value projections (as it is), and once per projection (as autocast alone does)."""
    import transformers

    import lengthwise.dflash.model as model
    from lengthwise.cli.dflash.train import settings
    from lengthwise.dflash.cost.memory import estimate_step

    target = transformers.Qwen3Config(**QWEN3_8B)
    cfg = settings({"target": "Qwen3-8B"}, defaults={"device": "cuda"}, estimate=True)[0]
    once = estimate_step(target, cfg).peak
    saved, model._autocast_once = model._autocast_once, lambda x: x
    try:
        twice = estimate_step(target, cfg).peak
    finally:
        model._autocast_once = saved
    return [f"The draft's key and value projections read one bf16 copy of `[context | block]` "
            f"(autocast alone makes one per projection and keeps both for the backward): "
            f"{twice / 2**30:.1f} GiB -> {once / 2**30:.1f} GiB at the first command's shape "
            f"({(twice - once) / 2**30:.2f} GiB less)."]


def _docs_figures():
    """The marked-region functions of ``benchmarks/docs_figures.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_figures",
                                                  Path(__file__).with_name("docs_figures.py"))
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    return figures


def write_region(name: str, body: list[str]) -> None:
    """Put the lines ``body`` into region ``name`` of ``docs/dflash.md`` (the marked-region
    writer of ``benchmarks/docs_figures.py``)."""
    _docs_figures().rewrite_regions({DOCS.relative_to(ROOT).as_posix(): (name,)},
                                    lambda _: "\n".join(body), ROOT)


#: the first sentence of a real-target region, read back by ``--render``
ABOUT = re.compile(r"Real target: (?P<name>.+?) \((?P<layers>\d+) layers, hidden (?P<hidden>\d+)"
                   r"(?:, vocabulary (?P<vocab>\d+))?\), CPU float32, one torch thread, "
                   r"(?P<machine>\S+) with (?P<cores>\d+) cores")


def about_target(name: str, layers: object, hidden: object, vocab: object, machine: str,
                 cores: object) -> str:
    """The sentence that names the real target and the machine (``vocab`` None: left out)."""
    size = f"{layers} layers, hidden {hidden}" + (f", vocabulary {vocab}" if vocab else "")
    return (f"Real target: {name} ({size}), CPU float32, one torch thread, {machine} with "
            f"{cores} cores.")


def about_config(target: Path, vocabulary: bool = True) -> str:
    """:func:`about_target` for the target folder ``target`` on this machine."""
    import platform

    cfg = json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))
    return about_target(cfg.get("_model_name_or_path", Path(target).name),
                        cfg["num_hidden_layers"], cfg["hidden_size"],
                        cfg["vocab_size"] if vocabulary else None, platform.machine(),
                        os.cpu_count())


def saved_region(name: str) -> tuple[str, str, list[str]]:
    """Region ``name`` of ``docs/dflash.md`` as it stands: its whole text, the
    :func:`about_target` sentence it opens with (as this script writes it now) and its table."""
    text = DOCS.read_text(encoding="utf-8")
    i, j = _docs_figures().region_text(text, name, DOCS.relative_to(ROOT).as_posix())
    body = text[i:j]
    found = ABOUT.search(body)
    if found is None:
        raise SystemExit(f"docs/dflash.md: region {name} names no real target")
    about = about_target(*found.group("name", "layers", "hidden", "vocab", "machine", "cores"))
    return body, about, [line for line in body.splitlines() if line.startswith("|")]


def write_docs(table: list[str], ref: list[str], kv: list[str]) -> None:
    """Rewrite the ``dflash-estimate`` region of ``docs/dflash.md``."""
    body = ["```", *ref, "```", "", *kv, "",
            "Predicted against measured on CPU (the peak one training step adds to the weights "
            "and optimizer state held before it; measured: resident high-water mark, "
            "`python benchmarks/memory_estimate.py`):", "", *table]
    write_region("dflash-estimate", body)


#: the real-target shapes of each stage: training (a few steps, the slot budget filled by
#: samples longer than a micro-batch), regeneration and evaluation (prompts all of
#: ``max_len`` tokens, the estimate's worst case)
STAGE_SHAPES: dict[str, list[dict[str, int]]] = {
    "train": [{"max_tokens": 1024, "block_size": 8, "draft_layers": 2, "num_anchors": 512},
              {"max_tokens": 2048, "block_size": 16, "draft_layers": 1, "num_anchors": 256},
              {"max_tokens": 512, "block_size": 4, "draft_layers": 3, "num_anchors": 256}],
    "regenerate": [{"batch_size": 16, "max_len": 256, "max_new_tokens": 32},
                   {"batch_size": 4, "max_len": 512, "max_new_tokens": 64},
                   {"batch_size": 8, "max_len": 128, "max_new_tokens": 32}],
    "eval": [{"batch_size": 4, "max_len": 256, "max_new_tokens": 32},
             {"batch_size": 8, "max_len": 128, "max_new_tokens": 32},
             {"batch_size": 2, "max_len": 512, "max_new_tokens": 16}],
}
#: the draft the eval shapes decode with: trained by the first train shape
EVAL_DRAFT = STAGE_SHAPES["train"][0]


def peak_of(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Run ``argv``; the peak resident bytes of its own process and its wall seconds."""
    import time

    from lengthwise.dflash.cost.resident import command_peak

    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        code, peak = command_peak(argv, env=env, stderr=err)
        if code:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv[:6])}: exit {code}\n"
                               f"{err.read().decode()[-3000:]}")
    return peak, time.perf_counter() - t


def _lengthwise(*args: object) -> list[str]:
    return [sys.executable, "-m", "lengthwise", *[str(a) for a in args]]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


#: what the user asks of each registry text: a copy, so that the target writes
#: ``max_new_tokens`` tokens (the estimate's worst case) rather than a short answer
COPY = "Repeat the following text word for word, without a comment:\n\n"


def fixed_prompts(tokenizer: object, texts: list[str], n: int, tokens: int) -> list[str]:
    """``n`` user texts (:data:`COPY` and registry text) whose chat-template prompts are
    ``tokens`` tokens long (or one less)."""
    out: list[str] = []
    pool = iter(texts * 50)
    while len(out) < n:
        ids: list[int] = []
        while len(ids) < 2 * tokens:
            ids += tokenizer.encode(next(pool) + "\n", add_special_tokens=False)
        k = tokens
        for _ in range(8):  # the template adds its own tokens: shorten until it fits
            text = COPY + tokenizer.decode(ids[:k])
            got = len(tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                return_dict=True)["input_ids"])
            if tokens - 1 <= got <= tokens:
                break
            k -= got - tokens
        out.append(text)
    return out


def real_data(target: Path, wheel: Path, work: Path) -> dict[str, Path]:
    """Training chats (long answers, from the registry's user turns) prepared for the target,
    and fixed-length prompt sets for regeneration and evaluation, under ``work``."""
    import transformers

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_target_dflash as real

    chats, _ = real.registry_chats(wheel, per_file=1, max_chars=1600)
    texts = [m["content"] for c in chats for m in c["messages"] if m["role"] == "user"]
    work.mkdir(parents=True, exist_ok=True)
    rows, k = [], 0
    for _ in range(24):  # answers of ~9,000 characters: every sample fills a micro-batch
        answer = ""
        while len(answer) < 9000:
            answer += texts[k % len(texts)] + "\n"
            k += 1
        rows.append({"messages": [{"role": "user", "content": texts[(7 * k) % len(texts)]},
                                  {"role": "assistant", "content": answer}]})
    real._jsonl(work / "long.jsonl", rows)
    prepared = work / "prepared"
    if not (prepared / "prepare.json").is_file():
        subprocess.run(_lengthwise("dflash", "prepare", work / "long.jsonl", "--target", target,
                                   "--out", prepared, "--min-supervised", 1, "--max-len", 4096,
                                   "--no-progress"), env=_env(), check=True,
                       stdout=subprocess.DEVNULL)
    tok = transformers.AutoTokenizer.from_pretrained(str(target), local_files_only=True)
    out = {"prepared": prepared}
    for stage in ("regenerate", "eval"):
        for shape in STAGE_SHAPES[stage]:
            n = shape["batch_size"] if stage == "regenerate" else max(8, shape["batch_size"])
            name = work / f"{stage}_{shape['max_len']}_{n}.jsonl"
            users = fixed_prompts(tok, texts, n, shape["max_len"])
            real._jsonl(name, [{"messages": [{"role": "user", "content": u}]} for u in users])
            out[f"{stage}_{shape['max_len']}"] = name
    return out


def stage_commands(stage: str, shape: dict[str, int], target: Path, data: dict[str, Path],
                   work: Path) -> tuple[list[str], list[str]]:
    """``(estimate, real command)`` argument lists of ``stage`` at ``shape``, CPU float32."""
    common = ["--target", target, "--device", "cpu"]
    if stage == "train":
        run = ["--max-tokens", shape["max_tokens"], "--block-size", shape["block_size"],
               "--draft-layers", shape["draft_layers"], "--num-anchors", shape["num_anchors"],
               "--max-slots", shape["num_anchors"] * shape["block_size"]]
        out = work / ("run_" + "_".join(str(v) for v in shape.values()))
        return (_lengthwise("dflash", "estimate", *common, *run, "--json"),
                _lengthwise("dflash", "train", *common, *run, "--data", data["prepared"],
                            "--out", out, "--steps", 2, "--checkpoint-every", 1,
                            "--eval-every", 0, "--eval-samples", 1, "--overwrite",
                            "--no-progress"))
    sizes = ["--batch-size", shape["batch_size"], "--max-new-tokens", shape["max_new_tokens"]]
    prompts = data[f"{stage}_{shape['max_len']}"]
    if stage == "regenerate":
        return (_lengthwise("dflash", "estimate", "--stage", "regenerate", *common, *sizes,
                            "--max-len", shape["max_len"], "--json"),
                _lengthwise("dflash", "prepare", prompts, "--target", target, "--device", "cpu",
                            "--out", work / f"regen_{shape['max_len']}", "--regenerate",
                            "--min-supervised", 1, *sizes, "--no-progress"))
    draft = work / ("run_" + "_".join(str(v) for v in EVAL_DRAFT.values()))
    return (_lengthwise("dflash", "estimate", "--stage", "eval", *common, *sizes,
                        "--max-len", shape["max_len"], "--block-size", EVAL_DRAFT["block_size"],
                        "--draft-layers", EVAL_DRAFT["draft_layers"], "--json"),
            _lengthwise("dflash", "eval", "--target", target, "--draft", draft,
                        "--prompts", prompts, "--temperatures", 0, *sizes, "--no-progress",
                        "--json"))


def real_target_table(target: Path, wheel: Path, work: Path) -> list[str]:
    """Predicted against measured peak resident memory of each stage at :data:`STAGE_SHAPES`."""
    import shutil

    data = real_data(target, wheel, work)
    lines = ["| stage | shape | predicted GiB | measured GiB | error | peak phase | "
             "estimate s | command s |", "|---|---|---:|---:|---:|---|---:|---:|"]
    for stage in ("train", "regenerate", "eval"):
        for shape in STAGE_SHAPES[stage]:
            estimate, command = stage_commands(stage, shape, target, data, work)
            if stage == "regenerate":
                shutil.rmtree(work / f"regen_{shape['max_len']}", ignore_errors=True)
            import time

            t = time.perf_counter()
            proc = subprocess.run(estimate, env=_env(), capture_output=True, text=True,
                                  check=True)
            est_s = time.perf_counter() - t
            pred = json.loads(proc.stdout)
            measured, wall = peak_of(command, _env())
            err = (pred["peak_bytes"] - measured) / measured
            label = ", ".join(f"{k} {v}" for k, v in shape.items())
            row = (f"| {stage} | {label} | {pred['peak_bytes'] / 2**30:.2f} | "
                   f"{measured / 2**30:.2f} | {100 * err:+.1f} % | {pred['phase']} | "
                   f"{est_s:.1f} | {wall:.0f} |")
            print(row, flush=True)
            lines.append(row)
    return lines


def stage_docs(about: str, table: list[str]) -> list[str]:
    """The lines of the ``dflash-stage-memory`` region: what was run and measured, then
    ``table``."""
    return [about, "",
            "Predicted: `dflash estimate --stage ... --device cpu`. Measured: the peak resident "
            "memory of the real command's own process, for each stage:", "",
            "- train: 2 steps with a checkpoint each;",
            "- regenerate: `dflash prepare --regenerate` of one batch;",
            "- eval: `dflash eval` at temperature 0 with the lossless check, the baseline and "
            "the accuracy pass.", "",
            "Written by `python benchmarks/memory_estimate.py --real-target PATH --docs`:", "",
            *table]


def write_stage_docs(table: list[str], target: Path) -> None:
    """Rewrite the ``dflash-stage-memory`` region of ``docs/dflash.md``."""
    write_region("dflash-stage-memory", stage_docs(about_config(target), table))


def render_stage_docs() -> None:
    """Rewrite the ``dflash-stage-memory`` region around the table it holds."""
    _, about, table = saved_region("dflash-stage-memory")
    write_region("dflash-stage-memory", stage_docs(about, table))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measure", metavar="JSON", help="one shape, in this process")
    p.add_argument("--docs", action="store_true", help="rewrite the region of docs/dflash.md")
    p.add_argument("--real-target", metavar="PATH",
                   help="check each stage's whole-process estimate on this target instead")
    p.add_argument("--wheel", metavar="WHL", default="/work/wheels/"
                   "evals-3.0.1.post1-py3-none-any.whl", help="the evals registry wheel")
    p.add_argument("--work", metavar="DIR", help="folder for the runs (default: a temporary one)")
    p.add_argument("--render", action="store_true",
                   help="rewrite the dflash-stage-memory region around its table; run nothing")
    args = p.parse_args(argv)
    if args.render:
        render_stage_docs()
        return
    if args.real_target:
        with tempfile.TemporaryDirectory() as tmp:
            table = real_target_table(Path(args.real_target), Path(args.wheel),
                                      Path(args.work or tmp))
        print("\n".join(table))
        if args.docs:
            write_stage_docs(table, Path(args.real_target))
        return
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return
    table = validation_table()
    ref = reference()
    kv = context_conversion()
    print("\n".join([*ref, "", *kv, "", *table]))
    if args.docs:
        write_docs(table, ref, kv)


if __name__ == "__main__":
    main()
