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
import torch

from splice.replay._structures import (
    EMPTY,
    I64,
    KeyMap,
    KeyMapState,
    Pool,
    PoolState,
)
from splice.trajectories._index import index_by_id

__all__ = ["IndexState", "ReplayIndex", "WritePlan", "WriteReport"]

_TRAJ_FIELDS = ("key", "first", "last", "first_row", "last_row", "last_seg", "gen")
_SEG_FIELDS = ("lo", "hi", "back", "fwd")
# Rows of ``Pool.data``, for multi-field reads and writes.
_KEY, _FIRST, _LAST, _FIRST_ROW, _LAST_ROW, _LAST_SEG, _GEN = range(len(_TRAJ_FIELDS))
_LO, _HI, _BACK, _FWD = range(len(_SEG_FIELDS))
#: ``first`` .. ``last_seg`` of a new trajectory. Its ``last_row`` is -2, so that
#: ``last_row + 1 == start`` (the test for "continues physically") is never true for it.
_NEW_TRAJ = np.array([0, -1, -1, -2, -1], dtype=I64)[:, None]
#: The trajectory pool's scratch column (what a read of slot -1 returns): a new trajectory's
#: fields, so that a write reads "no last step, row or segment yet" for a new key before it
#: allocates its slot.
_TRAJ_SCRATCH = np.array([-1, *_NEW_TRAJ[:, 0], 0], dtype=I64)


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class WriteReport:
    """What one write changed, for the samplers to update their own structures in O(batch).

    Attributes:
        evicted_rows: rows that stopped being live (overwritten), oldest first.
        head_slots: trajectories that lost their oldest steps but still have live rows.
        head_old_first: the first live step of each of ``head_slots`` before the write.
        freed_slots: trajectories that have no live row left (their slot may be reused).
        new_rows: the rows written, in write order.
        touched_slots: the trajectories that received rows (each once).
    """

    evicted_rows: np.ndarray
    head_slots: np.ndarray
    head_old_first: np.ndarray
    freed_slots: np.ndarray
    new_rows: np.ndarray
    touched_slots: np.ndarray


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class WritePlan:
    """How :meth:`ReplayIndex.write` will lay out a batch (see :meth:`ReplayIndex.plan`).

    Attributes:
        keys: the trajectory key of every row, in write order (each trajectory in one run).
        order: the input position of every written row (None: the input order).
        run_start: the first position of every run of ``keys``.
        run_len: the length of every run.
        run_keys: the key of every run (distinct).
        increasing: the run keys increase (one env's stream, the common case).
    """

    keys: np.ndarray
    order: np.ndarray | None
    run_start: np.ndarray
    run_len: np.ndarray
    run_keys: np.ndarray
    increasing: bool

    def min_key(self) -> int:
        """The smallest key (the runs hold every key; increasing runs start with it)."""
        return int(self.run_keys[0] if self.increasing else self.run_keys.min())


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
        # slot, step and segment of every row, as one [3, C] array (a write fills the three
        # with one numpy call); ``row_slot``, ``row_step`` and ``row_seg`` are its rows.
        self._row_info = np.empty((3, C), dtype=I64)
        self.row_slot, self.row_step, self.row_seg = self._row_info
        self.row_slot.fill(-1)
        self.row_step.fill(0)
        self.row_seg.fill(-1)
        self.traj = Pool(_TRAJ_FIELDS, scratch=_TRAJ_SCRATCH)
        self.traj.a["gen"].fill(0)
        self.seg = Pool(_SEG_FIELDS)
        self.keys = KeyMap()
        self.write_count = 0
        self.lo = 0
        #: The slot of the last trajectory a write ended with (-1: none), a hint for the next
        #: write's first key (checked against the slot's key before use).
        self._last_written = -1
        #: Scratch space, one entry per trajectory slot, for the eviction's test that the
        #: evicted runs belong to distinct trajectories (written before it is read).
        self._seen = np.empty(0, dtype=I64)

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
        if not np.count_nonzero(far):
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
            if not np.count_nonzero(far):
                return out
            idx, rem, seg = idx[far], rem[far] - span[far] - 1, S["back"][seg[far]]

    def rows_forward(self, anchor: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """The row ``offset`` steps after ``anchor`` (``offset <= steps_after(anchor)``)."""
        S = self.seg.a
        seg = self.row_seg[anchor]
        span = S["hi"][seg] - anchor
        out = anchor + offset
        far = offset > span
        if not np.count_nonzero(far):
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
            if not np.count_nonzero(far):
                return out
            idx, rem, seg = idx[far], rem[far] - span[far] - 1, S["fwd"][seg[far]]

    def window_rows(
        self,
        anchor: np.ndarray,
        offset: np.ndarray | int,
        length: np.ndarray,
        width: int,
        start: np.ndarray | int = 0,
    ) -> np.ndarray:
        """``[len(anchor), width]`` rows: row ``i`` holds the ``length[i]`` steps that end
        ``offset[i]`` steps before ``anchor[i]``, oldest first, in columns ``start[i]`` to
        ``start[i] + length[i] - 1`` (default: left-aligned), and -1 in the other columns.

        The steps must be stored: ``offset + length - 1 <= steps_before(anchor)``. Cost:
        O(rows x width), plus a pass per segment boundary a window crosses.

        Examples:
            >>> ix = ReplayIndex(capacity=8)
            >>> _ = ix.write(np.array([3, 3, 3, 3, 4]))
            >>> ix.window_rows(np.array([3, 3]), 0, np.array([2, 3]), 5, np.array([0, 2]))
            array([[ 2,  3, -1, -1, -1],
                   [-1, -1,  1,  2,  3]])
        """
        j = np.arange(width, dtype=I64) - np.reshape(start, (-1, 1))  # step within the window
        back = (offset + length - 1)[:, None] - j  # steps before the anchor row
        valid = (j >= 0) & (j < length[:, None])
        span = anchor - self.seg.a["lo"][self.row_seg[anchor]]
        if (offset + length - 1 <= span).all():  # every window lies in one segment
            rows = anchor[:, None] - back
        else:
            rows = np.broadcast_to(anchor[:, None], back.shape).copy()
            rows[valid] = self.rows_back(rows[valid], back[valid])
        rows[~valid] = -1
        return rows

    # ------------------------------------------------------------------ writes
    @staticmethod
    def plan(keys: np.ndarray) -> WritePlan:
        """How to write a batch of trajectory ``keys`` so that each trajectory of it fills
        one run of consecutive rows (the order a buffer writes its rows in). It depends on
        ``keys`` only (no index state): a buffer plans a batch before it takes its lock.

        Examples:
            >>> ix = ReplayIndex(capacity=8)
            >>> p = ix.plan(np.array([5, 6, 5, 6]))  # two trajectories, interleaved
            >>> p.keys.tolist(), p.order.tolist(), p.run_start.tolist()
            ([5, 5, 6, 6], [0, 2, 1, 3], [0, 2])
            >>> ix.plan(np.array([5, 5, 6])).order is None  # already grouped
            True
        """
        if keys.dtype != I64 or keys.ndim != 1 or not keys.flags.c_contiguous:
            keys = np.ascontiguousarray(keys, dtype=I64).reshape(-1)
        plan, split = _find_runs(keys)
        if split:  # a trajectory in several runs: regroup (stable, so steps keep their order)
            order = index_by_id(torch.from_numpy(keys)).cat_order().numpy()
            plan, _ = _find_runs(keys[order])
            plan.order = order
        return plan

    def write(self, keys: np.ndarray) -> WriteReport:
        """Append rows with trajectory ``keys`` (int64, write order) at the write cursor.

        When more rows than the capacity arrive, only the last ``capacity`` are kept (the
        others are counted in ``write_count`` but never live).

        Args:
            keys: the trajectory key of every row, in write order (a trajectory may occupy
                several runs). A caller that planned the write (:meth:`plan`: each trajectory
                in one run) calls :meth:`write_plan` instead, the fast path.
        """
        return self._write(keys, None)

    def write_plan(self, plan: WritePlan) -> WriteReport:
        """:meth:`write` the keys of ``plan`` (from :meth:`plan`) on the fast path: each
        trajectory in one run, the runs known (a few whole-array calls per batch).

        Examples:
            >>> ix = ReplayIndex(capacity=8)
            >>> report = ix.write_plan(ix.plan(np.array([5, 6, 5, 6])))
            >>> report.new_rows.tolist(), len(ix), ix.write_count
            ([0, 1, 2, 3], 4, 4)
        """
        return self._write(plan.keys, plan)

    def _write(self, keys: np.ndarray, runs: WritePlan | None) -> WriteReport:
        n = keys.size
        evicted, head_slots, head_old, freed = self._evict(n)
        if n > self.capacity:
            self.write_count += n - self.capacity
            keys = keys[n - self.capacity :]
            runs = None
        seam = self.capacity - self.write_count % self.capacity
        if keys.size <= seam:
            rows, touched = self._insert(keys, runs)
        else:  # the write wraps: two physically contiguous pieces
            rows_a, touched_a = self._insert(keys[:seam], None)
            rows_b, touched_b = self._insert(keys[seam:], None)
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
        a, count = self.lo % self.capacity, stop - self.lo
        # The evicted rows: a slice of the ring (views, no gathers) unless they wrap.
        where: slice | np.ndarray = (
            slice(a, a + count) if a + count <= self.capacity else self._ring(self.lo, count)
        )
        rows = self._ring(self.lo, count)
        slots = self.row_slot[where]
        if np.count_nonzero(slots < 0):  # defensive: holes are never inside [lo, write_count)
            keep = slots >= 0
            rows, slots, where = rows[keep], slots[keep], rows[keep]
        T, S = self.traj.a, self.seg.a
        # The last evicted row of each trajectory (its highest evicted step) is the last row
        # of one of the runs of equal slots; among those runs, keep each slot's last one.
        cand = np.empty(slots.size, dtype=bool)
        cand[-1] = True
        np.not_equal(slots[1:], slots[:-1], out=cand[:-1])
        cand = cand.nonzero()[0]
        cand_slots = slots[cand]
        # Usually each trajectory is one run here (one env's stream): the runs' slots are
        # distinct, which one scatter into a per-slot scratch array and one gather tell
        # (of several equal slots, whichever write lands, the others read another number).
        if self._seen.size < self.traj.size:
            self._seen = np.empty(self.traj.size, dtype=I64)
        at = np.arange(cand.size, dtype=I64)
        self._seen[cand_slots] = at
        if not np.count_nonzero(self._seen[cand_slots] != at):
            uniq, last_row = cand_slots, rows[cand]
        else:  # a trajectory in several runs: keep each slot's last run (a stable sort)
            order = np.argsort(cand_slots, kind="stable")
            sorted_slots = cand_slots[order]
            last = np.empty(order.size, dtype=bool)
            last[-1] = True
            np.not_equal(sorted_slots[1:], sorted_slots[:-1], out=last[:-1])
            uniq = sorted_slots[last]
            last_row = rows[cand[order[last]]]
        last_step = self.row_step[last_row]
        whole = last_step == T["last"][uniq]
        survives = ~whole
        freed, part = uniq[whole], uniq[survives]
        part_row = last_row[survives]
        head_old = T["first"][part]
        T["first"][part] = last_step[survives] + 1
        # The successor of the last evicted row becomes the trajectory's first live row.
        seg = self.row_seg[part_row]
        succ = part_row + 1
        at_end = part_row == S["hi"][seg]
        if np.count_nonzero(at_end):
            succ[at_end] = S["lo"][S["fwd"][seg[at_end]]]
        T["first_row"][part] = succ
        # Segments whose last row goes are gone entirely; unlink them from their successors
        # (a segment without one links to -1: the pool's scratch column).
        ev_seg = self.row_seg[where]
        dead = ev_seg[rows == S["hi"][ev_seg]]
        self.seg.data[_BACK][S["fwd"][dead]] = -1
        self.seg.release(dead)
        if freed.size:
            self.keys.remove(T["key"][freed])
            T["key"][freed] = -1  # marks the slot free
            self.traj.release(freed)
        self.row_slot[where] = -1
        self.lo = new_lo
        return rows, part, head_old, freed

    def _new_slots(
        self, keys: np.ndarray, *, increasing: bool = False, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Allocate slots for (unique, absent) ``keys``: their key, ``first`` (0) and
        generation are set; the other fields are the caller's to write (``_NEW_TRAJ``).
        ``increasing``: the caller knows ``keys`` increase. ``out``: where to put the slots
        (returned)."""
        fresh = self.traj.alloc(keys.size, out=out)
        T = self.traj.data
        T[_KEY][fresh] = keys
        T[_FIRST][fresh] = 0
        T[_GEN][fresh] += 1
        if increasing or keys.size == 1 or not np.count_nonzero(keys[1:] <= keys[:-1]):
            self.keys.assign(keys, fresh)
        else:
            order = np.argsort(keys)
            self.keys.assign(keys[order], fresh[order])
        return fresh

    def _insert(self, keys: np.ndarray, runs: WritePlan | None) -> tuple[np.ndarray, np.ndarray]:
        """Insert ``keys`` at the write cursor; the rows must not cross the ring seam.

        ``runs``: the runs of ``keys``, when each trajectory occupies one run.
        """
        n = keys.size
        if n == 0:
            return EMPTY, EMPTY
        a0 = self.write_count % self.capacity
        rows = np.arange(a0, a0 + n, dtype=I64)
        if runs is None:
            runs, split = _find_runs(keys)
            if split:
                return rows, self._insert_interleaved(keys, rows)
        # Each trajectory occupies one run of this write: every step below is one numpy
        # call over the runs (or the rows), whatever the number of trajectories. (1-D
        # gathers and scatters: numpy's ``a[i, idx]`` costs several times ``a[i][idx]``.)
        run_start, run_len, run_keys = runs.run_start, runs.run_len, runs.run_keys
        R = run_start.size
        T = self.traj.data
        km = self.keys
        if runs.increasing and R > 1 and km.above_all(run_keys[1]):
            # One env's stream (the common case): keys grow, so every run but the first is
            # a trajectory never seen; only the first is looked up (usually the trajectory
            # the previous write ended with: no search).
            key = int(run_keys[0])
            first_slot = self._last_written
            if first_slot < 0 or key < 0 or int(T[_KEY][first_slot]) != key:
                first_slot = km.lookup_one(key)
            return rows, self._insert_stream(keys, runs, rows, first_slot)
        slot = km.lookup(run_keys)
        # Read before new slots are allocated: a new trajectory (slot -1) reads the pool's
        # scratch column, which holds a new trajectory's fields (no last step, row or
        # segment).
        step0 = T[_LAST][slot]
        step0 += 1
        prev_seg = T[_LAST_SEG][slot]
        # Only the first run can extend its trajectory's last segment: the row before any
        # other run ends the previous run, another trajectory's.
        merge = int(T[_LAST_ROW][slot[0]]) == a0 - 1
        start_row = run_start + a0
        new = slot < 0
        if np.count_nonzero(new):
            fresh = self._new_slots(run_keys[new], increasing=runs.increasing)
            slot[new] = fresh
            T = self.traj.data  # the pool may have grown
            T[_FIRST_ROW][fresh] = start_row[new]
        end_row = start_row + run_len
        end_row -= 1
        # A new segment per run but a merged first one, linked after its trajectory's last
        # segment (if any: a link from segment -1 lands in the pool's scratch column).
        if merge:
            ids = self.seg.alloc(R - 1)
            seg = np.empty(R, dtype=I64)
            seg[0] = prev_seg[0]
            seg[1:] = ids
            lo, back = start_row[1:], prev_seg[1:]
        else:
            seg = ids = self.seg.alloc(R)
            lo, back = start_row, prev_seg
        S = self.seg.data
        S[_LO][ids] = lo
        S[_BACK][ids] = back
        S[_FWD][ids] = -1
        S[_FWD][back] = ids
        S[_HI][seg] = end_row
        # Per row: slot, step and segment, repeated from the runs in one call.
        per_run = np.empty((3, R), dtype=I64)
        per_run[0] = slot
        np.subtract(step0, start_row, out=per_run[1])  # a row's step: this + its row
        per_run[2] = seg
        self._record_rows(keys, rows, per_run, run_len, end_row)
        return rows, slot

    def _insert_stream(
        self, keys: np.ndarray, runs: WritePlan, rows: np.ndarray, first_slot: int
    ) -> np.ndarray:
        """:meth:`_insert` of one env's stream: every run but the first is a new trajectory
        (their keys increase and are above every stored key); the first continues the
        trajectory at ``first_slot`` (-1: it is new too). The general path's result, with
        the first run's reads as scalars and the new trajectories' as constants (no last
        step, no segment to link after). Returns the runs' slots."""
        run_start, run_len, run_keys = runs.run_start, runs.run_len, runs.run_keys
        R = run_start.size
        a0 = int(rows[0])
        T = self.traj.data
        tail = 0 if first_slot < 0 else 1  # runs [tail:] are new trajectories
        first_step, first_prev_seg, merge = 0, -1, False
        if tail:
            first_step = int(T[_LAST][first_slot]) + 1
            first_prev_seg = int(T[_LAST_SEG][first_slot])
            # (only the first run can extend its trajectory's last segment)
            merge = int(T[_LAST_ROW][first_slot]) == a0 - 1
        # Per run: slot, first step minus first row (a row's step: this plus its row) and
        # segment, built in place (``_record_rows`` repeats them over the rows).
        per_run = np.empty((3, R), dtype=I64)
        slot, seg = per_run[0], per_run[2]
        start_row = run_start + a0
        end_row = start_row + run_len
        end_row -= 1
        fresh = self._new_slots(run_keys[tail:], increasing=True, out=slot[tail:])
        T = self.traj.data  # the pool may have grown
        T[_FIRST_ROW][fresh] = start_row[tail:]
        if tail:
            slot[0] = first_slot
        # A new segment per run but a merged first one; only the first run's new segment
        # can follow an earlier segment of its trajectory.
        if merge:
            seg[0] = first_prev_seg
            ids = self.seg.alloc(R - 1, out=seg[1:])
            lo = start_row[1:]
        else:
            ids = self.seg.alloc(R, out=seg)
            lo = start_row
        S = self.seg.data
        S[_LO][ids] = lo
        S[_BACK][ids] = -1
        S[_FWD][ids] = -1
        if not merge and first_prev_seg >= 0:
            S[_BACK][ids[0]] = first_prev_seg
            S[_FWD][first_prev_seg] = ids[0]
        S[_HI][seg] = end_row
        np.negative(start_row, out=per_run[1])
        if first_step:
            per_run[1, 0] += first_step
        self._record_rows(keys, rows, per_run, run_len, end_row)
        return slot

    def _record_rows(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        per_run: np.ndarray,
        run_len: np.ndarray,
        end_row: np.ndarray,
    ) -> None:
        """The end of an insert of runs (each trajectory in one run): every row's slot,
        step and segment from ``per_run`` (``[3, runs]``: slot, first step minus first
        row, segment), its key, and each trajectory's last step, row and segment."""
        a0, n = int(rows[0]), keys.size
        info = per_run.repeat(run_len, axis=1)
        info[1] += rows
        self._row_info[:, a0 : a0 + n] = info
        self.row_key[a0 : a0 + n] = keys
        slot, T = per_run[0], self.traj.data
        T[_LAST][slot] = per_run[1] + end_row
        T[_LAST_ROW][slot] = end_row
        T[_LAST_SEG][slot] = per_run[2]
        self._last_written = int(slot[-1])
        self.write_count += n

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
        if np.count_nonzero(new_u):
            fresh = self._new_slots(uk[new_u])
            self.traj.data[_FIRST:_GEN, fresh] = _NEW_TRAJ
            slot_u[new_u] = fresh
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
        self.row_slot[:] = np.asarray(state.row_slot, dtype=I64)
        self.row_step[:] = np.asarray(state.row_step, dtype=I64)
        self.row_seg[:] = np.asarray(state.row_seg, dtype=I64)
        self.row_key[:] = np.asarray(state.row_key, dtype=I64)
        self.write_count = state.write_count
        self.lo = state.lo
        self.traj.restore(state.traj)
        self.seg.restore(state.seg)
        self.keys.restore(state.keys)
        self._last_written = -1


def _find_runs(keys: np.ndarray) -> tuple[WritePlan, bool]:
    """The runs of equal consecutive ``keys`` (a plan in the given order), and whether a key
    occupies several runs."""
    n = keys.size
    head = np.empty(n + 1, dtype=bool)  # True at every run's start, and at the end
    head[0] = head[n] = True
    np.not_equal(keys[1:], keys[:-1], out=head[1:n])
    edges = head.nonzero()[0]
    start = edges[:-1]
    run_keys = keys[start]
    increasing, split = True, False
    # Increasing run keys (one env's stream) are distinct; else sort to compare.
    if run_keys.size > 1 and np.count_nonzero(run_keys[1:] <= run_keys[:-1]):
        increasing = False
        ranked = np.sort(run_keys)
        split = bool(np.count_nonzero(ranked[1:] == ranked[:-1]))
    return WritePlan(keys, None, start, edges[1:] - start, run_keys, increasing), split
