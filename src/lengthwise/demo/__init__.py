"""``lengthwise demo``: the batching comparison on a real model, offline.

- :mod:`~lengthwise.demo.corpus`: standard-library docstrings (or ``--data``) as samples.
- :mod:`~lengthwise.demo.tokenizer`: a BPE tokenizer trained locally and cached.
- :mod:`~lengthwise.demo.model`: small randomly initialised Llama-style models.
- :mod:`~lengthwise.demo.config`: the settings (the command line reads its defaults here).
- :mod:`~lengthwise.demo.lm`: the causal-LM task and its held-out evaluation.
- :mod:`~lengthwise.demo.runner`: one run per order, in lock-step, on the same samples.
- :mod:`~lengthwise.demo.flops`: the training FLOPs of a micro-batch, counted per run.
- :mod:`~lengthwise.demo.results`: a run's figures, read back from its log.
- :mod:`~lengthwise.demo.dflash`, :mod:`~lengthwise.demo.dflash_data`: ``--task dflash``, a
  DFlash draft per order against a frozen target, on responses the target regenerated.
- :mod:`~lengthwise.demo.report`: roughness and verdicts from the doctor, table, plot.
- :mod:`~lengthwise.demo.main`: :func:`run_demo`, all of it together.

The training loop itself is a library part, :mod:`lengthwise.train.loop`.

Importing this package loads nothing heavy; torch and transformers load on use.

Example::

    >>> from lengthwise.demo import DemoConfig
    >>> DemoConfig().epochs
    1
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS = {
    "DemoConfig": "lengthwise.demo.config",
    "DemoData": "lengthwise.demo.data",
    "train_order": "lengthwise.demo.runner",
    "train_orders": "lengthwise.demo.runner",
    "run_demo": "lengthwise.demo.main",
    "load_corpus": "lengthwise.demo.corpus",
    "build_model": "lengthwise.demo.model",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
