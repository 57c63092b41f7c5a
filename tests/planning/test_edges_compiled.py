"""The bucket-edge DP's compiled layers equal the NumPy layers bit for bit."""

import shutil
import sysconfig

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.planning import edges
from lengthwise.planning.cost import CostModel
from lengthwise.planning.edges import Histogram, auto_edges, solve

needs_compiled = pytest.mark.skipif(edges._compiled is None,
                                    reason="the compiled layers were not built at install")


def _both(*args, **kwargs):
    compiled = solve(*args, **kwargs)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(edges, "_compiled", None)
        numpy_only = solve(*args, **kwargs)
    return compiled, numpy_only


def test_the_compiled_layers_are_built_where_a_c_compiler_is():
    # the install builds them whenever it can: a missing kernel must not go unnoticed
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine: the NumPy layers run")
    assert edges._compiled is not None


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(1, 300), min_size=1, max_size=60),
       repeat=st.integers(1, 9), k=st.integers(1, 40),
       budget=st.sampled_from([None, 64, 512, 4096]),
       fill=st.sampled_from([0.0, 0.3, 1.0]), multiple=st.sampled_from([1, 8]),
       least=st.integers(0, 40), quadratic=st.booleans())
def test_every_layer_equals_the_numpy_layers(values, repeat, k, budget, fill,
                                             multiple, least, quadratic):
    """Costs and arg-mins of every layer, ties (repeated and rounded-up lengths) and
    infeasible cells (a least count per bucket) included."""
    lengths = np.repeat(np.asarray(values), 1 + np.arange(len(values)) % repeat)
    hist = Histogram.of(lengths)
    need = None if least == 0 else np.full(hist.values.size, least) - hist.values % 5
    cost = CostModel(a=1.0, b=1e-3 if quadratic else 0.0, c=3.0 if quadratic else 0.0)
    compiled, numpy_only = _both(hist, k, pad_multiple=multiple, cost=cost,
                                 budget=budget, fill_weight=fill if budget else 1.0,
                                 least=need)
    assert np.array_equal(compiled.totals, numpy_only.totals)
    assert len(compiled.args) == len(numpy_only.args)
    for a, b in zip(compiled.args, numpy_only.args, strict=True):
        assert np.array_equal(a, b)


@needs_compiled
def test_reference_shape_auto_edges_equal_the_numpy_ones(monkeypatch):
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(np.log(1050), 0.5, 200_000), 16, 8192).astype(np.int64)
    hist = Histogram.of(lengths)
    compiled = auto_edges(hist, batch_size=None, max_tokens=16384)
    monkeypatch.setattr(edges, "_compiled", None)
    assert compiled == auto_edges(hist, batch_size=None, max_tokens=16384)
    assert len(compiled) > 8


@needs_compiled
def test_the_kernel_stops_once_one_more_bucket_helps_no_prefix(monkeypatch):
    hist = Histogram.of(np.repeat(np.arange(1, 11), 4))  # at most two buckets of 16 samples
    cum = np.concatenate(([0], np.cumsum(hist.counts))).astype(np.float64)
    reach = np.searchsorted(cum, cum - np.concatenate(([0], np.full(10, 16))), side="right") - 1
    w = np.concatenate(([0.0], hist.values.astype(np.float64)))
    done = edges._compiled.layers(cum, w, reach.astype(np.int64), 10, np.empty(10),
                                  np.empty(10 * cum.size, dtype=np.int64))
    assert done < 10
    compiled, numpy_only = _both(hist, 10, least=np.full(10, 16))
    assert len(compiled.args) == 10 and np.array_equal(compiled.totals, numpy_only.totals)


@needs_compiled
def test_bad_tables_are_refused_by_the_kernel():
    cum = np.array([0.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="totals"):
        edges._compiled.layers(cum, cum, None, 2, np.empty(1), np.empty(6, dtype=np.int64))
    with pytest.raises(ValueError, match="reach"):
        edges._compiled.layers(cum, cum, np.zeros(2, dtype=np.int64), 1, np.empty(1),
                               np.empty(3, dtype=np.int64))
