"""ReplayIndex against a plain-Python model of the ring, over random write sequences."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from splice.replay.index import ReplayIndex


class Model:
    """The ring as a list of (key, global position); trajectories = keys, in write order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pos: list[tuple[int, int]] = []  # (key, global position) of live rows
        self.count = 0

    def write(self, keys: list[int]) -> None:
        for k in keys:
            self.pos.append((k, self.count))
            self.count += 1
        self.pos = [p for p in self.pos if p[1] >= self.count - self.capacity]

    def trajectories(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for k, p in self.pos:
            out.setdefault(k, []).append(p % self.capacity)
        return out


def assert_trajectory(ix: ReplayIndex, key: int, rows: list[int]) -> None:
    """The index holds trajectory ``key`` at ``rows`` (the model's, oldest first): its keys,
    consecutive steps, the walks back and forward, and a window over it."""
    steps = [ix.describe(r) for r in rows]
    assert all(k == key for k, _ in steps)
    got = [s for _, s in steps]
    assert got == list(range(got[0], got[0] + len(got))), (key, got)
    anchor = np.full(len(rows), rows[-1], dtype=np.int64)
    back = np.arange(len(rows) - 1, -1, -1, dtype=np.int64)
    assert ix.rows_back(anchor, back).tolist() == rows
    fwd = np.full(len(rows), rows[0], dtype=np.int64)
    assert ix.rows_forward(fwd, np.arange(len(rows), dtype=np.int64)).tolist() == rows
    r = np.array(rows, dtype=np.int64)
    assert ix.steps_before(r).tolist() == list(range(len(rows)))
    assert ix.steps_after(r).tolist() == list(range(len(rows) - 1, -1, -1))
    width = len(rows) + 2
    win = ix.window_rows(r[-1:], 0, np.array([len(rows)]), width)
    assert win[0].tolist() == [*rows, -1, -1]


def batches():
    key_runs = st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 7)), min_size=1, max_size=6
    )  # (key, run length)
    return st.lists(key_runs, min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 24), writes=batches())
def test_index_matches_model(capacity: int, writes: list[list[tuple[int, int]]]) -> None:
    ix = ReplayIndex(capacity)
    model = Model(capacity)
    for runs in writes:
        keys = [k for k, n in runs for _ in range(n)]
        ix.write(np.array(keys, dtype=np.int64))
        model.write(keys)
        assert len(ix) == len(model.pos)
        assert ix.write_count == model.count
        trajs = model.trajectories()
        assert ix.num_trajectories == len(trajs)
        for key, rows in trajs.items():
            assert_trajectory(ix, key, rows)
        dead = set(range(capacity)) - {p % capacity for _, p in model.pos}
        assert all(ix.row_slot[d] < 0 for d in dead)


def test_oversized_write_keeps_the_newest_rows() -> None:
    ix = ReplayIndex(4)
    ix.write(np.array([1, 1, 2, 2, 2, 3], dtype=np.int64))
    assert (len(ix), ix.write_count, ix.lo) == (4, 6, 2)
    assert sorted(ix.describe(r) for r in range(4)) == [(2, 0), (2, 1), (2, 2), (3, 0)]


def test_rebuild_reproduces_the_structure() -> None:
    rng = np.random.default_rng(0)
    ix = ReplayIndex(50)
    for _ in range(20):
        ix.write(np.sort(rng.integers(0, 30, size=rng.integers(1, 12))).astype(np.int64))
    before = [ix.describe(r) for r in ix.live_rows().tolist()]  # write order
    other = ReplayIndex(50, row_key=ix.row_key.copy())
    other.rebuild(ix.lo, ix.write_count)
    after = [other.describe(r) for r in other.live_rows().tolist()]
    # Steps restart at 0 after a rebuild; the offsets within each trajectory are the same.
    assert [k for k, _ in before] == [k for k, _ in after]
    for key in {k for k, _ in before}:
        a = [s for k, s in before if k == key]
        b = [s for k, s in after if k == key]
        assert [x - a[0] for x in a] == [x - b[0] for x in b]


def _check_against_model(ix: ReplayIndex, model: Model) -> None:
    assert len(ix) == len(model.pos) and ix.write_count == model.count
    trajs = model.trajectories()
    assert ix.num_trajectories == len(trajs)
    for key, rows in trajs.items():
        steps = [ix.describe(r) for r in rows]
        assert {k for k, _ in steps} == {key}
        got = [s for _, s in steps]
        assert got == list(range(got[0], got[0] + len(got))), (key, got)
        r = np.array(rows, dtype=np.int64)
        assert ix.steps_before(r).tolist() == list(range(len(rows)))
        assert ix.steps_after(r).tolist() == list(range(len(rows) - 1, -1, -1))
        anchor = np.full(len(rows), rows[-1], dtype=np.int64)
        back = np.arange(len(rows) - 1, -1, -1, dtype=np.int64)
        assert ix.rows_back(anchor, back).tolist() == rows
        first = np.full(len(rows), rows[0], dtype=np.int64)
        assert ix.rows_forward(first, np.arange(len(rows), dtype=np.int64)).tolist() == rows
    dead = set(range(ix.capacity)) - {p % ix.capacity for _, p in model.pos}
    assert all(ix.row_slot[d] < 0 for d in dead)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 30), writes=batches())
def test_planned_writes_match_the_model(capacity: int, writes: list[list[tuple[int, int]]]) -> None:
    """The buffer's path: ``plan`` groups each trajectory of a batch into one run (the
    order says where every input key went), then ``write_plan`` takes the fast path."""
    ix = ReplayIndex(capacity)
    model = Model(capacity)
    for runs in writes:
        keys = np.array([k for k, n in runs for _ in range(n)], dtype=np.int64)
        plan = ix.plan(keys)
        order = np.arange(keys.size) if plan.order is None else plan.order
        assert sorted(order.tolist()) == list(range(keys.size))
        assert plan.keys.tolist() == keys[order].tolist()
        for key in set(keys.tolist()):  # each trajectory: one run, its steps in input order
            where = np.flatnonzero(plan.keys == key)
            assert where.tolist() == list(range(where[0], where[-1] + 1))
            assert np.all(np.diff(order[where]) > 0)
        starts = np.flatnonzero(np.r_[True, plan.keys[1:] != plan.keys[:-1]])
        assert plan.run_start.tolist() == starts.tolist()
        report = ix.write_plan(plan)
        model.write(plan.keys.tolist())
        n_kept = min(keys.size, capacity)
        expected_rows = [p % capacity for p in range(model.count - n_kept, model.count)]
        assert report.new_rows.tolist() == expected_rows
        assert len(set(report.touched_slots.tolist())) == report.touched_slots.size
        _check_against_model(ix, model)


def stream_writes():
    """Writes of one env's stream (keys increase, a write may continue the trajectory the
    previous one ended with), the index's fast path; sometimes a key seen before."""
    write = st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 7)), min_size=1, max_size=6
    )  # (key increment, run length)
    return st.lists(st.tuples(write, st.integers(0, 9)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 24), writes=stream_writes())
def test_stream_writes_match_the_model(
    capacity: int, writes: list[tuple[list[tuple[int, int]], int]]
) -> None:
    """One env's stream (the fast path of ``_insert``): the same trajectories, steps, walks
    and segments (maximal runs of physically consecutive rows of a trajectory) as the
    model, through evictions and the ring's seam."""
    ix = ReplayIndex(capacity)
    model = Model(capacity)
    key = 0
    for runs, revisit in writes:
        keys = []
        for step, n in runs:
            key += step
            keys += [key] * n
        if revisit == 0 and key > 3:  # now and then, a write starting with an older key
            keys = [key - 3, *keys]
        plan = ix.plan(np.array(keys, dtype=np.int64))  # (regroups a revisited key)
        report = ix.write_plan(plan)
        keys = plan.keys.tolist()
        model.write(keys)
        assert report.new_rows.tolist() == [
            p % capacity for p in range(model.count - min(len(keys), capacity), model.count)
        ]
        trajs = model.trajectories()
        assert ix.num_trajectories == len(trajs)
        segments = 0
        for k, rows in trajs.items():
            assert_trajectory(ix, k, rows)
            segments += 1 + sum(b != a + 1 for a, b in itertools.pairwise(rows))
        assert ix.seg.n_used == segments


def _assert_report_matches_model(
    report, before: dict[int, tuple[int, int, set[int]]], model: Model
) -> None:
    """What a write overwrote, as its report says, against the model: ``before`` maps each
    trajectory key to its slot, first live step and global positions before the write."""
    live = {p for _, p in model.pos}
    head, freed = {}, set()
    for slot, first, positions in before.values():
        if positions - live:  # lost rows: cut (some survive) or freed (none does)
            if positions & live:
                head[slot] = first
            else:
                freed.add(slot)
    heads = report.head_slots.tolist()
    assert len(set(heads)) == len(heads), "a trajectory reported cut twice"
    assert dict(zip(heads, report.head_old_first.tolist(), strict=True)) == head
    assert sorted(report.freed_slots.tolist()) == sorted(freed)
    gone = sorted(p for _, _, positions in before.values() for p in positions - live)
    assert report.evicted_rows.tolist() == [p % model.capacity for p in gone]


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 24), writes=batches(), stream=st.booleans())
def test_write_reports_match_the_model(
    capacity: int, writes: list[list[tuple[int, int]]], stream: bool
) -> None:
    """Each write's report (rows overwritten; trajectories cut, with their first live step
    before the write, or freed) is what the model says, for trajectories stored in one run
    or several (interleaved writes; ``stream``: increasing keys, one env's stream)."""
    ix = ReplayIndex(capacity)
    model = Model(capacity)
    key = 0
    for runs in writes:
        if stream:
            keys = []
            for step, n in runs:
                key += step % 3
                keys += [key] * n
        else:
            keys = [k for k, n in runs for _ in range(n)]
        before: dict[int, tuple[int, int, set[int]]] = {}
        for k, p in model.pos:
            slot, first = int(ix.row_slot[p % capacity]), ix.describe(p % capacity)[1]
            before.setdefault(k, (slot, first, set()))[2].add(p)
        report = ix.write_plan(ix.plan(np.array(keys, dtype=np.int64)))
        model.write(ix.plan(np.array(keys, dtype=np.int64)).keys.tolist())
        _assert_report_matches_model(report, before, model)
