"""The numpy containers behind the index and the samplers (``splice/replay/_structures.py``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from splice.replay._structures import SumTree


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    updates=st.lists(st.tuples(st.integers(1, 500), st.integers(0, 2**16)), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_a_sum_tree_is_the_same_however_its_leaves_were_set(n: int, updates, seed: int) -> None:
    """A tree filled by many partial updates and the tree restored from its leaves hold the
    same bits (each block's running sums come from its own leaves), so they find the same
    leaves for every mass: a restored prioritised sampler draws exactly as the saved one.
    The running sums of a block are exactly its leaves' ``cumsum``, however heavy the blocks
    changed with it (a flat ``cumsum`` minus each block's start lost light leaves)."""
    rng = np.random.default_rng(seed)
    tree = SumTree(n)
    tree.set(np.arange(n), 10.0 ** rng.uniform(-3, 12, n))  # weights over 15 decades
    for k, sub in updates:
        idx = np.random.default_rng(sub).integers(0, n, min(k, n))
        tree.set(idx, 10.0 ** rng.uniform(-3, 12, idx.size))
    again = SumTree(n)
    again.restore(tree.state())
    for a, b in zip(
        tree.prefix + tree.weights + tree.mins,
        again.prefix + again.weights + again.mins,
        strict=True,
    ):
        assert np.array_equal(a, b)
    leaves = tree.weights[0].reshape(-1, SumTree.FANOUT)
    assert np.array_equal(tree.prefix[0], np.cumsum(leaves, axis=1))
    mass = rng.uniform(0, tree.total(), 2000)
    assert np.array_equal(tree.find(mass), again.find(mass))
