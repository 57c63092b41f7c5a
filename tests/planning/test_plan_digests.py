"""Plans stay what they were: fresh plans of many shapes and options match saved digests.

The digests in ``tests/data/plan_digests.json`` were written by ``tests/_plan_cases.py``
from the planner before it was made faster; the same lengths, options, seed and epoch
must give the same micro-batches in the same order, the same edges and the same figures.
"""

from __future__ import annotations

import json

import pytest

from tests._plan_cases import FIXTURE, cases, digest, planned

SAVED = json.loads(FIXTURE.read_text())


@pytest.mark.filterwarnings("ignore:.*of the tokens are cut")
@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_plan_matches_saved_digest(case):
    name, kind, seed, kw = case
    got = digest(planned(kind, seed, kw))
    assert got["edges"] == SAVED[name]["edges"]
    assert got["stats"] == SAVED[name]["stats"]
    assert got["plan"] == SAVED[name]["plan"]
