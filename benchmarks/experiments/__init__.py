"""The order experiments of ``benchmarks/order_arms.py`` and ``benchmarks/order_arms_dflash.py``,
and the held-out chats of the DFlash draft benchmarks (not installed: the scripts import
them from beside them, the tests through ``tests/conftest.py``).

* :mod:`experiments.data`: the demo's corpus, its length strata, the held-out loss;
* :mod:`experiments.arms`: :class:`~experiments.arms.ArmsDesign` (orders, seeds, arms,
  schedules) and the demo's :class:`~experiments.arms.ArmsConfig`, steps of equal real
  tokens or of an equal FLOPs budget, one run of a cell, an order and a seed;
* :mod:`experiments.arms_report`: every run, in worker processes, and the figures over seeds
  per cell;
* :mod:`experiments.dflash_arms`, :mod:`experiments.dflash_report`: the same design on a
  DFlash draft trained from cached target features, and its figures;
* :mod:`experiments.loss_log`: the doctor's findings and the stable region of a loss log;
* :mod:`experiments.saved`: the scripts' options, saved runs and check comparison;
* :mod:`experiments.held_out_chats`: the chats ``benchmarks/draft_levers.py`` and
  ``benchmarks/reference_trainer.py`` hold out, and a draft's figures on each.
"""
