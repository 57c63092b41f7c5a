"""The peak memory of a DFlash training step: predicted against measured on CPU, and at scale.

``lengthwise dflash estimate`` (:func:`lengthwise.dflash.memory.estimate_step`)
traces one training step under fake tensors. This script checks it against the
real step on CPU at a few small shapes (``--measure``, one shape per process: the
measured peak is the high-water resident set above the one before the step, with
every large buffer in fresh mapped memory) and prints the estimate at the reference
shape: a Qwen3-8B target (its ``config.json`` only), 16,384-token micro-batches,
512 anchors, block 16, 32,768 slots, bf16, on one GPU and on each of 8 DDP ranks.
With ``--docs`` it rewrites the ``dflash-estimate`` region of ``docs/dflash.md``::

    python benchmarks/memory_estimate.py --docs     # the table and the reference figures
    python benchmarks/memory_estimate.py --measure '{"target": [...], "run": {...}}'
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

    from lengthwise.dflash.memory import estimate_step, step_blocks, step_shape
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.recipe import new_draft
    from lengthwise.dflash.target import Target
    from lengthwise.dflash.train import DFlashTask, DFlashTrainConfig
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
    from lengthwise.dflash.memory import estimate_step

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


def write_docs(table: list[str], ref: list[str], kv: list[str]) -> None:
    """Rewrite the ``dflash-estimate`` region of ``docs/dflash.md``."""
    body = ["```", *ref, "```", "", *kv, "",
            "Predicted against measured on CPU (the peak one training step adds to the weights "
            "and optimizer state held before it; measured: resident high-water mark, "
            "`python benchmarks/memory_estimate.py`):", "", *table]
    text = DOCS.read_text(encoding="utf-8")
    pattern = re.compile(r"(<!-- figures:dflash-estimate start -->\n).*?"
                         r"(<!-- figures:dflash-estimate end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOCS}: no dflash-estimate region")
    DOCS.write_text(pattern.sub(lambda m: m.group(1) + "\n".join(body) + "\n" + m.group(2),
                                text), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measure", metavar="JSON", help="one shape, in this process")
    p.add_argument("--docs", action="store_true", help="rewrite the region of docs/dflash.md")
    args = p.parse_args(argv)
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
