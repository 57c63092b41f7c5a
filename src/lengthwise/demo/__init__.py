"""``lengthwise demo``: the batching comparison on a real model, offline.

- :mod:`~lengthwise.demo.corpus`: standard-library docstrings (or ``--data``) as samples.
- :mod:`~lengthwise.demo.tokenizer`: a BPE tokenizer trained locally and cached.
- :mod:`~lengthwise.demo.model`: small randomly initialised Llama-style models.
- :mod:`~lengthwise.demo.run`: one training run per order, logged with ``StepLogger``.
- :mod:`~lengthwise.demo.report`: roughness and verdicts from the doctor, table, plot.
- :mod:`~lengthwise.demo.main`: :func:`run_demo`, all of it together.

Importing this package loads nothing heavy; torch and transformers load on use.

Example::

    >>> from lengthwise.demo import DemoConfig
    >>> DemoConfig(steps=10).warmup_steps
    1
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS = {
    "DemoConfig": "lengthwise.demo.run",
    "DemoData": "lengthwise.demo.data",
    "train_order": "lengthwise.demo.run",
    "train_orders": "lengthwise.demo.run",
    "run_demo": "lengthwise.demo.main",
    "load_corpus": "lengthwise.demo.corpus",
    "build_model": "lengthwise.demo.model",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
