"""Small vectorised containers used by the replay index and the samplers.

All of them are plain numpy arrays plus counters, so that every operation is a handful of
whole-array numpy calls (no Python loop over elements) and their state saves to ``.npy`` files
without pickle:

* :class:`Pool` — parallel int64 arrays addressed by an id, with a free list (trajectory slots,
  segments);
* :class:`KeyMap` — a sorted map from int64 keys (trajectory ids) to slots;
* :class:`DenseSet` — a set of small integers with O(1) add/remove and O(1) uniform draws;
* :class:`SegmentTree` — a wide (fan-out 16) sum- or min-tree for prioritised draws.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DenseSet", "KeyMap", "Pool", "SegmentTree"]

I64 = np.int64
State = dict[str, "np.ndarray | int | float"]


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

    def state_dict(self, prefix: str) -> State:
        out: State = {f"{prefix}{f}": self.a[f] for f in self.fields}
        out[f"{prefix}free"] = self.free
        out[f"{prefix}n_free"] = self.n_free
        return out

    def load_state_dict(self, state: State, prefix: str) -> None:
        for f in self.fields:
            self.a[f] = np.array(state[f"{prefix}{f}"], dtype=I64)
        self.free = np.array(state[f"{prefix}free"], dtype=I64)
        self.n_free = int(state[f"{prefix}n_free"])  # type: ignore[arg-type]


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

    def state_dict(self, prefix: str) -> State:
        return {
            f"{prefix}keys": self.keys[: self.n].copy(),
            f"{prefix}vals": self.vals[: self.n].copy(),
            f"{prefix}n_dead": self.n_dead,
        }

    def load_state_dict(self, state: State, prefix: str) -> None:
        keys = np.array(state[f"{prefix}keys"], dtype=I64)
        self.n = keys.size
        self.keys = np.empty(max(2 * self.n, 64), dtype=I64)
        self.vals = np.empty(max(2 * self.n, 64), dtype=I64)
        self.keys[: self.n] = keys
        self.vals[: self.n] = np.array(state[f"{prefix}vals"], dtype=I64)
        self.n_dead = int(state[f"{prefix}n_dead"])  # type: ignore[arg-type]


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

    def state_dict(self, prefix: str) -> State:
        return {f"{prefix}items": self.items[: self.n].copy(), f"{prefix}universe": self.pos.size}

    def load_state_dict(self, state: State, prefix: str) -> None:
        members = np.array(state[f"{prefix}items"], dtype=I64)
        self.items = np.empty(int(state[f"{prefix}universe"]), dtype=I64)  # type: ignore[arg-type]
        self.pos = np.full(self.items.size, -1, dtype=I64)
        self.n = members.size
        self.items[: self.n] = members
        self.pos[members] = np.arange(self.n, dtype=I64)


class SegmentTree:
    """A fan-out-64 tree of float64 leaves keeping subtree sums (or minima).

    ``set(i, v)`` costs O(k log n) for k leaves (parents are recomputed from their children,
    so rounding errors never accumulate); :meth:`find` descends the sum tree for a batch of
    prefix sums in O(batch log n). Depth for a million leaves: 4 (wide nodes: few numpy
    calls per level).

    Examples:
        >>> t = SegmentTree(40, "sum")
        >>> t.set(np.array([3, 30]), np.array([1.0, 3.0]))
        >>> t.total()
        4.0
        >>> t.find(np.array([0.5, 1.5, 3.9])).tolist()
        [3, 30, 30]
        >>> m = SegmentTree(40, "min")
        >>> m.set(np.array([3, 30]), np.array([1.0, 3.0]))
        >>> m.total()
        1.0
    """

    FANOUT = 64

    def __init__(self, n: int, op: str) -> None:
        if op not in ("sum", "min"):
            raise ValueError(f"op must be 'sum' or 'min', got {op!r}")
        self.n = n
        self.op = op
        self.fill = 0.0 if op == "sum" else np.inf
        F = self.FANOUT
        self.levels: list[np.ndarray] = []
        size = max(n, 1)
        while True:
            padded = -(-size // F) * F
            self.levels.append(np.full(padded, self.fill, dtype=np.float64))
            size = padded // F
            if size == 1:
                break
        self.levels.append(np.full(1, self.fill, dtype=np.float64))

    def _reduce(self, block: np.ndarray) -> np.ndarray:
        return block.sum(axis=1) if self.op == "sum" else block.min(axis=1)

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        if idx.size == 0:
            return
        F = self.FANOUT
        self.levels[0][idx] = values
        nodes = np.unique(idx // F)
        for depth in range(1, len(self.levels)):
            child = self.levels[depth - 1]
            block = child[(nodes * F)[:, None] + np.arange(F)]
            self.levels[depth][nodes] = self._reduce(block)
            nodes = np.unique(nodes // F)

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.levels[0][idx]

    def total(self) -> float:
        return float(self.levels[-1][0])

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each value ``u`` in ``[0, total)``, the leaf where the running sum passes ``u``."""
        F = self.FANOUT
        node = np.zeros(prefix.size, dtype=I64)
        u = prefix.astype(np.float64, copy=True)
        arange = np.arange(F)
        for depth in range(len(self.levels) - 1, 0, -1):
            base = node * F
            cums = np.cumsum(self.levels[depth - 1][base[:, None] + arange], axis=1)
            below = cums <= u[:, None]
            j = np.minimum(below.sum(axis=1), F - 1)
            u -= (cums * below).max(axis=1)  # the running sum before child j
            node = base + j
        return node

    def clear(self) -> None:
        for level in self.levels:
            level.fill(self.fill)

    def state_dict(self, prefix: str) -> State:
        return {f"{prefix}leaves": self.levels[0][: self.n].copy()}

    def load_state_dict(self, state: State, prefix: str) -> None:
        leaves = np.asarray(state[f"{prefix}leaves"], dtype=np.float64)
        self.clear()
        self.set(np.arange(leaves.size, dtype=I64), leaves)


def as_i64(x: object) -> np.ndarray:
    """``x`` as a 1-D int64 numpy array (no copy when it already is one)."""
    return np.asarray(x, dtype=I64).reshape(-1)


EMPTY = _empty()
