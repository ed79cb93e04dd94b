"""Small vectorised containers used by the replay index and the samplers.

All of them are plain numpy arrays plus counters, so that every operation is a handful of
whole-array numpy calls (no Python loop over elements) and their state saves to ``.npy`` files
without pickle:

* :class:`Pool` — parallel int64 arrays addressed by an id, with a free list (trajectory slots,
  segments);
* :class:`KeyMap` — a sorted map from int64 keys (trajectory ids) to slots;
* :class:`DenseSet` — a set of small integers with O(1) add/remove and O(1) uniform draws;
* :class:`SumTree` — weights with their sum, minimum and a batched prefix-sum search
  (blocks of 32), for prioritised draws.

Each has a typed state (``state()`` / ``restore(state)``), a dataclass that
:mod:`splice.replay._state` saves without pickle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "DenseSet",
    "DenseSetState",
    "KeyMap",
    "KeyMapState",
    "Pool",
    "PoolState",
    "SumTree",
    "SumTreeState",
]

I64 = np.int64
_KEY_SENTINEL = np.iinfo(np.int64).max


@dataclass
class PoolState:
    """:class:`Pool`: one array per field, and the free list."""

    fields: dict[str, np.ndarray]
    free: np.ndarray
    n_free: int


@dataclass
class KeyMapState:
    """:class:`KeyMap`: the sorted keys and their values (tombstones are -1)."""

    keys: np.ndarray
    vals: np.ndarray
    n_dead: int


@dataclass
class DenseSetState:
    """:class:`DenseSet`: its members (in draw order) and its universe."""

    items: np.ndarray
    universe: int


@dataclass
class SumTreeState:
    """:class:`SumTree`: the leaves (the levels above are recomputed)."""

    leaves: np.ndarray


def _empty() -> np.ndarray:
    return np.empty(0, dtype=I64)


class Pool:
    """Parallel int64 arrays (``pool.a[name][id]``) with an id free list; grows by doubling.

    Ids are handed out smallest-first from a fresh pool and recycled last-in-first-out.

    The fields are the rows of one 2-D array, :attr:`data` (``data[i]`` is field ``i``), so
    that several fields of many ids are read or written in one numpy call
    (``data[:, ids]``). ``data`` has one column more than the pool has ids: a *scratch*
    column at the end, where a write addressed to id ``-1`` lands (``data[i, -1]``), so that
    "link to the previous item, if any" needs no mask. Reads of id ``-1`` return that
    scratch value: -1 in every field, or ``scratch`` (one value per field) when given, so that
    a read for a not-yet-allocated item (id -1) returns a new item's fields (the pool keeps
    that column as given as long as nobody writes to id -1 of those fields).

    Examples:
        >>> pool = Pool(("lo", "hi"), size=2)
        >>> ids = pool.alloc(3)
        >>> ids.tolist(), pool.size
        ([0, 1, 2], 16)
        >>> pool.release(ids[:1])
        >>> pool.alloc(1).tolist()
        [0]
        >>> pool.data[1, ids] = [5, 6, 7]
        >>> pool.a["hi"][ids].tolist()
        [5, 6, 7]
    """

    def __init__(
        self, fields: tuple[str, ...], size: int = 64, scratch: np.ndarray | None = None
    ) -> None:
        self.fields = fields
        self.scratch = scratch
        self._set_data(np.full((len(fields), size + 1), -1, dtype=I64))
        self.free = np.arange(size - 1, -1, -1, dtype=I64)  # a stack: pop from the end
        self.n_free = size

    def _set_data(self, data: np.ndarray) -> None:
        size = data.shape[1] - 1
        if self.scratch is not None:
            data[:, size] = self.scratch
        self.data = data
        self.a: dict[str, np.ndarray] = {f: data[i, :size] for i, f in enumerate(self.fields)}

    @property
    def size(self) -> int:
        return self.free.size

    @property
    def n_used(self) -> int:
        return self.size - self.n_free

    def _grow(self, need: int) -> None:
        old = self.size
        new = max(2 * old, old + need, 16)
        grown = np.full((len(self.fields), new + 1), -1, dtype=I64)
        grown[:, :old] = self.data[:, :old]
        self._set_data(grown)
        # New ids go below the current free ids so that the stack keeps popping small ids first.
        free = np.empty(new, dtype=I64)
        fresh = np.arange(new - 1, old - 1, -1, dtype=I64)
        free[: fresh.size] = fresh
        free[fresh.size : fresh.size + self.n_free] = self.free[: self.n_free]
        self.free = free
        self.n_free += fresh.size

    def alloc(self, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """``k`` ids (in ``out``, an int64 array of ``k`` elements, when given)."""
        if k > self.n_free:
            self._grow(k - self.n_free)
        top = self.free[self.n_free - k : self.n_free][::-1]
        self.n_free -= k
        if out is None:
            return top.copy()
        out[...] = top
        return out

    def release(self, ids: np.ndarray) -> None:
        k = ids.size
        self.free[self.n_free : self.n_free + k] = ids[::-1]
        self.n_free += k

    def state(self) -> PoolState:
        return PoolState({f: self.a[f] for f in self.fields}, self.free, self.n_free)

    def restore(self, state: PoolState) -> None:
        missing = set(self.fields) - set(state.fields)
        if missing:
            raise ValueError(f"saved pool state lacks fields {sorted(missing)}")
        sizes = {np.asarray(state.fields[f]).size for f in self.fields}
        if len(sizes) != 1:
            raise ValueError(f"saved pool fields differ in size: {sorted(sizes)}")
        size = sizes.pop()
        data = np.full((len(self.fields), size + 1), -1, dtype=I64)
        for i, f in enumerate(self.fields):
            data[i, :size] = np.asarray(state.fields[f], dtype=I64)
        self._set_data(data)
        self.free = np.array(state.free, dtype=I64)
        self.n_free = state.n_free


class KeyMap:
    """A sorted int64 key -> int64 value map with vectorised lookups.

    Removal leaves a tombstone (value -1) that is compacted away once tombstones outnumber live
    entries, so removals and the (common) insertion of keys larger than every stored key are
    amortised O(k); inserting keys in the middle costs one O(n) ``np.insert``. A sentinel
    entry (the largest int64, value -1) follows the last key, so a lookup is one
    ``searchsorted`` and three whole-array calls, with no bounds mask.

    Examples:
        >>> m = KeyMap()
        >>> m.assign(np.array([3, 9]), np.array([0, 1]))
        >>> m.lookup(np.array([9, 4, 3, 12])).tolist()
        [1, -1, 0, -1]
        >>> m.remove(np.array([3]))
        >>> m.lookup(np.array([3])).tolist()
        [-1]
    """

    def __init__(self) -> None:
        self.keys = np.empty(64, dtype=I64)
        self.vals = np.empty(64, dtype=I64)
        self.n = 0
        self.n_dead = 0
        self._seal()

    def _seal(self) -> None:
        """Write the sentinel after the last key (``keys``/``vals`` have room for it)."""
        self.keys[self.n] = _KEY_SENTINEL
        self.vals[self.n] = -1

    def _find(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = self.keys[: self.n].searchsorted(q)  # (the method: np.searchsorted costs more)
        return pos, self.keys[pos] == q

    def lookup(self, q: np.ndarray) -> np.ndarray:
        """The value of each key of ``q`` (-1 when absent)."""
        pos = self.keys[: self.n].searchsorted(q)  # (the method: np.searchsorted costs more)
        out = self.vals[pos]
        out[self.keys[pos] != q] = -1
        return out

    def lookup_one(self, key: int) -> int:
        """The value of one key (-1 when absent)."""
        pos = int(self.keys[: self.n].searchsorted(key))  # the sentinel answers -1
        return int(self.vals[pos]) if self.keys[pos] == key else -1

    def above_all(self, key: int | np.integer) -> bool:
        """Whether ``key`` is larger than every stored key (tombstones included): then it
        and every larger key are absent."""
        return self.n == 0 or bool(key > self.keys[self.n - 1])

    def last_key(self) -> int | None:
        """The largest stored key (tombstones included), None when empty."""
        return int(self.keys[self.n - 1]) if self.n else None

    def assign(self, q: np.ndarray, v: np.ndarray) -> None:
        """Set ``map[q[i]] = v[i]``; ``q`` must be sorted and unique."""
        if q.size == 0:
            return
        if self.n == 0 or q[0] > self.keys[self.n - 1]:  # the common case: fresh, larger ids
            self._append(q, v)
            return
        pos, found = self._find(q)
        found &= pos < self.n  # the sentinel is no entry (a key equal to it is new)
        revived = found.copy()
        revived[found] = self.vals[pos[found]] < 0
        self.n_dead -= int(revived.sum())
        self.vals[pos[found]] = v[found]
        qa, va = q[~found], v[~found]
        if qa.size == 0:
            return
        if qa[0] > self.keys[self.n - 1]:
            self._append(qa, va)
            return
        where = pos[~found]
        keys = np.insert(self.keys[: self.n], where, qa)
        vals = np.insert(self.vals[: self.n], where, va)
        self.n = keys.size
        self.keys = np.empty(max(2 * self.n, 64), dtype=I64)
        self.vals = np.empty(max(2 * self.n, 64), dtype=I64)
        self.keys[: self.n] = keys
        self.vals[: self.n] = vals
        self._seal()

    def _append(self, q: np.ndarray, v: np.ndarray) -> None:
        self._reserve(self.n + q.size + 1)
        self.keys[self.n : self.n + q.size] = q
        self.vals[self.n : self.n + q.size] = v
        self.n += q.size
        self._seal()

    def remove(self, q: np.ndarray) -> None:
        """Remove the keys of ``q`` (unique, in any order; absent ones are ignored)."""
        if q.size == 0:
            return
        pos, found = self._find(q)
        hit = pos[found]
        hit = hit[self.vals[hit] >= 0]
        self.vals[hit] = -1
        self.n_dead += hit.size
        if self.n_dead > 1024 and 2 * self.n_dead > self.n:
            keep = self.vals[: self.n] >= 0
            keys, vals = self.keys[: self.n][keep], self.vals[: self.n][keep]
            self.n = keys.size
            self.n_dead = 0
            self.keys[: self.n] = keys
            self.vals[: self.n] = vals
            self._seal()

    def _reserve(self, n: int) -> None:
        if n <= self.keys.size:
            return
        size = max(2 * self.keys.size, n)
        for name in ("keys", "vals"):
            grown = np.empty(size, dtype=I64)
            grown[: self.n] = getattr(self, name)[: self.n]
            setattr(self, name, grown)

    def state(self) -> KeyMapState:
        return KeyMapState(self.keys[: self.n].copy(), self.vals[: self.n].copy(), self.n_dead)

    def restore(self, state: KeyMapState) -> None:
        keys = np.array(state.keys, dtype=I64)
        self.n = keys.size
        self.keys = np.empty(max(2 * self.n, 64), dtype=I64)
        self.vals = np.empty(max(2 * self.n, 64), dtype=I64)
        self.keys[: self.n] = keys
        self.vals[: self.n] = np.array(state.vals, dtype=I64)
        self.n_dead = state.n_dead
        self._seal()


class DenseSet:
    """A set of integers in ``[0, universe)``: O(k) add/discard of k items, O(1) uniform draws.

    ``items[:n]`` holds the members in an arbitrary (but deterministic) order and ``pos[x]`` is
    the place of ``x`` in it (-1 when absent). Removal swaps the last members into the holes.

    Examples:
        >>> s = DenseSet(10)
        >>> s.add(np.array([4, 7, 1]))
        >>> s.discard(np.array([4, 5]))
        >>> sorted(s.members().tolist()), len(s)
        ([1, 7], 2)
    """

    def __init__(self, universe: int) -> None:
        self.items = np.empty(universe, dtype=I64)
        self.pos = np.full(universe, -1, dtype=I64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def members(self) -> np.ndarray:
        return self.items[: self.n]

    def contains(self, x: np.ndarray) -> np.ndarray:
        return self.pos[x] >= 0

    def grow(self, universe: int) -> None:
        if universe <= self.pos.size:
            return
        items = np.empty(universe, dtype=I64)
        items[: self.n] = self.items[: self.n]
        pos = np.full(universe, -1, dtype=I64)
        pos[: self.pos.size] = self.pos
        self.items, self.pos = items, pos

    def add(self, x: np.ndarray, *, unique: bool = False) -> None:
        """Add the members of ``x`` (present items are ignored; so are duplicates, unless the
        caller promises there are none with ``unique=True``)."""
        x = x[self.pos[x] < 0]
        if x.size == 0:
            return
        if not unique and x.size > 1:
            x = np.unique(x)
        k = x.size
        self.items[self.n : self.n + k] = x
        self.pos[x] = np.arange(self.n, self.n + k, dtype=I64)
        self.n += k

    def discard(self, x: np.ndarray, *, unique: bool = False) -> None:
        """Remove the members of ``x`` that are present (``unique``: ``x`` has no duplicates)."""
        p = self.pos[x]
        p = p[p >= 0]
        if p.size == 0:
            return
        if not unique:
            p = np.unique(p)
        new_n = self.n - p.size
        gone = np.zeros(p.size, dtype=bool)  # which tail slots [new_n, n) are being removed
        in_tail = p >= new_n
        gone[p[in_tail] - new_n] = True
        self.pos[self.items[p]] = -1
        holes = p[~in_tail]
        movers = self.items[new_n : self.n][~gone]  # as many as holes
        self.items[holes] = movers
        self.pos[movers] = holes
        self.n = new_n

    def clear(self) -> None:
        self.pos[self.items[: self.n]] = -1
        self.n = 0

    def state(self) -> DenseSetState:
        return DenseSetState(self.items[: self.n].copy(), self.pos.size)

    def restore(self, state: DenseSetState) -> None:
        members = np.array(state.items, dtype=I64)
        self.items = np.empty(state.universe, dtype=I64)
        self.pos = np.full(self.items.size, -1, dtype=I64)
        self.n = members.size
        self.items[: self.n] = members
        self.pos[members] = np.arange(self.n, dtype=I64)


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


def as_i64(x: object) -> np.ndarray:
    """``x`` as a 1-D int64 numpy array (no copy when it already is one)."""
    return np.asarray(x, dtype=I64).reshape(-1)


EMPTY = _empty()
