"""The Hugging Face adapters: lengths from ``datasets``, and the ``Trainer`` integration.

* :mod:`~lengthwise.hf.lengths`: :func:`compute_lengths`, tokenizing a data set in parallel
  (cached by fingerprint);
* :mod:`~lengthwise.hf.trainer`: :class:`LengthwiseTrainer` and :func:`use_lengthwise`.

Example::

    >>> import lengthwise.hf
    >>> sorted(lengthwise.hf.__all__)
    ['LengthwiseTrainer', 'compute_lengths', 'use_lengthwise']
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "compute_lengths": "lengthwise.hf.lengths",
    "LengthwiseTrainer": "lengthwise.hf.trainer",
    "use_lengthwise": "lengthwise.hf.trainer",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
