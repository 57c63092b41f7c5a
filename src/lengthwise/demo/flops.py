"""Training FLOPs of the demo's causal LM per micro-batch: a count, not a measurement.

A padded micro-batch of ``rows`` rows of ``width`` tokens costs, in one forward pass,
every matrix product of every token (padding included: the kernels compute it) plus
attention's two ``width x width`` products per row and layer (the dense masked kernel
computes the whole square, causal or not). A training step's backward pass costs twice
its forward (gradients of inputs and of weights), so a micro-batch trains for three
forwards. Norms, activations, softmax, the embedding lookup and the optimizer are left
out. The number is the same on every machine: the demo reports it per order, and the order
experiment (``benchmarks/order_arms.py``) gives every order the same budget of it.

Example::

    >>> from lengthwise.demo.model import MODEL_SIZES
    >>> tiny = MODEL_SIZES["tiny"]
    >>> token_flops(tiny, vocab_size=2048)
    462848
    >>> train_flops(1, 4, tiny, vocab_size=2048) == 3 * (4 * 462848 + 2 * 4 * 4 * 4 * 64)
    True
"""

from __future__ import annotations

from typing import Any

__all__ = ["token_flops", "train_flops"]


def token_flops(size: Any, *, vocab_size: int) -> int:
    """Forward FLOPs of one token through the weights of a model of ``size`` (a
    :class:`~lengthwise.demo.model.ModelSize`): 2 per multiply-add of every projection
    (q, k, v, o; gate, up, down) of every layer, and of the output head.

    Example::

        >>> from lengthwise.demo.model import ModelSize
        >>> token_flops(ModelSize(hidden=2, layers=1, heads=1, kv_heads=1, intermediate=3),
        ...             vocab_size=5)
        88
    """
    h, i = int(size.hidden), int(size.intermediate)
    kv = h * int(size.kv_heads) // int(size.heads)  # width of the k and v projections
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i
    return 2 * (int(size.layers) * per_layer + h * int(vocab_size))


def train_flops(rows: int, width: int, size: Any, *, vocab_size: int) -> int:
    """FLOPs of one training micro-batch (forward and backward) of ``rows`` rows padded to
    ``width`` tokens: ``3 x (rows x width x token_flops + rows x layers x 4 x width^2 x hidden)``.

    Example::

        >>> from lengthwise.demo.model import MODEL_SIZES
        >>> train_flops(2, 10, MODEL_SIZES["tiny"], vocab_size=2048)
        28078080
    """
    if rows < 0 or width < 0:
        raise ValueError(f"rows and width must be >= 0, got {rows}, {width}")
    attention = int(size.layers) * 4 * width * width * int(size.hidden)
    return 3 * rows * (width * token_flops(size, vocab_size=vocab_size) + attention)
