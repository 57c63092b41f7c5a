"""The order experiment of ``benchmarks/order_arms.py`` (not installed: the script imports it
from beside it, the tests through ``tests/conftest.py``).

* :mod:`experiments.data`: the demo's corpus, its length strata, the held-out loss;
* :mod:`experiments.arms`: :class:`~experiments.arms.ArmsConfig`, steps of equal real tokens
  or of an equal FLOPs budget, one run of a cell, an order and a seed;
* :mod:`experiments.arms_report`: every run, in worker processes, and the figures over seeds
  per cell.
"""
