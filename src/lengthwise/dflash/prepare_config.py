"""The settings of ``lengthwise dflash prepare`` (no NumPy, Arrow or torch: its ``--help``)."""

from __future__ import annotations

from dataclasses import dataclass

from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_field
from lengthwise.train.config import check_positive

__all__ = ["BACKENDS", "OVERLONG", "TARGET_DTYPES", "PrepareConfig"]

OVERLONG = ("truncate", "drop")  # what happens to a sample over max_len
BACKENDS = ("auto", "hf", "vllm")  # engines of regeneration
TARGET_DTYPES = ("float32", "bfloat16", "float16")  # of the regenerating target


@dataclass
class PrepareConfig:
    """Settings of :func:`~lengthwise.dflash.prepare.prepare_chats`.

    Example::

        >>> PrepareConfig(min_supervised=0)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: min_supervised must be a positive integer, got 0
    """

    min_supervised: int = flag_field(32, "drop samples with fewer assistant tokens")
    max_len: int | None = flag_field(None, "longest sample in tokens", none="no limit", type=int)
    overlong: str = flag_field("truncate", "what to do with samples over --max-len",
                               choices=OVERLONG)
    enable_thinking: bool | None = flag_field(
        None, "the chat template's enable_thinking switch", none="the template's own", type=bool)
    field: str | None = flag_field(None, "row field holding the messages",
                                   none="messages or conversations", type=str)
    split: str = flag_field("train", "split of a datasets folder")
    shard_rows: int = flag_field(4096, "input rows per output shard (the unit of resuming)")
    regenerate: bool = flag_field(False, "replace every assistant turn by the target's own "
                                         "response")
    max_new_tokens: int = flag_field(512, "longest regenerated turn")
    temperature: float = flag_field(0.0, "regeneration temperature (0: greedy)")
    batch_size: int = flag_field(32, "most conversations regenerated together (raise it on a "
                                     "GPU)")
    max_tokens: int | None = flag_field(  # None (no flag gives it): no limit
        16384, "most rows times their widest prompt plus --max-new-tokens in regeneration; a "
        "longer conversation goes alone")
    backend: str = flag_field("auto", "regeneration engine: Hugging Face generate, vLLM, or "
                                      "auto (vLLM when installed, on CUDA, in one process; "
                                      "else hf)", choices=BACKENDS)
    seed: int = flag_field(0, "seed of sampled regeneration")
    device: str = flag_field("cpu", "device of the regenerating target")
    dtype: str | None = flag_field(None, "dtype of the regenerating target",
                                   none="float32 on CPU, the checkpoint's on CUDA", type=str,
                                   choices=TARGET_DTYPES)
    progress: bool = flag_field(True, "a progress bar")

    def __post_init__(self) -> None:
        check_positive(self, "min_supervised", "shard_rows", "max_new_tokens", "batch_size")
        if self.max_tokens is not None:
            check_positive(self, "max_tokens")
        if self.max_len is not None and (not isinstance(self.max_len, int) or self.max_len < 2):
            raise ConfigError(f"max_len must be an integer >= 2, got {self.max_len!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be auto, hf or vllm, got {self.backend!r}")
        if self.overlong not in OVERLONG:
            raise ConfigError(f"overlong must be 'truncate' or 'drop', got {self.overlong!r}")
        if self.dtype is not None and self.dtype not in TARGET_DTYPES:
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
