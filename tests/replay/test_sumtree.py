"""The prioritised samplers' sum tree (``splice/replay/_sumtree.py``) against plain-numpy
references (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splice.replay._sumtree import SumTree


class SmallTopTree(SumTree):
    """A tree whose top level holds at most 2 blocks: a few leaves make several levels."""

    TOP = 2


#: Leaf weights for the sum tree tests: zeros among weights over six decades.
WEIGHTS = st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e3)), min_size=1, max_size=3000).filter(
    lambda w: sum(w) > 0
)


def assert_drawn_in_proportion(drawn: np.ndarray, w: np.ndarray) -> None:
    """No draw of a weight-0 leaf, and a chi-square test of the counts against
    ``weight / total`` (upper tail 1e-4, Wilson-Hilferty quantile)."""
    counts = np.bincount(drawn, minlength=w.size)
    assert counts[w == 0].sum() == 0
    live = w > 0
    expected = w[live] / w.sum() * drawn.size
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    c = 2 / (9 * df)
    assert stat < df * (1 - c + 3.719 * c**0.5) ** 3, stat


@settings(max_examples=120, deadline=None)
@given(
    weights=WEIGHTS,
    small_top=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    updates=st.integers(0, 3),
)
def test_sum_tree_find_matches_the_running_sum(
    weights: list[float], small_top: bool, seed: int, updates: int
) -> None:
    rng = np.random.default_rng(seed)
    w = np.array(weights)
    tree = (SmallTopTree if small_top else SumTree)(w.size)
    tree.set(np.arange(w.size), w)
    for _ in range(updates):  # some leaves change (zeros included)
        idx = rng.integers(0, w.size, rng.integers(1, 20))
        val = np.where(rng.random(idx.size) < 0.3, 0.0, rng.random(idx.size) * 10)
        tree.set(idx, val)
        last = {int(i): v for i, v in zip(idx, val, strict=True)}
        w[list(last)] = list(last.values())
    if w.sum() <= 0:
        return
    running = np.cumsum(w)
    assert np.isclose(tree.total(), running[-1])
    assert tree.min() == w[w > 0].min()
    mass = np.concatenate([rng.random(256) * tree.total(), [0.0, np.nextafter(tree.total(), 0)]])
    leaves = tree.find(mass)
    assert (w[leaves] > 0).all()  # zero-weight leaves are never found
    # The leaf's span of the running sum holds the mass (up to rounding of the sums).
    tol = 1e-9 * running[-1]
    assert (running[leaves] - w[leaves] <= mass + tol).all()
    assert (mass < running[leaves] + tol).all()


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


class AlwaysRejection(SumTree):
    """Draws the top node by rejection whatever the acceptance."""

    MIN_ACCEPTANCE = 0.0


class NeverRejection(SumTree):
    """Always inverts the running sum (the fallback of a low acceptance)."""

    MIN_ACCEPTANCE = 2.0


class SmallTopRejection(SmallTopTree):
    MIN_ACCEPTANCE = 0.0


@settings(max_examples=100, deadline=None)
@given(
    weights=WEIGHTS,
    kind=st.sampled_from([AlwaysRejection, NeverRejection, SmallTopRejection, SumTree]),
    k=st.integers(1, 600),
    seed=st.integers(0, 2**31 - 1),
)
def test_sum_tree_sample_finds_positive_leaves_only(
    weights: list[float], kind: type[SumTree], k: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    w = np.array(weights)
    tree = kind(w.size)
    tree.set(np.arange(w.size), w)
    leaves = tree.sample(k, rng.random)
    assert leaves.shape == (k,) and leaves.dtype == np.int64
    assert (w[leaves] > 0).all()  # in range, and zero-weight leaves are never drawn


@pytest.mark.parametrize("kind", [AlwaysRejection, NeverRejection, SmallTopRejection])
def test_sum_tree_sample_counts_follow_the_weights(kind: type[SumTree]) -> None:
    """Chi-square of 200,000 draws from 2,000 leaves (one in ten of weight 0, weights over
    three decades, a heavy block) against ``weight / total``, for the rejection draw (flat
    and multi-level tree) and the inverse of the running sum."""
    rng = np.random.default_rng(1)
    w = 10.0 ** rng.uniform(-1, 2, 2000)
    w[rng.random(2000) < 0.1] = 0.0
    w[64:96] *= 20  # one top node far heavier than the rest: acceptance well below 1
    tree = kind(w.size)
    tree.set(np.arange(w.size), w)
    assert_drawn_in_proportion(tree.sample(200_000, rng.random), w)


def test_sum_tree_sample_draws_again_for_rejected_candidates() -> None:
    """A round whose candidates are all rejected (they all land on the empty first block)
    is followed by another; the kept leaves come in candidate order."""
    tree = AlwaysRejection(64)
    tree.set(np.arange(32, 64), np.ones(32))  # block 0 empty, block 1 full
    rounds = [np.zeros(30), np.array([0.5, 0.99, 0.1, 0.75] + [0.6] * 30)]
    calls: list[int] = []

    def random(n: int) -> np.ndarray:
        calls.append(n)
        u = rounds[len(calls) - 1]
        return np.resize(u, n)  # (the first round: all zeros; the second: as given)

    leaves = tree.sample(3, random)
    assert len(calls) == 2
    # u = 0.5: node 1, level 0 -> leaf 32; u = 0.99: node 1, level 0.98 -> leaf 63;
    # u = 0.1: node 0 (empty), rejected; u = 0.75: node 1, level 0.5 -> leaf 48.
    assert leaves.tolist() == [32, 63, 48]


def test_sum_tree_sample_refuses_an_all_zero_tree() -> None:
    tree = SumTree(40)
    tree.set(np.array([3]), np.array([0.0]))
    with pytest.raises(ValueError, match="every weight is 0"):
        tree.sample(4, np.random.default_rng(0).random)


class PathSpy(SumTree):
    """Records which way each draw went: ``"leaves"`` (rejection of leaves: no descent, no
    search), ``"top"`` (rejection of top nodes, then a descent) or ``"search"``."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.paths: list[str] = []

    def draw(self, k, random):  # type: ignore[no-untyped-def]
        self.paths.append("leaves")
        return super().draw(k, random)

    def _descend(self, node, rest, *, inside):  # type: ignore[no-untyped-def]
        self.paths[-1] = "top" if inside else "search"
        return super()._descend(node, rest, inside=inside)


class SmallTopSpy(PathSpy):
    TOP = 2


def test_sum_tree_draws_leaves_by_rejection_when_their_weights_are_close() -> None:
    """Chi-square of 200,000 draws from 3,000 leaves (one in ten of weight 0, the rest within
    4x of each other, the last 200 empty as in a buffer not yet full) against
    ``weight / total``, on the leaf-rejection path, with the weights it returns."""
    rng = np.random.default_rng(2)
    w = rng.uniform(0.25, 1.0, 3000)
    w[rng.random(3000) < 0.1] = 0.0
    w[2800:] = 0.0
    for kind in (PathSpy, SmallTopSpy):  # one level under the top, and several
        tree = kind(w.size)
        tree.set(np.arange(w.size), w)
        leaves, weights = tree.draw(200_000, rng.random)
        assert tree.paths == ["leaves"]
        assert np.array_equal(weights, w[leaves])  # the very stored weights
        assert_drawn_in_proportion(leaves, w)


def test_sum_tree_draw_takes_the_cheapest_exact_path() -> None:
    """Leaves by rejection while the leaves' weights are close; top nodes by rejection when
    only the top nodes' are (light leaves inside every block); the running sum's inverse when
    neither is (one heavy block)."""
    n = 32 * 64
    tree = PathSpy(n)
    tree.set(np.arange(n), np.ones(n))
    tree.draw(100, np.random.default_rng(0).random)
    w = np.ones(n)
    w[::32] = 100.0  # one heavy leaf per block: leaf acceptance ~0.04, top nodes all equal
    tree.set(np.arange(n), w)
    tree.draw(100, np.random.default_rng(0).random)
    w[:32] = 1e4  # one heavy block: the top's acceptance ~0.05 too
    tree.set(np.arange(32), w[:32])
    leaves, weights = tree.draw(100, np.random.default_rng(0).random)
    assert tree.paths == ["leaves", "top", "search"]
    assert np.array_equal(weights, w[leaves])


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.one_of(st.just(0.0), st.floats(0.3, 1.0)), min_size=1, max_size=3000),
    small_top=st.booleans(),
    k=st.integers(1, 600),
    seed=st.integers(0, 2**31 - 1),
    updates=st.integers(0, 3),
)
def test_sum_tree_keeps_each_top_node_s_heaviest_leaf(
    weights: list[float], small_top: bool, k: int, seed: int, updates: int
) -> None:
    """The heaviest leaf under every top node (the bound of the leaf rejection) after
    partial updates, zeros included; draws on any path give positive leaves and their
    stored weights."""
    rng = np.random.default_rng(seed)
    w = np.array(weights)
    tree = (SmallTopTree if small_top else SumTree)(w.size)
    tree.set(np.arange(w.size), w)
    for _ in range(updates):
        idx = rng.integers(0, w.size, rng.integers(1, 20))
        val = np.where(rng.random(idx.size) < 0.5, 0.0, rng.uniform(0.3, 1.0, idx.size))
        tree.set(idx, val)
        last = {int(i): v for i, v in zip(idx, val, strict=True)}
        w[list(last)] = list(last.values())
    span = tree.FANOUT ** len(tree.prefix)
    padded = np.zeros(tree.top.size * span)
    padded[: w.size] = w
    assert np.array_equal(tree.maxs[-1], padded.reshape(-1, span).max(axis=1))
    if w.sum() <= 0:
        return
    leaves, drawn = tree.draw(k, rng.random)
    assert leaves.shape == (k,) and leaves.dtype == np.int64
    assert (w[leaves] > 0).all() and np.array_equal(drawn, w[leaves])
