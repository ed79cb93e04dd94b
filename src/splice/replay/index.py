"""``ReplayIndex``: which trajectory and step every stored row holds, maintained on each write.

The storage is a ring of ``capacity`` rows. Every write lands at *global positions*
``write_count, write_count + 1, ...`` (row = position % capacity); the live rows are the global
positions ``[lo, write_count)``. For each live row the index keeps its trajectory *slot* and
its *step* within the trajectory, and groups the rows of a trajectory into *segments*: maximal
runs of physically consecutive rows holding consecutive steps of one trajectory. Segments of
one trajectory form a doubly linked list (``back``/``fwd``), so a slice that spans several
collector chunks (stored far apart) is found by following at most one link per chunk.

Every write is O(batch):

* **eviction** — the rows about to be overwritten are the oldest ones, so each trajectory
  loses a *prefix* of its live steps: its first live step moves forward (or the trajectory is
  dropped when nothing of it survives). The surviving tail stays sampleable.
* **insertion** — rows are grouped into runs of one trajectory; a run continues its
  trajectory's step count, extends the trajectory's last segment when it is physically
  adjacent to it (a single-env stream keeps one segment per episode) and otherwise starts a new
  segment linked to the previous one.

Trajectories are identified by an int64 *key*: the collector's trajectory id, or a synthetic
id when boundaries come from end-of-trajectory flags. Keys are mapped to dense slots that are
recycled once a trajectory has no live row left.

Examples:
    >>> import numpy as np
    >>> ix = ReplayIndex(capacity=6)
    >>> _ = ix.write(np.array([7, 7, 7, 8]))  # trajectory 7 (3 steps) then 8 (1 step)
    >>> _ = ix.write(np.array([8, 7, 7]))  # the ring wraps: the oldest row (7, step 0) goes
    >>> ix.lo, ix.write_count
    (1, 7)
    >>> [ix.describe(row) for row in range(6)]
    [(7, 4), (7, 1), (7, 2), (8, 0), (8, 1), (7, 3)]
    >>> ix.rows_back(np.array([0]), np.array([3])).tolist()  # 3 steps before (7, 4): (7, 1)
    [1]
    >>> ix.window_rows(np.array([0]), 1, np.array([3]), 4).tolist()  # 3 steps ending at (7, 3)
    [[1, 2, 5, -1]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splice.replay._structures import EMPTY, I64, KeyMap, KeyMapState, Pool, PoolState

__all__ = ["IndexState", "ReplayIndex", "WriteReport"]

_TRAJ_FIELDS = ("key", "first", "last", "first_row", "last_row", "last_seg", "gen")
_SEG_FIELDS = ("lo", "hi", "back", "fwd")


@dataclass(frozen=True)
class WriteReport:
    """What one write changed, for the samplers to update their own structures in O(batch).

    Attributes:
        evicted_rows: rows that stopped being live (overwritten), oldest first.
        head_slots: trajectories that lost their oldest steps but still have live rows.
        head_old_first: the first live step of each of ``head_slots`` before the write.
        freed_slots: trajectories that have no live row left (their slot may be reused).
        new_rows: the rows written, in write order.
        touched_slots: the trajectories that received rows.
    """

    evicted_rows: np.ndarray
    head_slots: np.ndarray
    head_old_first: np.ndarray
    freed_slots: np.ndarray
    new_rows: np.ndarray
    touched_slots: np.ndarray


@dataclass
class IndexState:
    """Everything :class:`ReplayIndex` holds (see :meth:`ReplayIndex.state`)."""

    row_slot: np.ndarray
    row_step: np.ndarray
    row_seg: np.ndarray
    row_key: np.ndarray
    write_count: int
    lo: int
    traj: PoolState
    seg: PoolState
    keys: KeyMapState


class ReplayIndex:
    """The incremental trajectory index of a ring of ``capacity`` rows (see module docs).

    Args:
        capacity: number of rows of the ring.
        row_key: optional int64 array of ``capacity`` elements to hold each row's trajectory
            key (a memory-mapped storage passes a file-backed array so the keys survive a
            crash and the index can be rebuilt from them).
    """

    def __init__(self, capacity: int, row_key: np.ndarray | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.row_key = row_key if row_key is not None else np.full(capacity, -1, dtype=I64)
        self.reset()

    def reset(self) -> None:
        """Forget everything (the rows' keys are left as they are)."""
        C = self.capacity
        self.row_slot = np.full(C, -1, dtype=I64)
        self.row_step = np.zeros(C, dtype=I64)
        self.row_seg = np.full(C, -1, dtype=I64)
        self.traj = Pool(_TRAJ_FIELDS)
        self.traj.a["gen"].fill(0)
        self.seg = Pool(_SEG_FIELDS)
        self.keys = KeyMap()
        self.write_count = 0
        self.lo = 0

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self.write_count - self.lo

    @property
    def num_trajectories(self) -> int:
        """Trajectories with at least one live row."""
        return self.traj.n_used

    def live_rows(self) -> np.ndarray:
        """Physical rows of the live data, oldest first."""
        return np.arange(self.lo, self.write_count, dtype=I64) % self.capacity

    def live_slots(self) -> np.ndarray:
        """Slots of the live trajectories (ascending)."""
        return np.flatnonzero(self.traj.a["key"] >= 0).astype(I64)

    def describe(self, row: int) -> tuple[int, int]:
        """``(trajectory key, step)`` of a live row (steps count from the trajectory's first
        stored step; they stay put when older steps are overwritten)."""
        slot = int(self.row_slot[row])
        if slot < 0:
            raise IndexError(f"row {row} holds no live data")
        return int(self.traj.a["key"][slot]), int(self.row_step[row])

    def global_position(self, rows: np.ndarray) -> np.ndarray:
        """The global write position of live ``rows``."""
        return self.write_count - 1 - ((self.write_count - 1 - rows) % self.capacity)

    def steps_before(self, rows: np.ndarray) -> np.ndarray:
        """How many live steps of its trajectory precede each row (0 at the first live step)."""
        return self.row_step[rows] - self.traj.a["first"][self.row_slot[rows]]

    def steps_after(self, rows: np.ndarray) -> np.ndarray:
        """How many steps of its trajectory follow each row (0 at the last stored step)."""
        return self.traj.a["last"][self.row_slot[rows]] - self.row_step[rows]

    def rows_back(self, anchor: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """The row ``offset`` steps before ``anchor`` in the same trajectory.

        ``offset`` must not exceed :meth:`steps_before` (the walk never leaves live data). Cost:
        one vectorised pass per segment boundary crossed (usually zero or one).
        """
        S = self.seg.a
        seg = self.row_seg[anchor]
        span = anchor - S["lo"][seg]
        out = anchor - offset
        far = offset > span
        if not far.any():
            return out
        idx = np.flatnonzero(far)
        rem = offset[idx] - span[idx] - 1
        seg = S["back"][seg[idx]]
        while True:
            hi = S["hi"][seg]
            span = hi - S["lo"][seg]
            far = rem > span
            done = ~far
            out[idx[done]] = hi[done] - rem[done]
            if not far.any():
                return out
            idx, rem, seg = idx[far], rem[far] - span[far] - 1, S["back"][seg[far]]

    def rows_forward(self, anchor: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """The row ``offset`` steps after ``anchor`` (``offset <= steps_after(anchor)``)."""
        S = self.seg.a
        seg = self.row_seg[anchor]
        span = S["hi"][seg] - anchor
        out = anchor + offset
        far = offset > span
        if not far.any():
            return out
        idx = np.flatnonzero(far)
        rem = offset[idx] - span[idx] - 1
        seg = S["fwd"][seg[idx]]
        while True:
            lo = S["lo"][seg]
            span = S["hi"][seg] - lo
            far = rem > span
            done = ~far
            out[idx[done]] = lo[done] + rem[done]
            if not far.any():
                return out
            idx, rem, seg = idx[far], rem[far] - span[far] - 1, S["fwd"][seg[far]]

    def window_rows(
        self, anchor: np.ndarray, offset: np.ndarray | int, length: np.ndarray, width: int
    ) -> np.ndarray:
        """``[len(anchor), width]`` rows: row ``i`` holds the ``length[i]`` steps that end
        ``offset[i]`` steps before ``anchor[i]``, oldest first (left-aligned), then -1."""
        j = np.arange(width, dtype=I64)
        back = (offset + length - 1)[:, None] - j  # steps before the anchor row
        valid = j < length[:, None]
        span = anchor - self.seg.a["lo"][self.row_seg[anchor]]
        if (offset + length - 1 <= span).all():  # every window lies in one segment
            rows = anchor[:, None] - back
        else:
            rows = np.broadcast_to(anchor[:, None], back.shape).copy()
            rows[valid] = self.rows_back(rows[valid], back[valid])
        rows[~valid] = -1
        return rows

    # ------------------------------------------------------------------ writes
    def write(self, keys: np.ndarray) -> WriteReport:
        """Append rows with trajectory ``keys`` (int64, write order) at the write cursor.

        When more rows than the capacity arrive, only the last ``capacity`` are kept (the
        others are counted in ``write_count`` but never live).
        """
        n = keys.size
        evicted, head_slots, head_old, freed = self._evict(n)
        if n > self.capacity:
            self.write_count += n - self.capacity
            keys = keys[n - self.capacity :]
        seam = self.capacity - self.write_count % self.capacity
        if keys.size <= seam:
            rows, touched = self._insert(keys)
        else:  # the write wraps: two physically contiguous pieces
            rows_a, touched_a = self._insert(keys[:seam])
            rows_b, touched_b = self._insert(keys[seam:])
            rows = np.concatenate([rows_a, rows_b])
            touched = np.unique(np.concatenate([touched_a, touched_b]))
        return WriteReport(evicted, head_slots, head_old, freed, rows, touched)

    def rows_for_write(self, n: int) -> np.ndarray:
        """The physical rows the next ``write`` of ``n`` keys will fill (write order)."""
        start = self.write_count + max(n - self.capacity, 0)
        return self._ring(start, min(n, self.capacity))

    def _ring(self, start: int, count: int) -> np.ndarray:
        """Physical rows of global positions ``start, ..., start + count - 1``."""
        a = start % self.capacity
        if a + count <= self.capacity:
            return np.arange(a, a + count, dtype=I64)
        return np.arange(a, a + count, dtype=I64) % self.capacity

    def _evict(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        new_lo = max(self.lo, self.write_count + n - self.capacity)
        stop = min(new_lo, self.write_count)
        if stop <= self.lo:
            self.lo = max(self.lo, new_lo)
            return EMPTY, EMPTY, EMPTY, EMPTY
        rows = self._ring(self.lo, stop - self.lo)
        slots = self.row_slot[rows]
        if (slots < 0).any():  # defensive: holes are never inside [lo, write_count)
            rows, slots = rows[slots >= 0], slots[slots >= 0]
        T, S = self.traj.a, self.seg.a
        # The last evicted row of each trajectory (its highest evicted step) is the last row
        # of one of the runs of equal slots; among those runs, keep each slot's last one.
        run_end = np.flatnonzero(slots[1:] != slots[:-1])
        cand = np.append(run_end, slots.size - 1)
        cand_slots = slots[cand]
        order = np.argsort(cand_slots, kind="stable")
        sorted_slots = cand_slots[order]
        last = np.ones(order.size, dtype=bool)
        np.not_equal(sorted_slots[1:], sorted_slots[:-1], out=last[:-1])
        uniq = sorted_slots[last]
        last_row = rows[cand[order[last]]]
        last_step = self.row_step[last_row]
        whole = last_step == T["last"][uniq]
        freed, part = uniq[whole], uniq[~whole]
        part_row = last_row[~whole]
        head_old = T["first"][part]
        T["first"][part] = last_step[~whole] + 1
        # The successor of the last evicted row becomes the trajectory's first live row.
        seg = self.row_seg[part_row]
        succ = part_row + 1
        at_end = part_row == S["hi"][seg]
        if at_end.any():
            succ[at_end] = S["lo"][S["fwd"][seg[at_end]]]
        T["first_row"][part] = succ
        # Segments whose last row goes are gone entirely; unlink them from their successors.
        ev_seg = self.row_seg[rows]
        dead = ev_seg[rows == S["hi"][ev_seg]]
        nxt = S["fwd"][dead]
        S["back"][nxt[nxt >= 0]] = -1
        self.seg.release(dead)
        if freed.size:
            self.keys.remove(np.sort(T["key"][freed]))
            T["key"][freed] = -1  # marks the slot free
            self.traj.release(freed)
        self.row_slot[rows] = -1
        self.lo = new_lo
        return rows, part, head_old, freed

    def _new_slots(self, keys: np.ndarray) -> np.ndarray:
        """Allocate and initialise slots for (unique, absent) ``keys``."""
        fresh = self.traj.alloc(keys.size)
        T = self.traj.a
        T["key"][fresh] = keys
        T["first"][fresh] = 0
        T["last"][fresh] = -1
        T["first_row"][fresh] = -1
        T["last_row"][fresh] = -1
        T["last_seg"][fresh] = -1
        T["gen"][fresh] += 1
        order = np.argsort(keys)
        self.keys.assign(keys[order], fresh[order])
        return fresh

    def _insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Insert ``keys`` at the write cursor; the rows must not cross the ring seam."""
        n = keys.size
        if n == 0:
            return EMPTY, EMPTY
        a0 = self.write_count % self.capacity
        rows = np.arange(a0, a0 + n, dtype=I64)
        brk = np.flatnonzero(keys[1:] != keys[:-1])
        run_start = np.empty(brk.size + 1, dtype=I64)
        run_start[0] = 0
        run_start[1:] = brk + 1
        run_keys = keys[run_start]
        sorted_keys = np.sort(run_keys)
        if (sorted_keys[1:] == sorted_keys[:-1]).any():
            return rows, self._insert_interleaved(keys, rows)
        # Fast path: each trajectory occupies one run of this write.
        run_len = np.empty(run_start.size, dtype=I64)
        np.subtract(run_start[1:], run_start[:-1], out=run_len[:-1])
        run_len[-1] = n - run_start[-1]
        T = self.traj.a
        slot = self.keys.lookup(run_keys)
        new = slot < 0
        if new.any():
            slot[new] = self._new_slots(run_keys[new])
            T = self.traj.a
        start_row = a0 + run_start
        end_row = start_row + run_len - 1
        step0 = T["last"][slot] + 1
        prev_row = T["last_row"][slot]
        prev_seg = T["last_seg"][slot]
        merge = (prev_row >= 0) & (prev_row == start_row - 1)
        seg = prev_seg.copy()
        fresh = ~merge
        n_fresh = int(fresh.sum())
        if n_fresh:
            ids = self.seg.alloc(n_fresh)
            seg[fresh] = ids
            S = self.seg.a
            back = prev_seg[fresh]
            S["lo"][ids] = start_row[fresh]
            S["back"][ids] = back
            S["fwd"][ids] = -1
            linked = back >= 0
            S["fwd"][back[linked]] = ids[linked]
        S = self.seg.a
        S["hi"][seg] = end_row
        self.row_slot[a0 : a0 + n] = np.repeat(slot, run_len)
        self.row_step[a0 : a0 + n] = np.repeat(step0 - run_start, run_len) + np.arange(n)
        self.row_seg[a0 : a0 + n] = np.repeat(seg, run_len)
        self.row_key[a0 : a0 + n] = keys
        if new.any():
            T["first_row"][slot[new]] = start_row[new]
        T["last"][slot] = step0 + run_len - 1
        T["last_row"][slot] = end_row
        T["last_seg"][slot] = seg
        self.write_count += n
        return rows, slot

    def _insert_interleaved(self, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """General insertion: a trajectory may occupy several runs of this write."""
        n = keys.size
        brk = np.empty(n, dtype=bool)
        brk[0] = True
        np.not_equal(keys[1:], keys[:-1], out=brk[1:])
        run_start = np.flatnonzero(brk)
        run_len = np.diff(np.append(run_start, n))
        R = run_start.size
        uk, inv = np.unique(keys[run_start], return_inverse=True)
        inv = inv.reshape(-1)
        slot_u = self.keys.lookup(uk)
        new_u = slot_u < 0
        if new_u.any():
            slot_u[new_u] = self._new_slots(uk[new_u])
        T = self.traj.a
        # Work on runs grouped by trajectory (stable: in write order within a trajectory).
        order = np.argsort(inv, kind="stable")
        g = inv[order]
        slot = slot_u[g]
        first_g = np.ones(R, dtype=bool)
        np.not_equal(g[1:], g[:-1], out=first_g[1:])
        last_g = np.ones(R, dtype=bool)
        last_g[:-1] = first_g[1:]
        length = run_len[order]
        start_row = rows[run_start[order]]
        end_row = start_row + length - 1
        excl = np.cumsum(length) - length
        group_head = np.maximum.accumulate(np.where(first_g, np.arange(R), 0))
        step0 = T["last"][slot] + 1 + excl - excl[group_head]
        prev_row = np.empty(R, dtype=I64)
        prev_row[first_g] = T["last_row"][slot[first_g]]
        prev_row[~first_g] = end_row[:-1][~first_g[1:]]
        merge = first_g & (prev_row >= 0) & (prev_row == start_row - 1)
        seg = np.empty(R, dtype=I64)
        seg[merge] = T["last_seg"][slot[merge]]
        new_seg = ~merge
        seg[new_seg] = self.seg.alloc(int(new_seg.sum()))
        S = self.seg.a  # the pool may have grown
        prev_seg = np.empty(R, dtype=I64)
        prev_seg[first_g] = T["last_seg"][slot[first_g]]
        prev_seg[~first_g] = seg[:-1][~first_g[1:]]
        ns, ps = seg[new_seg], prev_seg[new_seg]
        S["lo"][ns] = start_row[new_seg]
        S["back"][ns] = ps
        S["fwd"][ns] = -1
        S["fwd"][ps[ps >= 0]] = ns[ps >= 0]
        S["hi"][seg] = end_row
        # Per-row bookkeeping (back in write order).
        back_to_run = np.empty(R, dtype=I64)
        back_to_run[order] = np.arange(R)
        r_slot, r_step0, r_seg = slot[back_to_run], step0[back_to_run], seg[back_to_run]
        within = np.arange(n, dtype=I64) - np.repeat(run_start, run_len)
        self.row_slot[rows] = np.repeat(r_slot, run_len)
        self.row_step[rows] = np.repeat(r_step0, run_len) + within
        self.row_seg[rows] = np.repeat(r_seg, run_len)
        self.row_key[rows] = keys
        fresh_traj = T["first_row"][slot] < 0
        T["first_row"][slot[fresh_traj & first_g]] = start_row[fresh_traj & first_g]
        tail = slot[last_g]
        T["last"][tail] = step0[last_g] + length[last_g] - 1
        T["last_row"][tail] = end_row[last_g]
        T["last_seg"][tail] = seg[last_g]
        self.write_count += n
        return slot_u

    # ------------------------------------------------------------------ rebuild / persistence
    def rebuild(self, lo: int, write_count: int) -> None:
        """Recompute everything from the stored row keys of global positions
        ``[lo, write_count)`` (used when a memory-mapped buffer is reopened)."""
        self.reset()
        self.write_count = self.lo = lo
        keys = self.row_key[self._ring(lo, write_count - lo)].copy()
        self.write(keys)

    def state(self) -> IndexState:
        """The index's state (arrays not copied: save or copy them before the next write)."""
        return IndexState(
            row_slot=self.row_slot,
            row_step=self.row_step,
            row_seg=self.row_seg,
            row_key=np.asarray(self.row_key),
            write_count=self.write_count,
            lo=self.lo,
            traj=self.traj.state(),
            seg=self.seg.state(),
            keys=self.keys.state(),
        )

    def restore(self, state: IndexState) -> None:
        """Load a state taken from an index of the same capacity.

        Raises:
            ValueError: the arrays do not have this index's capacity.
        """
        for name in ("row_slot", "row_step", "row_seg", "row_key"):
            size = getattr(state, name).size
            if size != self.capacity:
                raise ValueError(f"saved index has {size} rows in {name}, not {self.capacity}")
        self.row_slot = np.array(state.row_slot, dtype=I64)
        self.row_step = np.array(state.row_step, dtype=I64)
        self.row_seg = np.array(state.row_seg, dtype=I64)
        self.row_key[:] = np.asarray(state.row_key, dtype=I64)
        self.write_count = state.write_count
        self.lo = state.lo
        self.traj.restore(state.traj)
        self.seg.restore(state.seg)
        self.keys.restore(state.keys)
