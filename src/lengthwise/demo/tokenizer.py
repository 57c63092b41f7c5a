"""A byte-level BPE tokenizer trained locally on the demo corpus, cached on disk.

Training takes a few seconds with Hugging Face ``tokenizers``; the result is a
standard ``tokenizer.json`` stored under the cache folder, keyed by the corpus
fingerprint and the vocabulary size, so later runs load it. ``--tokenizer PATH``
loads any ``tokenizer.json`` instead (it needs no padding token: the demo pads
with id 0 and masks padding out of the loss and the attention).

Example::

    >>> tok = train_tokenizer(["hello world", "hello there"] * 50, vocab_size=300)
    >>> ids = tok.encode("hello world").ids
    >>> tok.decode(ids)
    'hello world'
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lengthwise.atomic import atomic_path
from lengthwise.cache import cache_dir
from lengthwise.demo.corpus import corpus_fingerprint
from lengthwise.errors import ConfigError, DataError

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

__all__ = ["EOS", "default_cache_dir", "encode_texts", "get_tokenizer", "train_tokenizer"]

#: end-of-text token appended to every sample
EOS = "<|endoftext|>"
#: special tokens of the trained tokenizer (id 0 is also the padding id)
SPECIAL_TOKENS = [EOS]


def default_cache_dir() -> Path:
    """The package's cache folder (:func:`lengthwise.cache.cache_dir`)."""
    return cache_dir()


def train_tokenizer(texts: list[str], *, vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``texts``.

    Example::

        >>> tok = train_tokenizer(["abc abd"] * 20, vocab_size=270)
        >>> tok.token_to_id(EOS)
        0
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 + len(SPECIAL_TOKENS):
        raise ConfigError(f"vocab_size must be at least {257 + len(SPECIAL_TOKENS)} "
                          f"(256 bytes + special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def get_tokenizer(texts: list[str], *, path: str | Path | None = None,
                  cache_dir: str | Path | None = None, vocab_size: int = 4096,
                  fingerprint: str | None = None) -> Tokenizer:
    """Load ``path`` when given; else load or train and cache a tokenizer for ``texts``.

    ``fingerprint`` names the corpus in the cache (see ``corpus_fingerprint``).

    Example::

        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> a = get_tokenizer(["x y z"] * 30, cache_dir=d, vocab_size=260, fingerprint="t")
        >>> b = get_tokenizer([], cache_dir=d, vocab_size=260, fingerprint="t")  # from the cache
        >>> a.to_str() == b.to_str()
        True
    """
    from tokenizers import Tokenizer

    if path is not None:
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"--tokenizer {path}: no tokenizer.json there")
        try:
            return Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises plain Exception
            raise DataError(f"--tokenizer {file}: not a tokenizers JSON file ({exc})") from exc
    if fingerprint is None:
        fingerprint = corpus_fingerprint(texts)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    file = cache / f"tokenizer-{fingerprint}-{vocab_size}.json"
    if file.is_file():
        try:
            return Tokenizer.from_file(str(file))
        except Exception:  # a damaged cache file is rebuilt below
            pass
    if not texts:
        raise DataError("no texts to train a tokenizer on")
    tok = train_tokenizer(texts, vocab_size=vocab_size)
    cache.mkdir(parents=True, exist_ok=True)
    with atomic_path(file) as tmp:
        tok.save(str(tmp))
    return tok


def encode_texts(tok: Tokenizer, texts: list[str], *, max_len: int | None = None,
                 eos: bool = True) -> list[list[int]]:
    """Token ids of every text, with the end-of-text token appended, truncated to ``max_len``.

    Example::

        >>> tok = train_tokenizer(["ab ab"] * 20, vocab_size=270)
        >>> [len(x) for x in encode_texts(tok, ["ab", "ab ab ab"], max_len=3)]
        [2, 3]
    """
    eos_id = tok.token_to_id(EOS) if eos else None
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids = enc.ids
        if eos_id is not None:
            ids = ids + [eos_id]
        if max_len is not None:
            ids = ids[:max_len]
        out.append(ids)
    return out
