"""Small vectorised containers used by the replay index and the samplers.

All of them are plain numpy arrays plus counters, so that every operation is a handful of
whole-array numpy calls (no Python loop over elements) and their state saves to ``.npy`` files
without pickle:

* :class:`Pool` — parallel int64 arrays addressed by an id, with a free list (trajectory slots,
  segments);
* :class:`KeyMap` — a sorted map from int64 keys (trajectory ids) to slots;
* :class:`DenseSet` — a set of small integers with O(1) add/remove and O(1) uniform draws;
* :class:`Epoch` — a snapshot of items visited once each, in shuffled order (samplers
  without replacement).

Prioritised draws have their own structure, :class:`~splice.replay._sumtree.SumTree`.

Each has a typed state (``state()`` / ``restore(state)``), a dataclass that
:mod:`splice.replay._state` saves without pickle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "EMPTY",
    "I64",
    "DenseSet",
    "DenseSetState",
    "Epoch",
    "EpochState",
    "KeyMap",
    "KeyMapState",
    "Pool",
    "PoolState",
    "as_i64",
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
class EpochState:
    """:class:`Epoch`: the items of the current epoch, their tags and the cursor."""

    items: np.ndarray
    tags: np.ndarray
    cursor: int


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


class Epoch:
    """A snapshot of items, visited once each, in shuffled (or stored) order.

    Items may go stale while the epoch runs (overwritten data): :meth:`take` asks a validity
    test and skips stale ones. Items that appear during the epoch wait for the next one.

    Args:
        drop_last: an epoch ends when fewer than a full batch of items is left.

    Examples:
        >>> epoch = Epoch()
        >>> epoch.start(np.arange(5), None, None)  # in order (a generator shuffles)
        >>> epoch.take(3, lambda items, tags: items != 2).tolist()  # 2 went stale
        [0, 1, 3]
        >>> epoch.take(3, lambda items, tags: items != 2).tolist(), epoch.left
        ([4], 0)
    """

    def __init__(self, *, drop_last: bool = False) -> None:
        self.drop_last = drop_last
        self.items = EMPTY
        self.tags = EMPTY
        self.cursor = 0

    @property
    def left(self) -> int:
        """Items not visited yet (some may be stale)."""
        return self.items.size - self.cursor

    def finished(self, batch: int) -> bool:
        """Whether the epoch has nothing (or, with ``drop_last``, no full batch) left."""
        return self.left == 0 or (self.drop_last and self.left < batch)

    def start(
        self, items: np.ndarray, tags: np.ndarray | None, generator: torch.Generator | None
    ) -> None:
        """A new epoch over ``items`` (shuffled with ``generator``; in order when None)."""
        if generator is not None and items.size > 1:
            order = torch.randperm(items.size, generator=generator).numpy()
            items = items[order]
            tags = None if tags is None else tags[order]
        self.items = items
        self.tags = EMPTY if tags is None else tags
        self.cursor = 0

    def take(self, count: int, valid: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """Up to ``count`` valid items of this epoch, in epoch order.

        ``valid(items, tags)`` returns a bool mask of the items that are still valid.
        """
        got: list[np.ndarray] = []
        need = count
        while need > 0 and self.cursor < self.items.size:
            stop = min(self.cursor + need, self.items.size)
            items = self.items[self.cursor : stop]
            tags = self.tags[self.cursor : stop] if self.tags.size else EMPTY
            self.cursor = stop
            ok = items[valid(items, tags)]
            got.append(ok)
            need -= ok.size
        return np.concatenate(got) if got else EMPTY

    def state(self) -> EpochState:
        return EpochState(self.items, self.tags, self.cursor)

    def restore(self, state: EpochState) -> None:
        self.items = np.asarray(state.items, dtype=I64)
        self.tags = np.asarray(state.tags, dtype=I64)
        self.cursor = state.cursor

    def reset(self) -> None:
        self.items, self.tags, self.cursor = EMPTY, EMPTY, 0


def as_i64(x: object) -> np.ndarray:
    """``x`` as a 1-D int64 numpy array (no copy when it already is one)."""
    return np.asarray(x, dtype=I64).reshape(-1)


EMPTY = _empty()
