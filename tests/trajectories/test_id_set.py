"""IdSet: the completed-id record of the assembler, against a plain Python set."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from splice.trajectories._id_set import IdSet

id_lists = st.lists(st.integers(-1, 60) | st.integers(2**40, 2**40 + 20), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(id_lists, max_size=12), st.integers(1, 8), id_lists)
def test_id_set_matches_a_python_set(adds, buffer, probe) -> None:
    ids, model = IdSet(buffer=buffer), set()
    for values in adds:
        ids.add(np.array(values, dtype=np.int64))
        model |= set(values)
        query = np.array(probe + values, dtype=np.int64)
        expected = [v in model for v in query.tolist()]
        assert ids.contains(query).tolist() == expected
        assert ids.intersects(query) == any(expected)
    assert len(ids) == len(model)
    # The ranges are sorted, disjoint, non-adjacent, and cover exactly the model.
    covered = [v for lo, hi in ids.ranges for v in range(lo, hi)]
    assert covered == sorted(model)
    assert all(hi < lo for (_, hi), (lo, _) in itertools.pairwise(ids.ranges))


def test_counter_ids_stay_a_few_ranges() -> None:
    """Episodes from a counter complete roughly in order: the set stays small."""
    ids = IdSet(buffer=16)
    rng = np.random.default_rng(0)
    order = np.argsort(np.arange(10_000) + rng.integers(0, 50, 10_000))  # slightly shuffled
    for chunk in np.array_split(order, 500):
        ids.add(chunk)
    assert ids.ranges == [(0, 10_000)]
