"""dumps/loads round trips, memory-mapped reopening, and a writer killed mid-extend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.testing import SyntheticStream, assert_slices_contiguous

SAMPLERS = {
    "random": lambda: RandomSampler(seed=3),
    "trajectory": lambda: SliceSampler(slice_len=4, seed=3, burn_in=2),
    "transition": lambda: SliceSampler(slice_len=4, weighting="transition", seed=3),
    "without": lambda: SliceSamplerWithoutReplacement(slice_len=4, seed=3),
    "prioritized": lambda: PrioritizedSliceSampler(alpha=0.8, beta=0.6, slice_len=4, seed=3),
}


def make(kind: str, storage: str, tmp: Path) -> ReplayBuffer:
    st = (
        LazyTensorStorage(150)
        if storage == "memory"
        else LazyMemmapStorage(150, scratch_dir=tmp / f"mm-{os.urandom(4).hex()}")
    )
    return ReplayBuffer(storage=st, sampler=SAMPLERS[kind](), batch_size=16)


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_dumps_loads_samples_identically(kind: str, storage: str, tmp_path: Path) -> None:
    rb = make(kind, storage, tmp_path)
    stream = SyntheticStream(3, 9.0, seed=11, labels=True)
    for _ in range(6):
        rb.extend(stream.chunk(11))  # 198 steps into 150: wrapped
    for _ in range(3):
        s = rb.sample()
    if kind == "prioritized":
        rb.update_priority(s["index"], torch.rand(s["index"].shape))
    rb.dumps(tmp_path / "saved")
    assert not any((tmp_path / "saved").rglob("*.pkl"))
    json.loads((tmp_path / "saved" / "buffer.json").read_text())
    other = make(kind, storage, tmp_path)
    other.loads(tmp_path / "saved")
    assert (len(other), other.write_count) == (len(rb), rb.write_count)
    for _ in range(4):
        a, b = rb.sample(), other.sample()
        assert torch.equal(a["g"], b["g"]) and torch.equal(a["index"], b["index"])
    more = stream.chunk(7)
    rb.extend(more)
    other.extend(more)
    for _ in range(4):
        assert torch.equal(rb.sample()["g"], other.sample()["g"])


def test_loads_refuses_a_different_configuration(tmp_path: Path) -> None:
    rb = make("trajectory", "memory", tmp_path)
    rb.extend(SyntheticStream(2, 5.0, labels=True).chunk(5))
    rb.dumps(tmp_path / "saved")
    with pytest.raises(ValueError, match="sampler"):
        make("transition", "memory", tmp_path).loads(tmp_path / "saved")
    small = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=4))
    with pytest.raises(ValueError, match="150"):
        small.loads(tmp_path / "saved")


def test_memmap_reopens_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(100, scratch_dir=path),
        sampler=SliceSampler(slice_len=5, as_sequences=True, seed=0),
        batch_size=20,
    )
    stream = SyntheticStream(2, 12.0, seed=5, labels=True)
    written: list[int] = []
    for _ in range(7):
        batch = stream.chunk(9)
        written.extend(batch["g"].reshape(-1).tolist())
        rb.extend(batch)
    del rb
    again = ReplayBuffer(
        storage=LazyMemmapStorage(100, scratch_dir=path),
        sampler=SliceSampler(slice_len=5, as_sequences=True, seed=0),
        batch_size=20,
    )
    assert (len(again), again.write_count) == (100, 126)
    s = again.sample()
    assert_slices_contiguous(s, live=set(written[-100:]))
    with pytest.raises(ValueError, match="max_size"):
        LazyMemmapStorage(50, scratch_dir=path)


WRITER = textwrap.dedent(
    """
    import sys
    from splice.replay import LazyMemmapStorage, ReplayBuffer, SliceSampler
    from splice.testing import SyntheticStream

    path = sys.argv[1]
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(1000, scratch_dir=path),
        sampler=SliceSampler(slice_len=4, seed=0),
        batch_size=8,
    )
    stream = SyntheticStream(4, 20.0, seed=0, labels=True)
    while True:
        rb.extend(stream.chunk(150))  # 600 steps: most of the time is spent inside extend
        print("DONE", rb.write_count, flush=True)
    """
)
STEPS_PER_EXTEND = 600
KILLS = 4


def test_writer_killed_at_random_moments_reopens_at_an_extend_boundary(tmp_path: Path) -> None:
    """SIGKILL memory-mapped writers at random moments (several random delays, writers run
    side by side); each directory reopens at the end of an extend, with every extend that
    completed before the kill (its DONE line was printed) kept and no torn row."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    delays = np.random.default_rng(7).uniform(0.05, 0.6, KILLS)
    procs = []
    for k in range(KILLS):
        errors = (tmp_path / f"stderr{k}.txt").open("w")
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"mm{k}")],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        procs.append((proc, errors))
    done = [0] * KILLS
    try:
        for k, (proc, _) in enumerate(procs):
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the first extend completed: the writer is going
            assert line.startswith("DONE"), (tmp_path / f"stderr{k}.txt").read_text()
            threading.Timer(delays[k], proc.send_signal, (signal.SIGKILL,)).start()
        for k, (proc, _) in enumerate(procs):
            assert proc.stdout is not None
            for line in proc.stdout:  # until the kill closes the pipe
                done[k] = int(line.split()[1])
            assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        for proc, errors in procs:
            proc.kill()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
            errors.close()
    for k in range(KILLS):
        rb = ReplayBuffer(
            storage=LazyMemmapStorage(1000, scratch_dir=tmp_path / f"mm{k}"),
            sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
            batch_size=40,
        )
        last = rb.write_count
        # On an extend boundary, with nothing that completed lost (an extend may have
        # completed after the last DONE line was read, never before).
        assert last % STEPS_PER_EXTEND == 0 and last >= max(done[k], STEPS_PER_EXTEND), (
            k,
            last,
            done[k],
        )
        # Every stored row holds exactly the step the index says: g counts up in write
        # order (the Stream numbers env-major within a chunk), with no torn row. The rows
        # an interrupted extend was overwriting (the oldest) may be dropped.
        rows = torch.from_numpy(rb.index.live_rows())
        g = rb.storage.gather(rows)[("g",)]
        assert g.tolist() == list(range(last - len(rb), last))
        assert len(rb) >= min(1000, last) - STEPS_PER_EXTEND
        assert_slices_contiguous(rb.sample(), live=set(g.tolist()))
        # ... and the buffer keeps working.
        stream = SyntheticStream(4, 20.0, seed=99, labels=True, first_id=10**9, first_step=last)
        rb.extend(stream.chunk(30))
        assert rb.write_count == last + 120 and len(rb) == min(1000, len(rb))


def test_concurrent_writer_and_sampler_stay_consistent() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(3000),
        sampler=SliceSampler(slice_len=8, as_sequences=True, weighting="transition", seed=0),
        batch_size=8 * 16,
    )
    stream = SyntheticStream(4, 15.0, seed=1, labels=True)
    rb.extend(stream.chunk(40))
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            flat = False
            while not stop.is_set():
                chunk = stream.chunk(25)
                rb.extend(chunk.reshape(-1) if flat else chunk)
                flat = not flat
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        checked = 0
        while checked < 150:
            s = rb.sample()
            # Each step's data matches its row's index entry at sampling time: consecutive
            # steps of one episode, nothing from a half-written batch.
            assert_slices_contiguous(s)
            checked += 1
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors
    assert rb.write_count > 3000  # the writer wrapped the ring while we sampled
