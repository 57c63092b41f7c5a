"""The frozen target model: embedding, LM head and context features, on the fly.

:class:`Target` wraps a Hugging Face causal LM (any model returning
``hidden_states`` with ``output_hidden_states=True``). It freezes the model,
and in one forward returns the logits and the context features the draft reads:
the hidden states after the chosen layers, concatenated along the hidden axis.
Features are computed in the training process, on the same micro-batches as
the draft, so padding costs the target's compute too.

Example::

    >>> import torch, transformers
    >>> cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=4,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[1, 2])
    >>> logits, feats = target.forward(torch.tensor([[1, 2, 3]]))
    >>> tuple(logits.shape), tuple(feats.shape)
    ((1, 3, 50), (1, 3, 32))
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lengthwise.errors import ConfigError, DataError
from lengthwise.progress import no_transformers_bars

__all__ = ["TOKENIZER_FILES", "WEIGHT_DTYPES", "Target", "check_builtin_model", "check_causal_lm",
           "load_target", "load_tokenizer", "max_positions", "past_positions", "stop_set",
           "weights_dtype"]

#: dtype names ``--dtype`` takes for the target's and draft's weights, and torch's dtype each is
WEIGHT_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def stop_set(eos: int | Collection[int] | None) -> frozenset[int]:
    """Stop token ids as a set (``None``: no stop token).

    Example::

        >>> sorted(stop_set(3)), sorted(stop_set([4, 2])), stop_set(None)
        ([3], [2, 4], frozenset())
    """
    if eos is None:
        return frozenset()
    if isinstance(eos, int):
        return frozenset([eos])
    return frozenset(int(t) for t in eos)


class Target:
    """A frozen causal LM that supplies embeddings, logits and context features."""

    def __init__(self, model: Any, layers: list[int]) -> None:
        n = model.config.num_hidden_layers
        bad = [i for i in layers if not 0 <= i < n]
        if bad or not layers:
            raise ConfigError(f"target layers {list(layers)} must be in [0, {n}) and not empty")
        self.model = model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.layers = [int(i) for i in layers]
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.base = getattr(model, getattr(model, "base_model_prefix", ""), None)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(b, T, V)`` and features ``(b, T, len(layers) * H)`` of one forward."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, output_hidden_states=True, use_cache=False)
        feats = torch.cat([out.hidden_states[i + 1] for i in self.layers], dim=-1)
        return out.logits, feats

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Features only: the decoder stack without the LM head (what training needs)."""
        return self.features_and_output(input_ids, attention_mask=attention_mask,
                                        position_ids=position_ids)[0]

    @torch.no_grad()
    def features_and_output(self, input_ids: torch.Tensor, *,
                            attention_mask: torch.Tensor | None = None,
                            position_ids: torch.Tensor | None = None,
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and the final hidden states ``(b, T, H)`` (what the LM head reads), no logits.

        The LM head applied to the final hidden state at ``t`` gives the target's
        distribution of the token at ``t + 1``, for the positions that need it only.
        """
        if self.base is None:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, output_hidden_states=True,
                             use_cache=False)
        else:
            out = self.base(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, output_hidden_states=True,
                            use_cache=False)
        feats = torch.cat([out.hidden_states[i + 1] for i in self.layers], dim=-1)
        last = getattr(out, "last_hidden_state", None)
        return feats, out.hidden_states[-1] if last is None else last

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_new_tokens: int,
               eos: int | Collection[int] | None = None) -> list[int]:
        """The target's own greedy continuation of ``prompt`` (one forward per token).

        Example::

            >>> import transformers
            >>> cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16,
            ...     num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
            >>> t = Target(transformers.LlamaForCausalLM(cfg), layers=[0])
            >>> len(t.greedy([1, 2, 3], 5))
            5
        """
        stops = stop_set(eos)
        seq = list(prompt)
        for _ in range(max_new_tokens):
            ids = torch.tensor([seq], device=self.device)
            nxt = int(self.model(input_ids=ids, use_cache=False).logits[0, -1].argmax())
            seq.append(nxt)
            if nxt in stops:
                break
        return seq[len(prompt):]


def weights_dtype(name: str | torch.dtype | None, device: Any = None) -> torch.dtype | str:
    """The dtype to load weights in: ``name``, else float32 on CPU and the checkpoint's on CUDA.

    The checkpoint's own dtype (``"auto"``) is often bfloat16, which runs about ten
    times slower than float32 on CPUs without bfloat16 instructions.

    Example::

        >>> weights_dtype(None, "cpu"), weights_dtype("bf16", "cpu"), weights_dtype(None, "cuda")
        (torch.float32, torch.bfloat16, 'auto')
    """
    if isinstance(name, torch.dtype):
        return name
    if name is None:
        kind = torch.device(device).type if device is not None else "cpu"
        return "auto" if kind == "cuda" else torch.float32
    if name not in WEIGHT_DTYPES:
        raise ConfigError(f"--dtype must be one of float32, bfloat16, float16, got {name!r}")
    return WEIGHT_DTYPES[name]


def check_builtin_model(folder: str | Path, config: dict[str, Any]) -> None:
    """Refuse a target folder whose ``config.json`` (``config``) only the folder's own code reads.

    A ``model_type`` transformers implements is loaded with transformers' class (an
    ``auto_map`` beside it is not followed); any other would need ``trust_remote_code``,
    which lengthwise never passes: refused here, naming the code its ``auto_map`` points to,
    before anything of the folder is loaded.
    """
    import transformers

    kind = config.get("model_type")
    code = config.get("auto_map")
    if (isinstance(kind, str) and kind in transformers.CONFIG_MAPPING) or not (kind or code):
        return
    said = (f"--target {folder}: config.json's model_type {kind!r} is not one transformers "
            f"{transformers.__version__} implements")
    if isinstance(code, dict) and code:
        names = sorted({str(v if isinstance(v, str) else next(iter(v), None))
                        for v in code.values()})
        said += (f", and its auto_map points to code in the folder ({', '.join(names)}); "
                 "lengthwise never runs a model folder's own code")
    raise ConfigError(said)


def check_causal_lm(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a local target folder, refused unless it names a causal LM.

    Example::

        >>> try:
        ...     check_causal_lm("/nonexistent")
        ... except ConfigError as exc:
        ...     print(exc)
        --target /nonexistent: not a local Hugging Face model folder (no config.json there)
    """
    path = Path(path)
    file = path / "config.json"
    if not file.is_file():
        raise ConfigError(f"--target {path}: not a local Hugging Face model folder "
                          "(no config.json there)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--target {file}: not JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--target {file}: not a model config (a JSON object)")
    check_builtin_model(path, config)
    archs = config.get("architectures") or []
    if archs and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        raise ConfigError(f"--target {path}: not a causal language model (architectures "
                          f"{archs}); DFlash needs the target's LM head")
    return config


def max_positions(config: Any) -> int | None:
    """The target's ``max_position_embeddings``: of a config object or ``config.json``'s dict.

    A multimodal config's ``text_config`` is read where the top level has none; ``None``
    where neither says.

    Example::

        >>> max_positions({"text_config": {"max_position_embeddings": 4096}}), max_positions({})
        (4096, None)
    """
    def get(key: str) -> Any:
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    value = get("max_position_embeddings")
    if value is None and get("text_config") is not None:
        return max_positions(get("text_config"))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def past_positions(lengths: Sequence[int] | np.ndarray, limit: int | None, *, what: str,
                   advice: str) -> str | None:
    """A note counting the ``lengths`` over ``limit`` positions, or ``None`` when none is.

    A target attends over at most ``max_position_embeddings`` positions it was trained on;
    ``dflash prepare`` keeps longer samples whole unless ``--max-len`` cuts them, and ``dflash
    eval`` decodes past them if a prompt and its new tokens run that far. Neither is an
    error, but both are said, in this one-line note.

    Example::

        >>> limit = max_positions({"max_position_embeddings": 512})
        >>> past_positions([100, 600, 2013], limit, what="samples", advice="give --max-len 512")
        "2 of 3 samples are longer than the target's 512 positions (max_position_embeddings; the \
longest has 2,013 tokens): give --max-len 512"
        >>> past_positions([100], limit, what="samples", advice="") is None
        True
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if limit is None or lengths.size == 0:
        return None
    over = int((lengths > limit).sum())
    if not over:
        return None
    return (f"{over} of {lengths.size} {what} are longer than the target's {limit} positions "
            f"(max_position_embeddings; the longest has {int(lengths.max()):,} tokens): "
            f"{advice}")


#: files that hold a Hugging Face tokenizer's vocabulary (a folder needs one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.tiktoken")


def load_tokenizer(target: str | Path) -> Any:
    """The tokenizer saved in the local model folder ``target`` (a causal LM, checked first).

    A folder without a usable tokenizer is a :class:`ConfigError` naming it; nothing is
    looked up on a hub.
    """
    import transformers

    check_causal_lm(target)
    if not any((Path(target) / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"--target {target}: no tokenizer files there (none of "
                          f"{', '.join(TOKENIZER_FILES)}); save the target's tokenizer "
                          "into the folder (tokenizer.save_pretrained)")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(target), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"--target {target}: no usable tokenizer there "
                          f"({' '.join(str(exc).split())[:200]})") from None
    if len(tok) < 2:
        raise ConfigError(f"--target {target}: the tokenizer there is empty ({len(tok)} "
                          "tokens)")
    return tok


def load_target(path: str | Path, *, dtype: str | torch.dtype | None = None,
                device: Any = None) -> Any:
    """A local Hugging Face causal LM checkpoint (``config.json`` + weights), nothing downloaded.

    ``dtype``: a name of :data:`WEIGHT_DTYPES` or a torch dtype; ``None``: float32 on
    CPU, the checkpoint's own dtype on CUDA (:func:`weights_dtype`).
    """
    import transformers

    path = Path(path)
    if not (path / "config.json").is_file():
        raise DataError(f"--target {path}: not a local Hugging Face checkpoint "
                        "(no config.json there)")

    check_causal_lm(path)  # no code of the folder's own

    _check_device(device)
    try:  # transformers reads .bin weights with torch.load(weights_only=True)
        with no_transformers_bars():  # the command's own lines are its stderr
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), dtype=weights_dtype(dtype, device), local_files_only=True)
    except pickle.UnpicklingError:
        names = sorted(p.name for p in path.glob("*.bin")) or ["its weights"]
        raise DataError(f"--target {path}: {', '.join(names)} holds objects other than tensors; "
                        "refused, not loaded (save the target with safetensors)") from None
    except weight_errors() as exc:
        raise DataError(f"--target {path}: its weights cannot be read, a file is damaged or "
                        f"cut short ({' '.join(str(exc).split())[:200]})") from None
    return model.to(device) if device is not None else model


def weight_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged weights file raises (safetensors' own error, a cut file)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - an older safetensors
        return (EOFError,)
    return (SafetensorError, EOFError)


def _check_device(device: Any) -> None:
    """Refuse a CUDA device where torch sees none (before any weights are read)."""

    if device is not None and torch.device(device).type == "cuda" and (
            not torch.cuda.is_available()):
        raise ConfigError(f"--device {device}: torch sees no CUDA device here (torch "
                          f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'})")
