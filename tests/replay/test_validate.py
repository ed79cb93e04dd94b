"""Nothing a buffer reads back is trusted (issue 11, defects 2, 7 and 12's file errors).

``loads``, ``load_state_dict`` and the reopening of a ``LazyMemmapStorage`` directory check
every field, file size, dtype, the index against the stored trajectory keys, the keys against
the stored ids or end flags and the sampler's saved structures against the index, before
anything changes; a bad input is a ``ValueError`` naming the file (or state-dict entry) and the
field, and the target buffer — and, for a memory-mapped one, its files — stays as it was.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splice import split_trajectories
from splice.layout import DONE, TRAJ_IDS
from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.replay._persist import check_snapshot, from_state_dict
from splice.replay._validate import Source, check_index
from splice.testing import SyntheticStream

CAPACITY = 60

SAMPLERS: dict[str, Callable[[], object]] = {
    "slice": lambda: SliceSampler(slice_len=3, seed=1),
    "transition": lambda: SliceSampler(slice_len=3, weighting="transition", seed=1),
    "without": lambda: SliceSamplerWithoutReplacement(slice_len=3, seed=1),
    "prioritized-slice": lambda: PrioritizedSliceSampler(slice_len=3, strict_length=False, seed=1),
    "prioritized": lambda: PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5, seed=1),
    "steps-without": lambda: SamplerWithoutReplacement(seed=1),
    "random": lambda: RandomSampler(seed=1),
}


def make(sampler: str, storage: str, path: Path | None = None) -> ReplayBuffer:
    st_ = (
        LazyTensorStorage(CAPACITY)
        if storage == "memory"
        else LazyMemmapStorage(CAPACITY, scratch_dir=path)
    )
    return ReplayBuffer(storage=st_, sampler=SAMPLERS[sampler](), batch_size=6)  # type: ignore[arg-type]


def fill(rb: ReplayBuffer, seed: int, chunks: int = 4) -> ReplayBuffer:
    stream = SyntheticStream(3, 5.0, seed=seed, labels=True, first_id=1000 * seed)
    for _ in range(chunks):
        rb.extend(stream.chunk(8))  # 96 steps into 60: wrapped
    s = rb.sample()
    rb.update_priority(s["index"], torch.rand(s["index"].shape))
    rb.sample()  # an epoch under way for the samplers without replacement
    return rb


def data_dir(dump: Path) -> Path:
    """The directory of a dump's files (``buffer.json`` names it; before dumps were atomic,
    the dump directory itself: the tests also run against that format)."""
    name = json.loads((dump / "buffer.json").read_text()).get("data")
    return dump / name if isinstance(name, str) else dump


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def edit_npy(dump: Path, group: str, name: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    path = data_dir(dump) / group / f"{name}.npy"
    np.save(path, change(np.load(path)), allow_pickle=False)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:10])


# (sampler, corruption, what the error names). Each corruption edits a good dump.
def _swap_two_slots(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    live = np.flatnonzero(out >= 0)
    first, other = out[live[0]], out[live][out[live] != out[live[0]]][0]
    out[out == first], out[a == other] = other, first
    return out


CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "column truncated": (
        "slice",
        lambda d: truncate(data_dir(d) / "storage" / "col_000.bin"),
        r"col_000\.bin: expected \d+ bytes, found 10",
    ),
    "column missing": (
        "slice",
        lambda d: (data_dir(d) / "storage" / "col_003.bin").unlink(),
        r"col_003\.bin: missing",
    ),
    "pickled npy": (
        "slice",
        lambda d: np.save(
            data_dir(d) / "index" / "row_slot.npy", np.array([object()] * 3), allow_pickle=True
        ),
        r"row_slot\.npy: not a readable \.npy array",
    ),
    "listed npy missing": (
        "slice",
        lambda d: (data_dir(d) / "index" / "traj.free.npy").unlink(),
        r"traj\.free\.npy: missing",
    ),
    "float row_step": (
        "slice",
        lambda d: edit_npy(d, "index", "row_step", lambda a: a.astype(np.float64)),
        r"row_step\.npy: expected a 1-D integer array",
    ),
    "garbage row_slot": (
        "slice",
        lambda d: edit_npy(d, "index", "row_slot", lambda a: np.full_like(a, 7)),
        r"row_slot\.npy: .*slot",
    ),
    "two trajectories swap slots": (
        "transition",
        lambda d: edit_npy(d, "index", "row_slot", _swap_two_slots),
        r"traj\.fields\.\w+\.npy: a trajectory has",
    ),
    "garbage row_key": (
        "slice",
        lambda d: edit_npy(d, "index", "row_key", lambda a: a % 3),
        r"row_key\.npy: row \d+ has trajectory key \d+, but its stored id",
    ),
    "steps out of order": (
        "slice",
        lambda d: edit_npy(d, "index", "row_step", lambda a: a[::-1].copy()),
        r"(row_step\.npy|traj\.fields\.\w+\.npy)",
    ),
    "segment link": (
        "slice",
        lambda d: edit_npy(d, "index", "seg.fields.fwd", lambda a: np.full_like(a, 3)),
        r"seg\.fields\.fwd\.npy",
    ),
    "free list": (
        "slice",
        lambda d: edit_npy(d, "index", "traj.free", lambda a: np.zeros_like(a)),
        r"traj\.free\.npy: the free list",
    ),
    "write_count 10**15": (
        "slice",
        lambda d: edit_json(
            d / "buffer.json", lambda j: j["index"]["scalars"].update(write_count=10**15)
        ),
        r"buffer\.json: index\.lo: .* out of range",
    ),
    "lo beyond write_count": (
        "slice",
        lambda d: edit_json(d / "buffer.json", lambda j: j["index"]["scalars"].update(lo=10**4)),
        r"buffer\.json: index\.lo: 10000 is out of range",
    ),
    "trajs universe 10**10": (
        "slice",
        lambda d: edit_json(
            d / "buffer.json", lambda j: j["sampler"]["scalars"].update({"trajs.universe": 10**10})
        ),
        r"trajs\.universe: 10000000000 is out of range",
    ),
    "eligible set tampered": (
        "slice",
        lambda d: edit_npy(d, "sampler", "trajs.items", lambda a: a[1:].copy()),
        r"trajs\.items: \d+ members, not the \d+",
    ),
    "ends set tampered": (
        "transition",
        lambda d: edit_npy(d, "sampler", "ends.items", lambda a: np.append(a[1:], a[0] + 1000)),
        r"ends\.items: member \d+ beyond",
    ),
    "generator state": (
        "slice",
        lambda d: edit_npy(d, "sampler", "rng", lambda a: a[:100].copy()),
        r"sampler.*rng: expected 5056 uint8 values",
    ),
    "epoch cursor": (
        "without",
        lambda d: edit_json(
            d / "buffer.json", lambda j: j["sampler"]["scalars"].update({"epoch.cursor": 10**6})
        ),
        r"epoch\.cursor: 1000000 is out of range",
    ),
    "epoch items": (
        "steps-without",
        lambda d: edit_npy(d, "sampler", "epoch.items", lambda a: a + 10**6),
        r"epoch\.items: item \d+ beyond",
    ),
    "weight at no slice end": (
        "prioritized-slice",
        lambda d: edit_npy(d, "sampler", "tree.leaves", lambda a: np.ones_like(a)),
        r"tree\.leaves: row \d+ has a weight but no slice ends there",
    ),
    "infinite weight": (
        "prioritized",
        lambda d: edit_npy(d, "sampler", "tree.leaves", lambda a: np.where(a > 0, np.inf, a)),
        r"tree\.leaves: entry \d+ is inf",
    ),
    "short slice ends": (
        "prioritized-slice",
        lambda d: edit_npy(d, "sampler", "short_end", lambda a: np.full_like(a, 5)),
        r"short_end",
    ),
    "dtype not_a_dtype": (
        "slice",
        lambda d: edit_json(
            d / "buffer.json", lambda j: j["schema"][0].update(dtype="not_a_dtype")
        ),
        r"buffer\.json: schema: .*unknown dtype 'not_a_dtype'",
    ),
    "capacity as a string": (
        "slice",
        lambda d: edit_json(d / "buffer.json", lambda j: j.update(capacity="60")),
        r"buffer\.json: capacity: expected an integer, got '60'",
    ),
    "buffer.json corrupt": (
        "slice",
        lambda d: (d / "buffer.json").write_text("{not json"),
        r"buffer\.json: not a valid JSON document",
    ),
    "unknown kind": (
        "slice",
        lambda d: edit_json(d / "buffer.json", lambda j: j.update(kind="pickle")),
        r"buffer\.json: kind: unknown kind 'pickle'",
    ),
    "open keys": (
        "slice",
        lambda d: edit_json(d / "buffer.json", lambda j: j["boundaries"].update(open_keys=[1.5])),
        r"buffer\.json: boundaries: .*open_keys",
    ),
    "data directory outside": (
        "slice",
        lambda d: edit_json(d / "buffer.json", lambda j: j.update(data="../elsewhere")),
        r"buffer\.json: data: bad data directory",
    ),
}


@pytest.mark.parametrize("target", ["memory", "memmap"])
@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_failed_loads_changes_nothing(
    case: str, target: str, tmp_path: Path, buffer_state, stored_steps
) -> None:
    sampler, corrupt, message = CORRUPTIONS[case]
    source = fill(make(sampler, "memory"), seed=1)
    source.dumps(tmp_path / "dump")
    make(sampler, "memory").loads(tmp_path / "dump")  # the dump itself is good
    corrupt(tmp_path / "dump")
    rb = fill(make(sampler, target, tmp_path / "mm"), seed=2, chunks=3)
    before, contents = buffer_state(rb), stored_steps(rb)
    with pytest.raises(ValueError, match=message):
        rb.loads(tmp_path / "dump")
    assert buffer_state(rb) == before
    if target == "memmap":  # and its files: the reopened buffer holds what it held
        del rb
        assert stored_steps(make(sampler, target, tmp_path / "mm")) == contents


STATE_CORRUPTIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    "row_slot": (
        lambda s: s["index"].update(row_slot=torch.full((CAPACITY,), 7)),
        r"state dict: index\['row_slot'\]",
    ),
    "bool row_key": (
        lambda s: s["index"].update(row_key=s["index"]["row_key"] > 0),
        r"state dict: index\['row_key'\]: expected a 1-D integer array",
    ),
    "write_count": (
        lambda s: s["index"].update(write_count=10**15),
        r"state dict: index\['lo'\]: .* out of range",
    ),
    "trajs universe": (
        lambda s: s["sampler"].update({"trajs.universe": 10**10}),
        r"state dict: sampler: trajs\.universe",
    ),
    "rng": (
        lambda s: s["sampler"].update(rng=torch.zeros(3, dtype=torch.uint8)),
        r"state dict: sampler: rng",
    ),
    "column dtype": (
        lambda s: s["columns"].__setitem__(0, s["columns"][0].double()),
        r"state dict: columns\[0\] .*: expected dtype",
    ),
    "ids": (
        lambda s: s["columns"].__setitem__(_ids(s), s["columns"][_ids(s)] + 1),
        r"state dict: index\['row_key'\]: row \d+ has trajectory key .* columns\[\d+\]",
    ),
}


def _ids(state: dict) -> int:
    """The position of the trajectory ids among the saved columns."""
    return [tuple(e["key"]) for e in state["schema"]].index(TRAJ_IDS)


@pytest.mark.parametrize("case", list(STATE_CORRUPTIONS))
def test_a_failed_load_state_dict_changes_nothing(case: str, buffer_state) -> None:
    corrupt, message = STATE_CORRUPTIONS[case]
    state = fill(make("slice", "memory"), seed=1).state_dict()
    corrupt(state)
    rb = fill(make("slice", "memory"), seed=2, chunks=3)
    before = buffer_state(rb)
    with pytest.raises(ValueError, match=message):
        rb.load_state_dict(state)
    assert buffer_state(rb) == before


# ---------------------------------------------------------------------- memory-mapped reopening
def _meta(change: Callable[[dict], None]) -> Callable[[Path], None]:
    return lambda d: edit_json(d / "meta.json", change)


def _rows_file(name: str, change: Callable[[np.ndarray], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        a = np.fromfile(d / name, dtype=np.int64)
        change(a)
        a.tofile(d / name)

    return edit


MEMMAP_CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "write_count 10**8": (
        _meta(lambda m: m["buffer"].update(write_count=10**8)),
        r"meta\.json: buffer\.lo: \d+ is out of range",
    ),
    "write_count 10**15": (
        _meta(lambda m: m["buffer"].update(write_count=10**15)),
        r"meta\.json: buffer\.lo",
    ),
    "rotated live range": (
        _meta(
            lambda m: m["buffer"].update(
                write_count=m["buffer"]["write_count"] + 7, lo=m["buffer"]["lo"] + 7
            )
        ),
        r"rows_seq\.bin: (rows are not in write order|the newest row)",
    ),
    "lo beyond write_count": (
        _meta(lambda m: m["buffer"].update(lo=10**4)),
        r"meta\.json: buffer\.lo: 10000 is out of range",
    ),
    "capacity as a string": (
        _meta(lambda m: m.update(capacity="60")),
        r"meta\.json: capacity: expected an integer, got '60'",
    ),
    "dtype not_a_dtype": (
        _meta(lambda m: m["schema"][0].update(dtype="not_a_dtype")),
        r"meta\.json: schema: .*unknown dtype 'not_a_dtype'",
    ),
    "negative shape": (
        _meta(lambda m: m["schema"][0].update(shape=[-4])),
        r"meta\.json: schema: .*bad shape",
    ),
    "negative seq": (_meta(lambda m: m.update(seq=-5)), r"meta\.json: seq: -5 is out of range"),
    "unknown kind": (_meta(lambda m: m["buffer"].update(kind="x")), r"meta\.json: buffer\.kind"),
    "meta.json corrupt": (
        lambda d: (d / "meta.json").write_text("{not json"),
        r"meta\.json: not a valid JSON document",
    ),
    "rows_seq beyond seq": (
        _rows_file("rows_seq.bin", lambda a: a.__setitem__(slice(30, 31), 10**6)),
        r"rows_seq\.bin: row 30 has write sequence number 1000000",
    ),
    "rows_seq out of order": (
        _rows_file("rows_seq.bin", lambda a: a.__setitem__(slice(None), a[::-1].copy())),
        r"rows_seq\.bin",
    ),
    "garbage rows_key": (
        _rows_file("rows_key.bin", lambda a: a.__setitem__(slice(None), a % 3)),
        r"rows_key\.bin: row \d+ has trajectory key \d+, but its stored id .* \(.*col_\d+\.bin\)",
    ),
    "column truncated": (lambda d: truncate(d / "col_002.bin"), r"col_002\.bin: expected"),
}


@pytest.mark.parametrize("case", list(MEMMAP_CORRUPTIONS))
def test_a_memmap_directory_is_checked_before_it_is_trusted(case: str, tmp_path: Path) -> None:
    corrupt, message = MEMMAP_CORRUPTIONS[case]
    path = tmp_path / "mm"
    fill(make("slice", "memmap", path), seed=1)
    corrupt(path)
    files = {p.name: p.read_bytes() for p in path.iterdir()}
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        make("slice", "memmap", path)
    assert time.perf_counter() - start < 5  # no scan of a made-up write count
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files  # nothing written


def test_end_flags_inside_a_trajectory_are_refused_on_reopening(tmp_path: Path) -> None:
    """Without ids the keys are synthetic: a key that runs past an episode end (a done step
    that is not a collector cut) joins two episodes, and is refused."""
    path = tmp_path / "mm"
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(CAPACITY, scratch_dir=path), sampler=SliceSampler(slice_len=2)
    )
    stream = SyntheticStream(2, 4.0, seed=3)
    for _ in range(3):
        rb.extend(stream.chunk(7).exclude(TRAJ_IDS))
    del rb
    keys = np.fromfile(path / "rows_key.bin", dtype=np.int64)
    keys[:] = 0  # one trajectory across every episode end
    keys.tofile(path / "rows_key.bin")
    with pytest.raises(ValueError, match=r"rows_key\.bin: row \d+ ends a trajectory"):
        ReplayBuffer(
            storage=LazyMemmapStorage(CAPACITY, scratch_dir=path), sampler=SliceSampler(slice_len=2)
        )


# ---------------------------------------------------------------------- every real state passes
LAYOUTS = ["bt", "flat", "time-major", "padded", "flags"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(5, 70),
    n_env=st.integers(1, 4),
    chunks=st.lists(
        st.tuples(st.sampled_from(LAYOUTS[:4]), st.integers(1, 12)), min_size=1, max_size=8
    ),
    flags=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_the_index_of_every_real_buffer_passes_the_checks_unchanged(
    capacity: int, n_env: int, chunks: list[tuple[str, int]], flags: bool, seed: int
) -> None:
    """The reference rebuilt from the keys agrees with the index the writes built, in every
    layout and after wraps (stale segment starts included): the checks accept it and return it
    as it was."""
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=SliceSampler(slice_len=2))
    stream = SyntheticStream(n_env, 3.0, seed=seed, labels=True)
    for layout, steps in chunks:
        batch = stream.chunk(steps)
        if flags:
            batch = batch.exclude(TRAJ_IDS)
            layout = "bt"  # flags: env rows continue only in [B, T] batches
        if layout == "flat":
            batch = batch.reshape(-1)
        elif layout == "time-major":
            batch = batch.transpose(0, 1).reshape(-1)
        elif layout == "padded":
            batch = split_trajectories(batch)
        rb.extend(batch)
        state = rb.index.state()
        out = check_index(state, capacity, Source()).state()
        for name in ("row_slot", "row_step", "row_seg", "row_key"):
            assert np.array_equal(getattr(out, name), getattr(state, name)), name
        for pool in ("traj", "seg"):
            a, b = getattr(out, pool), getattr(state, pool)
            assert a.n_free == b.n_free and np.array_equal(a.free, b.free)
            assert all(np.array_equal(a.fields[f], b.fields[f]) for f in a.fields)
        assert np.array_equal(out.keys.keys, state.keys.keys)
        # ... and so does the whole snapshot (the keys against the stored ids or flags).
        snap = from_state_dict(rb.state_dict(), rb.sampler.state_type)
        checked = check_snapshot(
            snap, capacity=capacity, schema=rb.storage.schema, sampler_config=rb.sampler.config()
        )
        assert np.array_equal(checked.row_slot, state.row_slot)


def test_a_directory_left_by_a_torn_extend_reopens_without_its_rows(tmp_path: Path) -> None:
    """The rows an interrupted extend had marked (the oldest) are dropped on reopening; rows
    marked anywhere else are refused (above)."""
    path = tmp_path / "mm"
    rb = fill(make("slice", "memmap", path), seed=1)
    wc, n = rb.write_count, len(rb)
    oldest = rb.index.live_rows()[:5]
    del rb
    seq = np.fromfile(path / "rows_seq.bin", dtype=np.int64)
    seq[oldest] = json.loads((path / "meta.json").read_text())["seq"] + 1
    seq.tofile(path / "rows_seq.bin")
    again = make("slice", "memmap", path)
    assert (again.write_count, len(again)) == (wc, n - 5)


def test_a_dump_of_an_empty_buffer_empties_the_target(tmp_path: Path, stored_steps) -> None:
    make("slice", "memory").dumps(tmp_path / "empty")
    rb = fill(make("slice", "memmap", tmp_path / "mm"), seed=1)
    rb.loads(tmp_path / "empty")
    assert (len(rb), rb.write_count) == (0, 0)
    del rb
    assert stored_steps(make("slice", "memmap", tmp_path / "mm"))[0] == 0
    shutil.rmtree(tmp_path / "mm")


def test_flags_buffers_round_trip(tmp_path: Path) -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(40), sampler=SliceSampler(slice_len=2, seed=0), batch_size=4
    )
    stream = SyntheticStream(2, 4.0, seed=3, labels=True)
    for _ in range(4):
        rb.extend(stream.chunk(7).exclude(TRAJ_IDS))
    assert DONE in rb.storage.columns
    rb.dumps(tmp_path / "d")
    other = ReplayBuffer(
        storage=LazyTensorStorage(40), sampler=SliceSampler(slice_len=2, seed=5), batch_size=4
    )
    other.loads(tmp_path / "d")
    assert torch.equal(rb.sample()["g"], other.sample()["g"])


@pytest.mark.parametrize("sampler", ["slice", "transition", "without", "prioritized-slice"])
def test_a_slice_sampler_that_never_sampled_round_trips(sampler: str, tmp_path: Path) -> None:
    """A slice sampler builds its sets at its first sample; before that, its (empty) sets
    keep the size they were made with while the index grows. Such a state is valid: it loads
    (the check used to demand the index's current size and refused it), and both buffers
    then sample alike."""
    capacity = 4000
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=SAMPLERS[sampler]())  # type: ignore[arg-type]
    rb.extend(SyntheticStream(4, 2.0, seed=1, labels=True).chunk(500))  # ~1,000 trajectories
    rb.dumps(tmp_path / "dump")
    for restore in ("loads", "load_state_dict"):
        copy = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=SAMPLERS[sampler]())  # type: ignore[arg-type]
        if restore == "loads":
            copy.loads(tmp_path / "dump")
        else:
            copy.load_state_dict(rb.state_dict())
        assert torch.equal(copy.sample(30)["g"], rb.sample(30)["g"])
        rb.load_state_dict(copy.state_dict())  # the same draws again for the next copy
