"""``SumTree``: non-negative weights, their sum and batched proportional draws (the
prioritised samplers' structure), and its helpers.

Like the containers of :mod:`splice.replay._structures`, it is plain numpy arrays plus
counters, and has a typed state (:class:`SumTreeState`) that saves without pickle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from splice.replay._structures import EMPTY, I64

__all__ = ["SumTree", "SumTreeState", "last_of_each"]


@dataclass
class SumTreeState:
    """:class:`SumTree`: the leaves (the levels above are recomputed)."""

    leaves: np.ndarray


class SumTree:
    """Non-negative float64 weights, their sum, minimum and batched proportional draws.

    Built for prioritised sampling: :meth:`draw` (and :meth:`sample`) draws leaves in
    proportion to their weight, :meth:`find` maps given uniform masses in ``[0, total)`` to
    leaves. Leaves are grouped in blocks of ``FANOUT``; each block keeps the running sums of
    its children (``prefix``), and the block sums are the weights of the level above, until a
    level has at most ``TOP`` blocks (a million leaves make one level of 31,250 blocks). When
    the leaves' weights are within a few times of each other, a draw picks leaves directly
    by rejection against the heaviest leaf (no descent: see :meth:`draw`). Otherwise it picks
    top nodes (by rejection when their weights are close, else by searching the running sum
    of the top), then, per level, gathers each query's block of running sums as one row and
    picks the first child whose running sum exceeds what is left of the query (the number of
    running sums at or below it, counted bytewise: see :func:`_count_per_row`): a handful of
    whole-array numpy calls per level, no Python loop over queries. Zero-weight leaves are
    never drawn.

    :meth:`set` recomputes the running sums (and positive minima and maxima) of the changed
    blocks at every level: O(k * FANOUT) per level for k leaves. A block's running sums
    depend on its own children only (a ``cumsum`` along each block), so the tree is the same
    bits however its leaves were set: a restored tree draws exactly as the saved one, and a
    light leaf next to a block of heavy ones keeps its weight. (A flat ``cumsum`` over all
    changed blocks minus each block's start lost every leaf lighter than about 1e-16 times
    the blocks changed with it, and rounded differently after a restore; it was also
    slower.)

    Examples:
        >>> t = SumTree(40)
        >>> t.set(np.array([3, 30]), np.array([1.0, 3.0]))
        >>> t.total(), t.min()
        (4.0, 1.0)
        >>> t.find(np.array([0.5, 1.5, 3.9])).tolist()
        [3, 30, 30]
        >>> draws = t.sample(1000, np.random.default_rng(0).random)
        >>> sorted(set(draws.tolist())), bool(0.2 < np.mean(draws == 3) < 0.3)
        ([3, 30], True)
    """

    FANOUT = 32
    TOP = 1 << 15
    #: :meth:`draw` picks top nodes by rejection at or above this expected acceptance.
    MIN_ACCEPTANCE = 0.4
    #: :meth:`draw` picks leaves by rejection at or above this acceptance (and
    #: ``MIN_ACCEPTANCE``): each candidate reads a leaf, so a low acceptance would cost
    #: more reads than a descent.
    MIN_LEAF_ACCEPTANCE = 0.4

    def __init__(self, n: int) -> None:
        self.n = n
        F = self.FANOUT
        # weights[0]: the leaves; weights[d + 1]: the block sums of level d; all but the
        # last (the top) padded to whole blocks. prefix[d]: the running sums inside each
        # block of level d; mins[d]: each block's smallest positive leaf (inf: none),
        # sized like weights[d + 1].
        self.weights: list[np.ndarray] = [np.zeros(_whole(max(n, 1), F))]
        self.prefix: list[np.ndarray] = []
        while True:
            blocks = self.weights[-1].size // F
            self.prefix.append(np.zeros((blocks, F)))
            top = blocks <= self.TOP
            self.weights.append(np.zeros(blocks if top else _whole(blocks, F)))
            if top:
                break
        self.mins = [np.full(w.size, np.inf) for w in self.weights[1:]]
        self.maxs = [np.zeros(w.size) for w in self.weights[1:]]  # each block's heaviest leaf
        self._span = F ** len(self.prefix)  # leaves under one top node
        self._cum: np.ndarray | None = None  # running sum of the top, None after a change
        self._before = np.zeros(1)  # 0, then the top's running sum (see _running)
        self._starts = np.zeros(0, dtype=I64)  # see _row_starts
        self._last = 0  # the last top node with a positive weight
        self._min: float | None = None
        self._peak: float | None = None  # the heaviest top node, None after a change
        self._leaf_peak: float | None = None  # the heaviest leaf, None after a change

    @property
    def top(self) -> np.ndarray:
        return self.weights[-1]

    def set(self, idx: np.ndarray, values: np.ndarray, *, unique: bool = False) -> None:
        """Set the weights of leaves ``idx`` (with repeated leaves, the last value wins).

        ``unique``: ``idx`` is already sorted without repeats (skips that step).
        """
        if idx.size == 0:
            return
        F = self.FANOUT
        if not unique:
            idx, values = last_of_each(idx, np.broadcast_to(values, idx.shape))
        self.weights[0][idx] = values
        blocks = idx // F
        blocks = blocks[run_starts(blocks)]
        for depth, prefix in enumerate(self.prefix):
            rows = self.weights[depth].reshape(-1, F).take(blocks, axis=0)
            # Each block from 0, from its leaves only. (torch's ``cumsum`` along the rows adds
            # left to right as numpy's does, to the same bits, in a quarter of the time on a
            # few hundred short rows; so does ``amax`` against numpy's ``max``.)
            leaves = torch.from_numpy(rows)  # (one tensor for the three reductions)
            running = torch.cumsum(leaves, dim=1).numpy()
            prefix[blocks] = running
            self.weights[depth + 1][blocks] = running[:, -1]
            if depth == 0:
                least, most = rows, leaves
            else:
                least = self.mins[depth - 1].reshape(-1, F).take(blocks, 0)
                most = torch.from_numpy(self.maxs[depth - 1].reshape(-1, F).take(blocks, 0))
            self.mins[depth][blocks] = _least_positive(least, leaves if depth == 0 else None)
            self.maxs[depth][blocks] = torch.amax(most, dim=1).numpy()
            if depth + 1 < len(self.prefix):  # (the top has no blocks above it)
                blocks //= F
                blocks = blocks[run_starts(blocks)]
        self._cum = self._min = self._peak = self._leaf_peak = None

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.weights[0][idx]

    def _running(self) -> np.ndarray:
        """The running sum of the top level (recomputed after a change), and
        ``self._before``: the sum of the top nodes before each one, exactly: a leading 0,
        then the running sum itself (``_cum`` is its view from 1, so ``_before[i]`` is
        ``_cum[i - 1]``, the memory a search for node ``i`` has just read)."""
        if self._cum is None:
            self._before = np.zeros(self.top.size + 1)
            # (torch's ``cumsum`` adds left to right as numpy's does, in a quarter of the
            # time on the 31,250 nodes of a million leaves.)
            torch.cumsum(torch.from_numpy(self.top), 0, out=torch.from_numpy(self._before[1:]))
            self._cum = self._before[1:]
            self._last = int(np.searchsorted(self._cum, self._cum[-1], side="left"))
        return self._cum

    def total(self) -> float:
        return float(self._running()[-1])

    def min(self) -> float:
        """The smallest positive weight (inf when there is none)."""
        if self._min is None:
            self._min = float(self.mins[-1].min())
        return self._min

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each mass ``u`` in ``[0, total)``: the leaf where the running sum passes ``u``.

        The masses are sorted (so that memory is walked in order) and ``np.searchsorted``
        into the running sum of the top (recomputed only after a change, O(``TOP``)); the
        mass before a top node is read exactly from that running sum. The leaves come back
        in the order of the masses.
        """
        order = np.argsort(mass)
        sorted_mass = mass[order]
        cum = self._running()
        node = cum.searchsorted(sorted_mass, side="right")
        np.minimum(node, self._last, out=node)  # a mass rounded up to the total
        rest = sorted_mass - self._before.take(node)  # the mass left inside the node (>= 0)
        out = np.empty_like(node)
        out[order] = self._descend(node, rest, inside=False)
        return out

    def sample(self, k: int, random: Callable[[int], np.ndarray]) -> np.ndarray:
        """``k`` leaves drawn independently, each with probability ``weight / total``
        (:meth:`draw` without the weights)."""
        return self.draw(k, random)[0]

    def draw(self, k: int, random: Callable[[int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``k`` leaves drawn independently, each with probability ``weight / total``, and
        their weights.

        ``random(n)``: ``n`` uniform float64 numbers in ``[0, 1)`` (the caller's generator).
        Three ways to draw, the cheapest that fits the weights (all three draw in proportion
        to the weights; they use the random numbers differently):

        * **leaves by rejection**, when the leaves' weights are within a few times of each
          other (``total`` is at least ``MIN_LEAF_ACCEPTANCE`` and ``MIN_ACCEPTANCE`` of
          ``leaves * heaviest leaf``, counting the leaves under the top nodes up to the last
          positive one): each uniform ``u`` times the number of leaves gives a candidate
          leaf (its integer part) and a level in ``[0, heaviest)`` (its fraction times the
          heaviest weight); a candidate is kept if its level falls below its weight. That
          picks each leaf in proportion to its weight, in a few whole-array calls that read
          one weight per candidate (the weight returned), with no descent of the tree.
        * **top nodes by rejection**, the same over the top nodes (when their weights are
          within a few times of each other by ``MIN_ACCEPTANCE``), which leaves the kept
          level uniform in ``[0, weight)``: the mass inside the node to descend with
          (:meth:`_descend`), with no search of the top's running sum and no sort.
        * otherwise the inverse of the running sum (:meth:`find`).

        (The level keeps the bits of ``u`` that the candidate did not use: with N candidates
        to pick from, steps of ``2**-53 * N * heaviest``, within ``1 / acceptance`` of the
        inverse CDF's steps of ``2**-53 * total``.)

        Raises:
            ValueError: every weight is 0.
        """
        cum = self._running()
        if not cum[-1] > 0:
            raise ValueError("every weight is 0: nothing to draw")
        total = float(cum[-1])
        live = self._last + 1
        leaves = self.weights[0]
        if self._leaf_peak is None:
            self._leaf_peak = float(self.maxs[-1][:live].max())
        span = min(live * self._span, leaves.size)
        acceptance = total / (span * self._leaf_peak)
        if acceptance >= max(self.MIN_LEAF_ACCEPTANCE, self.MIN_ACCEPTANCE):
            leaf, _, weight = _reject(k, random, leaves, span, self._leaf_peak, acceptance)
            return leaf, weight
        if self._peak is None:
            self._peak = float(self.top[:live].max())
        acceptance = total / (live * self._peak)
        if acceptance >= self.MIN_ACCEPTANCE:
            node, level, _ = _reject(k, random, self.top, live, self._peak, acceptance)
            leaf = self._descend(node, level, inside=True)
        else:
            leaf = self.find(random(k) * total)
        return leaf, leaves.take(leaf)

    def _descend(self, node: np.ndarray, rest: np.ndarray, *, inside: bool) -> np.ndarray:
        """From top nodes and the mass inside each (``0 <= rest``, below the node's weight
        up to rounding; strictly below it if ``inside``) down to the leaves. Changes
        ``node`` and ``rest`` in place."""
        F = self.FANOUT
        for depth in range(len(self.prefix) - 1, -1, -1):
            rows = self.prefix[depth].take(node, axis=0)
            # The running sums rise along a row: the first one above ``rest`` is the one
            # after those at or below it (a positive child: its running sum rose past it).
            child = _count_per_row(rows <= rest[:, None])
            # Rounding may leave ``rest`` at or past the block's sum (not below a top node
            # of ``inside``: a block's last running sum is its weight in the level above).
            if not (inside and depth == len(self.prefix) - 1) and child.max() == F:
                _keep_inside(rows, rest, child)
            if depth:  # what is left for the level below (not needed at the leaves)
                below = rows.reshape(-1).take(self._row_starts(node.size) + child - 1)
                rest -= np.where(child > 0, below, 0.0)
            node *= F
            node += child
        return node

    def _row_starts(self, k: int) -> np.ndarray:
        """``0, FANOUT, 2 * FANOUT, ...``: where each of ``k`` gathered blocks starts."""
        if self._starts.size < k:
            self._starts = np.arange(max(k, 2 * self._starts.size), dtype=I64) * self.FANOUT
        return self._starts[:k]

    def clear(self) -> None:
        for level in self.weights + self.prefix:
            level.fill(0.0)
        for level in self.mins:
            level.fill(np.inf)
        for level in self.maxs:
            level.fill(0.0)
        self._cum = self._min = self._peak = self._leaf_peak = None

    def state(self) -> SumTreeState:
        return SumTreeState(self.weights[0][: self.n].copy())

    def restore(self, state: SumTreeState) -> None:
        leaves = np.asarray(state.leaves, dtype=np.float64)
        if leaves.size != self.n:
            raise ValueError(f"saved tree has {leaves.size} leaves, this one {self.n}")
        self.clear()
        self.set(np.arange(leaves.size, dtype=I64), leaves, unique=True)


def _reject(
    k: int,
    random: Callable[[int], np.ndarray],
    weights: np.ndarray,
    count: int,
    peak: float,
    acceptance: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``k`` of ``weights[:count]`` (none above ``peak``) picked by rejection, each in
    proportion to its weight: their positions, their levels (uniform in ``[0, weight)``)
    and their weights. ``acceptance``: the expected share of candidates kept (sizes the
    rounds, so that one almost always suffices). Candidates are kept in the order drawn."""
    picks: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    kept_weights: list[np.ndarray] = []
    missing = k
    while missing:
        level = random(int(missing / acceptance * 1.1) + 16)
        level *= count
        pick = level.astype(I64)  # u < 1 - 2**-53: below ``count``
        level -= pick
        level *= peak
        weight = weights.take(pick)
        kept = np.flatnonzero(level < weight)[:missing]
        picks.append(pick.take(kept))
        levels.append(level.take(kept))
        kept_weights.append(weight.take(kept))
        missing -= kept.size
    if len(picks) == 1:
        return picks[0], levels[0], kept_weights[0]
    return np.concatenate(picks), np.concatenate(levels), np.concatenate(kept_weights)


def _least_positive(rows: np.ndarray, tensor: torch.Tensor | None = None) -> np.ndarray:
    """The smallest positive value of each row of a ``[k, F]`` float64 array (inf: none).
    ``tensor``: ``rows`` as a tensor, when the caller has it."""
    least = torch.amin(torch.from_numpy(rows) if tensor is None else tensor, dim=1).numpy()
    if not least.all():  # rows with a 0 (empty rows of the storage, or zero weights)
        some = least == 0
        zero_rows = rows[some]
        least[some] = np.where(zero_rows > 0, zero_rows, np.inf).min(axis=1)
    return least


def _keep_inside(rows: np.ndarray, rest: np.ndarray, child: np.ndarray) -> None:
    """Where rounding left ``rest`` at or past its block's sum (``child`` past the block's
    last child), set it just below the sum, and ``child`` to the (positive) child whose
    running sum then exceeds it. In place."""
    over = child >= rows.shape[1]
    rest[over] = np.nextafter(rows[over, -1], 0.0)
    child[over] = (rows[over] <= rest[over, None]).sum(axis=1)


def last_of_each(idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``idx`` sorted without repeats, each with the last of its ``values``.

    (A sort and a mask: ``np.unique`` costs several times more on a few hundred numbers.)
    """
    if idx.size == 0:
        return idx, values
    order = np.argsort(idx, kind="stable")
    idx = idx[order]
    last = np.empty(idx.size, dtype=bool)
    np.not_equal(idx[1:], idx[:-1], out=last[:-1])
    last[-1] = True
    return idx[last], values[order][last]


_BYTE_ONES = np.uint64(0x0101010101010101)
_TOP_BYTE = np.uint64(56)


def _count_per_row(flags: np.ndarray) -> np.ndarray:
    """The number of True per row of a C-contiguous ``[k, F]`` bool array (``F`` a multiple
    of 8, below 256), as int64: the rows read as 64-bit words added bytewise (no byte
    exceeds ``F``), then the 8 byte counts summed by one multiplication (the top byte of
    ``x * 0x0101...01``). The block search of a draw of 512 from a million leaves (gather,
    clip, choice of child) took 28 us this way against 39 us with ``argmax(rows > rest)``
    (fastest of 41 interleaved rounds, CPU time, busy 2-core machine).

    Examples:
        >>> _count_per_row(np.arange(16).reshape(2, 8) < 5).tolist()
        [5, 0]
    """
    words = flags.view(np.uint64)
    total = words[:, 0].copy()
    for j in range(1, words.shape[1]):
        total += words[:, j]
    total *= _BYTE_ONES
    total >>= _TOP_BYTE
    return total.view(I64)


def run_starts(keys: np.ndarray) -> np.ndarray:
    """The first position of every run of equal consecutive ``keys`` (of a sorted array: of
    every distinct value)."""
    if keys.size == 0:
        return EMPTY
    head = np.empty(keys.size, dtype=bool)
    head[0] = True
    np.not_equal(keys[1:], keys[:-1], out=head[1:])
    return head.nonzero()[0]


def _whole(size: int, block: int) -> int:
    """``size`` rounded up to whole blocks."""
    return -(-size // block) * block
