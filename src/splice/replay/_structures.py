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

from dataclasses import dataclass

import numpy as np

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

    Examples:
        >>> pool = Pool(("lo", "hi"), size=2)
        >>> ids = pool.alloc(3)
        >>> ids.tolist(), pool.size
        ([0, 1, 2], 16)
        >>> pool.release(ids[:1])
        >>> pool.alloc(1).tolist()
        [0]
    """

    def __init__(self, fields: tuple[str, ...], size: int = 64) -> None:
        self.fields = fields
        self.a: dict[str, np.ndarray] = {f: np.full(size, -1, dtype=I64) for f in fields}
        self.free = np.arange(size - 1, -1, -1, dtype=I64)  # a stack: pop from the end
        self.n_free = size

    @property
    def size(self) -> int:
        return self.free.size

    @property
    def n_used(self) -> int:
        return self.size - self.n_free

    def _grow(self, need: int) -> None:
        old = self.size
        new = max(2 * old, old + need, 16)
        for f in self.fields:
            grown = np.full(new, -1, dtype=I64)
            grown[:old] = self.a[f]
            self.a[f] = grown
        # New ids go below the current free ids so that the stack keeps popping small ids first.
        free = np.empty(new, dtype=I64)
        fresh = np.arange(new - 1, old - 1, -1, dtype=I64)
        free[: fresh.size] = fresh
        free[fresh.size : fresh.size + self.n_free] = self.free[: self.n_free]
        self.free = free
        self.n_free += fresh.size

    def alloc(self, k: int) -> np.ndarray:
        if k > self.n_free:
            self._grow(k - self.n_free)
        ids = self.free[self.n_free - k : self.n_free][::-1].copy()
        self.n_free -= k
        return ids

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
        for f in self.fields:
            self.a[f] = np.array(state.fields[f], dtype=I64)
        self.free = np.array(state.free, dtype=I64)
        self.n_free = state.n_free


class KeyMap:
    """A sorted int64 key -> int64 value map with vectorised lookups.

    Removal leaves a tombstone (value -1) that is compacted away once tombstones outnumber live
    entries, so removals and the (common) insertion of keys larger than every stored key are
    amortised O(k); inserting keys in the middle costs one O(n) ``np.insert``.

    Examples:
        >>> m = KeyMap()
        >>> m.assign(np.array([3, 9]), np.array([0, 1]))
        >>> m.lookup(np.array([9, 4, 3])).tolist()
        [1, -1, 0]
        >>> m.remove(np.array([3]))
        >>> m.lookup(np.array([3])).tolist()
        [-1]
    """

    def __init__(self) -> None:
        self.keys = np.empty(64, dtype=I64)
        self.vals = np.empty(64, dtype=I64)
        self.n = 0
        self.n_dead = 0

    def _find(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = self.keys[: self.n]
        pos = np.searchsorted(keys, q)
        found = pos < self.n
        found[found] = keys[pos[found]] == q[found]
        return pos, found

    def lookup(self, q: np.ndarray) -> np.ndarray:
        """The value of each key of ``q`` (-1 when absent)."""
        pos, found = self._find(q)
        out = np.full(q.size, -1, dtype=I64)
        out[found] = self.vals[pos[found]]
        return out

    def assign(self, q: np.ndarray, v: np.ndarray) -> None:
        """Set ``map[q[i]] = v[i]``; ``q`` must be sorted and unique."""
        if q.size == 0:
            return
        if self.n == 0 or q[0] > self.keys[self.n - 1]:  # the common case: fresh, larger ids
            self._reserve(self.n + q.size)
            self.keys[self.n : self.n + q.size] = q
            self.vals[self.n : self.n + q.size] = v
            self.n += q.size
            return
        pos, found = self._find(q)
        revived = found.copy()
        revived[found] = self.vals[pos[found]] < 0
        self.n_dead -= int(revived.sum())
        self.vals[pos[found]] = v[found]
        qa, va = q[~found], v[~found]
        if qa.size == 0:
            return
        if self.n == 0 or qa[0] > self.keys[self.n - 1]:
            self._reserve(self.n + qa.size)
            self.keys[self.n : self.n + qa.size] = qa
            self.vals[self.n : self.n + qa.size] = va
            self.n += qa.size
            return
        where = pos[~found]
        keys = np.insert(self.keys[: self.n], where, qa)
        vals = np.insert(self.vals[: self.n], where, va)
        self.n = keys.size
        self.keys = np.empty(max(2 * self.n, 64), dtype=I64)
        self.vals = np.empty(max(2 * self.n, 64), dtype=I64)
        self.keys[: self.n] = keys
        self.vals[: self.n] = vals

    def remove(self, q: np.ndarray) -> None:
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
    """Non-negative float64 weights, their sum, minimum and batched prefix-sum search.

    Built for prioritised sampling: :meth:`find` maps uniform masses in ``[0, total)`` to
    leaves in proportion to their weight. Leaves are grouped in blocks of ``FANOUT``; each
    block keeps the running sums of its children (``prefix``), and the block sums are the
    weights of the level above, until a level has at most ``TOP`` blocks (a million leaves
    make one level of 31,250 blocks). A search sorts its masses (so that memory is walked
    in order), ``np.searchsorted``s them into the running sum of the top (recomputed only
    after a change, O(``TOP``)), then, per level, gathers each query's block of running
    sums as one row and picks the first child whose running sum exceeds what is left of the
    query: a handful of whole-array numpy calls per level, no Python loop over queries.
    Zero-weight leaves are never found.

    :meth:`set` recomputes the running sums (and positive minima) of the changed blocks at
    every level: O(k * FANOUT) per level for k leaves. The running sums of the changed
    blocks are one flat ``cumsum`` (numpy's ``cumsum`` along short rows is several times
    slower) minus each block's start, so they carry a rounding error of about 1e-16 times
    the sum of the blocks changed together: a leaf lighter than that is drawn less often
    than its weight says, or never.

    Examples:
        >>> t = SumTree(40)
        >>> t.set(np.array([3, 30]), np.array([1.0, 3.0]))
        >>> t.total(), t.min()
        (4.0, 1.0)
        >>> t.find(np.array([0.5, 1.5, 3.9])).tolist()
        [3, 30, 30]
    """

    FANOUT = 32
    TOP = 1 << 15

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
        self._cum: np.ndarray | None = None  # running sum of the top, None after a change
        self._last = 0  # the last top node with a positive weight
        self._min: float | None = None

    @property
    def top(self) -> np.ndarray:
        return self.weights[-1]

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set the weights of leaves ``idx`` (with repeated leaves, the last value wins)."""
        if idx.size == 0:
            return
        F = self.FANOUT
        idx, values = last_of_each(idx, np.broadcast_to(values, idx.shape))
        self.weights[0][idx] = values
        blocks = _distinct_sorted(idx // F)
        for depth, prefix in enumerate(self.prefix):
            rows = self.weights[depth].reshape(-1, F)[blocks]
            running = np.cumsum(rows.ravel()).reshape(rows.shape)
            running[1:] -= running[:-1, -1:].copy()  # each block from 0
            prefix[blocks] = running
            self.weights[depth + 1][blocks] = running[:, -1]
            if depth == 0:
                least = np.where(rows > 0, rows, np.inf)
            else:
                least = self.mins[depth - 1].reshape(-1, F)[blocks]
            # (``minimum.reduceat`` over the flat rows: ``min(axis=1)`` on short rows is
            # slower.)
            starts = np.arange(0, least.size, F)
            self.mins[depth][blocks] = np.minimum.reduceat(least.ravel(), starts)
            blocks = _distinct_sorted(blocks // F)
        self._cum = self._min = None

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.weights[0][idx]

    def _running(self) -> np.ndarray:
        if self._cum is None:
            self._cum = np.cumsum(self.top)
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
        """For each mass ``u`` in ``[0, total)``: the leaf where the running sum passes ``u``."""
        F = self.FANOUT
        order = np.argsort(mass)
        cum = self._running()
        node = np.searchsorted(cum, mass[order], side="right")
        np.minimum(node, self._last, out=node)  # a mass rounded up to the total
        rest = mass[order] - (cum[node] - self.top[node])  # the mass left inside the node
        pick = np.arange(node.size)
        for prefix in reversed(self.prefix):
            rows = prefix[node]
            # Rounding may leave ``rest`` at or past the block's sum: keep it below, so the
            # first running sum above it is a positive child.
            np.minimum(rest, np.nextafter(rows[:, -1], 0.0), out=rest)
            child = np.argmax(rows > rest[:, None], axis=1)
            rest -= np.where(child > 0, rows[pick, child - 1], 0.0)
            np.maximum(rest, 0.0, out=rest)
            node = node * F + child
        out = np.empty_like(node)
        out[order] = node
        return out

    def clear(self) -> None:
        for level in self.weights + self.prefix:
            level.fill(0.0)
        for level in self.mins:
            level.fill(np.inf)
        self._cum = self._min = None

    def state(self) -> SumTreeState:
        return SumTreeState(self.weights[0][: self.n].copy())

    def restore(self, state: SumTreeState) -> None:
        leaves = np.asarray(state.leaves, dtype=np.float64)
        if leaves.size != self.n:
            raise ValueError(f"saved tree has {leaves.size} leaves, this one {self.n}")
        self.clear()
        self.set(np.arange(leaves.size, dtype=I64), leaves)


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


def _distinct_sorted(x: np.ndarray) -> np.ndarray:
    """The distinct values of a sorted array."""
    if x.size == 0:
        return x
    first = np.empty(x.size, dtype=bool)
    first[0] = True
    np.not_equal(x[1:], x[:-1], out=first[1:])
    return x[first]


def _whole(size: int, block: int) -> int:
    """``size`` rounded up to whole blocks."""
    return -(-size // block) * block


def as_i64(x: object) -> np.ndarray:
    """``x`` as a 1-D int64 numpy array (no copy when it already is one)."""
    return np.asarray(x, dtype=I64).reshape(-1)


EMPTY = _empty()
