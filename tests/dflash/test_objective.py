"""Labels, weights, loss and accuracy of the DFlash objective against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.objective import (
    IGNORE,
    anchor_candidates,
    block_targets,
    sample_anchors,
    simulated_acceptance_length,
    slot_weights,
    target_layer_ids,
)
from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")


def test_layer_ids_follow_the_reference_spread():
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert target_layer_ids(28, 1) == [14]
    assert all(0 <= i < 3 for i in target_layer_ids(3, 3))


@given(layers=st.integers(1, 80), features=st.integers(1, 12))
def test_layer_ids_are_distinct_target_layers_or_refused(layers, features):
    if features > layers:
        with pytest.raises(ConfigError, match=f"num_features {features}: a {layers}-layer"):
            target_layer_ids(layers, features)
        return
    ids = target_layer_ids(layers, features)
    assert len(set(ids)) == len(ids) == features and all(0 <= i < layers for i in ids)
    assert ids == sorted(ids)


def test_the_default_features_of_a_small_target_are_distinct():
    assert target_layer_ids(4, 4) == [0, 1, 2, 3]  # was [1, 1, 2, 2]
    assert target_layer_ids(3, 3) == [0, 1, 2]
    with pytest.raises(ConfigError, match="give num_features <= 4"):
        target_layer_ids(4, 5)  # was [1, 1, 2, 2, 2]


def test_labels_and_weights_by_hand():
    ids = np.array([10, 11, 12, 13, 14, 15])
    mask = np.array([0, 0, 1, 1, 0, 1], dtype=bool)  # token 4 unsupervised
    labels, w = block_targets(ids, mask, np.array([2, 3]), block_size=4, gamma=2.0)
    # block at 2: slot1 -> pos3 (13, w 1), slot2 -> pos4 unsupervised, slot3 -> pos5 (15, e^-1)
    assert labels.tolist() == [[IGNORE, 13, IGNORE, 15], [IGNORE, IGNORE, 15, IGNORE]]
    np.testing.assert_allclose(w, [[0, 1, 0, math.exp(-1)], [0, 0, math.exp(-0.5), 0]])


def test_slot_weights_decay():
    np.testing.assert_allclose(slot_weights(4, 7.0), [0, 1, math.exp(-1 / 7), math.exp(-2 / 7)])


def test_anchor_candidates_need_two_supervised_tokens():
    assert anchor_candidates(np.array([1, 0, 1, 0], dtype=bool)).size == 0
    assert sample_anchors(np.array([1, 0, 1], dtype=bool), num_anchors=4, seed=0, step=0,
                          sample_id=0).size == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=60), st.integers(1, 8),
       st.integers(0, 5), st.integers(0, 1000))
def test_anchors_are_valid_sorted_and_depend_only_on_the_sample(mask, n, step, sid):
    m = np.array(mask, dtype=bool)
    a = sample_anchors(m, num_anchors=n, seed=3, step=step, sample_id=sid)
    assert a.size == min(n, anchor_candidates(m).size)
    assert np.all(np.diff(a) > 0)
    assert np.all(m[a]) and np.all(m[a + 1])
    again = sample_anchors(m.copy(), num_anchors=n, seed=3, step=step, sample_id=sid)
    assert np.array_equal(a, again)


def test_anchor_draws_change_with_step_and_sample():
    m = np.ones(200, dtype=bool)
    draws = {tuple(sample_anchors(m, num_anchors=5, seed=0, step=s, sample_id=i))
             for s in range(3) for i in range(3)}
    assert len(draws) == 9


def test_loss_and_accuracy_by_hand():
    from lengthwise.dflash.loss import block_loss

    logits = torch.tensor([[[0.0, 0.0, 0.0],     # slot 0: ignored
                            [2.0, 0.0, 0.0],     # label 0, correct
                            [0.0, 1.0, 3.0]]])   # label 1, wrong (argmax 2)
    labels = torch.tensor([[[IGNORE, 0, 1]]])
    w = torch.tensor([[[0.0, 1.0, 0.5]]])
    s = block_loss(logits, labels, w)
    ce1 = -math.log(math.exp(2) / (math.exp(2) + 2))
    ce2 = -math.log(math.exp(1) / (1 + math.exp(1) + math.exp(3)))
    assert float(s.weighted) == pytest.approx(ce1 + 0.5 * ce2, rel=1e-6)
    assert s.weight == pytest.approx(1.5)
    assert (s.correct, s.count) == (1, 2)  # unweighted: one of two supervised slots
    assert s.slot_correct.tolist() == [0, 1, 0] and s.slot_count.tolist() == [0, 1, 1]


def test_simulated_acceptance_by_hand():
    assert simulated_acceptance_length(np.array([0.8, 0.5, 0.5])) == pytest.approx(
        1 + 0.8 + 0.4 + 0.2)
    assert simulated_acceptance_length(np.zeros(3)) == 1.0
    with pytest.raises(ValueError, match="accuracies"):
        simulated_acceptance_length(np.array([1.5]))
