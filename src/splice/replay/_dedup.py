"""Next observations stored once: the replay storage's "shared next" column kind.

A collector batch holds every observation twice: ``obs`` (entering step ``t``) and
``("next", obs)`` (after it), and within an episode ``("next", obs)`` of step ``t`` *is* ``obs``
of step ``t + 1``. A storage keeps a pair ``(k, ("next", *k))`` as the ``k`` column plus, per
row, a *slot*:

* ``FROM_NEXT_ROW`` (-1): the row's next value is ``k`` of the physically next row,
  ``(row + 1) % capacity``;
* ``>= 0``: the row's next value is stored in the pair's *pool* at that slot;
* ``NO_VALUE`` (-2): the row holds nothing (never written, or dropped on reopening).

**The rule.** A write of rows ``r_0, ..., r_{n-1}`` (consecutive in the ring) marks ``r_i``
``FROM_NEXT_ROW`` iff ``i < n - 1`` and the bytes of ``("next", k)[i]`` equal the bytes of
``k[i + 1]`` (compared as raw bytes: -0.0 is not 0.0, and NaNs with the same payload are
equal); every other row keeps its next value in the pool. So episode ends, collector cuts, a
writer's last step and any step where the data says otherwise are stored; nothing is assumed
about what the values mean.

**Why reading is exact.** A row's ``FROM_NEXT_ROW`` value is read from global write position
``g + 1`` while position ``g`` is live. The ring overwrites positions in increasing order, so
``g + 1`` is overwritten only after ``g`` was (or in the same write), and then the row at
``g`` is not live any more. Rows that reopening drops (a write interrupted by a kill) are the
oldest ones, a prefix in write order, so a surviving row's successor survives too. In-place
writes keep the rule by storing a row's next value before the row after it changes. The pool
slots a write allocates are free ones or the ones of the rows it overwrites, never a slot a
surviving row points at. Hence the sampled values are the bytes the storage was given, as if
both columns were stored (the property tests compare against a storage that stores both).

Examples:
    >>> import numpy as np, torch
    >>> pair = SharedNext(
    ...     ("obs",), ("next", "obs"), np.full(4, NO_VALUE), torch.empty(0, 1), resize_in_memory
    ... )
    >>> obs = torch.tensor([[0.0], [1.0], [2.0], [7.0]])
    >>> nxt = torch.tensor([[1.0], [2.0], [3.0], [8.0]])  # step 2 ended: 3 is a final obs
    >>> pair.write(np.arange(4), obs, nxt)
    >>> pair.slots.tolist(), pair.pool_rows_used
    ([-1, -1, 0, 1], 2)
    >>> pair.gather(torch.tensor([0, 2, 3]), obs).flatten().tolist()
    [1.0, 3.0, 8.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from splice._gather import take_rows
from splice.layout import Key
from splice.replay._structures import I64

__all__ = [
    "FROM_NEXT_ROW",
    "NO_VALUE",
    "SharedNext",
    "resize_in_memory",
    "rows_equal",
]

FROM_NEXT_ROW = -1
NO_VALUE = -2
#: Rows compared or copied per chunk when a whole column is processed (bounded extra memory).
CHUNK = 4096

#: ``resize(pool, rows)``: a pool of ``rows`` rows holding the old pool's rows first.
Resize = Callable[[Tensor, int], Tensor]


def resize_in_memory(pool: Tensor, rows: int) -> Tensor:
    """A new in-memory pool of ``rows`` rows (same dtype, shape and device), the old rows
    copied to its start."""
    out = pool.new_empty((rows, *pool.shape[1:]))
    out[: pool.shape[0]] = pool
    return out


def _words(x: Tensor) -> Tensor:
    """``x`` (``[n, ...]``) as ``[n, w]`` integers holding its raw bytes (widest that fits)."""
    n = x.shape[0]
    raw = x.contiguous().reshape(n, -1).view(torch.uint8)
    width = raw.shape[1]
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if width % size == 0:
            return raw.view(dtype)
    return raw


def rows_equal(a: Tensor, b: Tensor) -> np.ndarray:
    """``[n]`` bool: whether row ``i`` of ``a`` and of ``b`` hold the same bytes.

    Examples:
        >>> nan = float("nan")
        >>> rows_equal(torch.tensor([0.0, -0.0, nan]), torch.tensor([0.0, 0.0, nan]))
        array([ True, False,  True])
    """
    if a.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    return (_words(a) == _words(b)).all(1).cpu().numpy()


class SharedNext:
    """One ``(k, ("next", *k))`` pair stored once (see the module docs).

    Args:
        obs_key: ``k``.
        next_key: ``("next", *k)``.
        slots: int64 ``[capacity]``, each row's slot (may be a memory-mapped file).
        pool: ``[P, *per-step shape]`` rows holding stored next values (may be a file).
        resize: how to grow the pool (:func:`resize_in_memory`, or a file-backed one).
    """

    #: Pool growth factor: a pool is at most 25% larger than it ever needed (and never has
    #: more rows than the storage).
    GROWTH = 1.25

    def __init__(
        self, obs_key: Key, next_key: Key, slots: np.ndarray, pool: Tensor, resize: Resize
    ) -> None:
        self.obs_key, self.next_key = obs_key, next_key
        self.slots, self.pool, self._resize = slots, pool, resize
        self.capacity = slots.size
        self._free = np.empty(0, dtype=I64)  # a stack of free slots: pop from the end
        self._n_free = 0
        self._rebuild_free(np.unique(slots[slots >= 0]))

    # ------------------------------------------------------------------ size
    @property
    def pool_rows_used(self) -> int:
        """Pool rows holding a live row's next value."""
        return self.pool.shape[0] - self._n_free

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the pool and the slots."""
        return self.pool.numel() * self.pool.element_size() + self.slots.nbytes

    # ------------------------------------------------------------------ slots
    def _alloc(self, k: int) -> np.ndarray:
        if k > self._n_free:
            size = self.pool.shape[0]
            need = size + k - self._n_free
            # Live rows hold at most one slot each: a pool never needs more than capacity.
            grown = max(need, min(max(math.ceil(size * self.GROWTH), 16), self.capacity))
            self.pool = self._resize(self.pool, grown)
            fresh = np.arange(grown - 1, size - 1, -1, dtype=I64)
            free = np.empty(grown, dtype=I64)
            free[: fresh.size] = fresh
            free[fresh.size : fresh.size + self._n_free] = self._free[: self._n_free]
            self._free, self._n_free = free, self._n_free + fresh.size
        ids = self._free[self._n_free - k : self._n_free][::-1].copy()
        self._n_free -= k
        return ids

    def _release(self, ids: np.ndarray) -> None:
        k = ids.size
        self._free[self._n_free : self._n_free + k] = ids
        self._n_free += k

    def recover(self, live_rows: np.ndarray) -> None:
        """Rebuild the free slots from ``live_rows`` (the rows holding data); other rows are
        marked ``NO_VALUE``.

        Raises:
            ValueError: a live row points at a slot outside the pool.
        """
        live = np.zeros(self.capacity, dtype=bool)
        live[live_rows] = True
        self.slots[~live] = NO_VALUE
        used = self.slots[live_rows]
        used = used[used >= 0]
        if used.size and (
            int(used.max()) >= self.pool.shape[0] or np.unique(used).size != used.size
        ):
            raise ValueError(f"key {self.next_key}: the stored slots do not fit the pool")
        self._rebuild_free(used)

    def _rebuild_free(self, used: np.ndarray) -> None:
        size = self.pool.shape[0]
        taken = np.zeros(size, dtype=bool)
        taken[used[used < size]] = True
        free = np.flatnonzero(~taken)[::-1].astype(I64)
        self._free = np.empty(size, dtype=I64)
        self._free[: free.size] = free
        self._n_free = free.size

    # ------------------------------------------------------------------ writes
    def write(self, rows: np.ndarray, obs: Tensor, nxt: Tensor) -> None:
        """Write the next values ``nxt`` of rows ``rows`` (consecutive ring rows, in write
        order) whose own values are ``obs``."""
        old = self.slots[rows]
        self._release(old[old >= 0])
        n = rows.size
        keep = np.ones(n, dtype=bool)
        keep[:-1] = ~rows_equal(nxt[:-1], obs[1:])
        self._store(rows, keep, nxt)

    def _store(self, rows: np.ndarray, keep: np.ndarray, nxt: Tensor) -> None:
        """Rows ``rows[keep]`` get pool slots holding ``nxt[keep]``; the others read from the
        next row."""
        picked = np.flatnonzero(keep)
        ids = self._alloc(picked.size)
        if picked.size:
            source = take_rows(nxt, torch.from_numpy(picked).to(nxt.device))
            self.pool[torch.from_numpy(ids).to(self.pool.device)] = source.to(self.pool.device)
        slots = np.full(rows.size, FROM_NEXT_ROW, dtype=I64)
        slots[picked] = ids
        self.slots[rows] = slots

    def before_obs_write(self, rows: np.ndarray, obs_column: Tensor) -> None:
        """Rows whose next value is read from one of ``rows`` get it stored first (an in-place
        write of ``k`` at ``rows`` follows)."""
        before = (np.unique(rows) - 1) % self.capacity
        before = before[self.slots[before] == FROM_NEXT_ROW]
        if before.size == 0:
            return
        ids = self._alloc(before.size)
        after = torch.from_numpy((before + 1) % self.capacity).to(obs_column.device)
        self.pool[torch.from_numpy(ids).to(self.pool.device)] = take_rows(obs_column, after)
        self.slots[before] = ids

    def set_next(self, rows: np.ndarray, values: Tensor) -> None:
        """In-place write of next values at (live) ``rows``."""
        unique = np.unique(rows)
        need = unique[self.slots[unique] < 0]
        if need.size:
            self.slots[need] = self._alloc(need.size)
        where = torch.from_numpy(self.slots[rows]).to(self.pool.device)
        self.pool[where] = values.to(self.pool.device)

    def load(self, live_rows: np.ndarray, obs_column: Tensor, next_column: Tensor) -> None:
        """Store the next values of ``live_rows`` (oldest first: consecutive global positions)
        given as a whole ``[capacity, ...]`` column, by the rule of a write; every other row
        holds nothing afterwards."""
        self.slots[:] = NO_VALUE
        self.recover(live_rows[:0])
        device = obs_column.device
        for lo in range(0, live_rows.size, CHUNK):
            rows = live_rows[lo : lo + CHUNK]
            after = live_rows[lo + 1 : lo + CHUNK + 1]
            nxt = take_rows(next_column, torch.from_numpy(rows).to(next_column.device))
            keep = np.ones(rows.size, dtype=bool)
            if after.size:
                obs = take_rows(obs_column, torch.from_numpy(after).to(device))
                keep[: after.size] = ~rows_equal(nxt[: after.size].to(device), obs)
            self._store(rows, keep, nxt)

    # ------------------------------------------------------------------ reads
    def gather(self, rows: Tensor, obs_column: Tensor) -> Tensor:
        """The next values of ``rows`` (int64, CPU, rows holding data)."""
        r = rows.numpy()
        slot = self.slots[r]
        after = r + 1
        after[after == self.capacity] = 0
        device = obs_column.device
        out = take_rows(obs_column, torch.from_numpy(after).to(device))
        stored = np.flatnonzero(slot >= 0)
        if stored.size:
            from_pool = take_rows(self.pool, torch.from_numpy(slot[stored]).to(device))
            out[torch.from_numpy(stored).to(device)] = from_pool
        return out

    def column(self, obs_column: Tensor) -> Tensor:
        """The whole ``[capacity, ...]`` next column (rows holding nothing read as the next
        row's ``k``)."""
        out = torch.empty_like(obs_column)
        for lo in range(0, self.capacity, CHUNK):
            rows = torch.arange(lo, min(lo + CHUNK, self.capacity))
            out[lo : lo + rows.numel()] = self.gather(rows, obs_column)
        return out
