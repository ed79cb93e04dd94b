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
    import sys, time
    import torch
    from splice.replay import LazyMemmapStorage, ReplayBuffer, SliceSampler
    from splice.testing import SyntheticStream

    path, stage = sys.argv[1], sys.argv[2]
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(1000, scratch_dir=path),
        sampler=SliceSampler(slice_len=4, seed=0),
        batch_size=8,
    )
    def hook(name):
        if name == stage and rb.write_count >= 1500:
            print("KILL ME", flush=True)
            time.sleep(60)
    rb.storage._on_stage = hook
    stream = SyntheticStream(4, 20.0, seed=0, labels=True)
    while True:
        rb.extend(stream.chunk(25 if stage != "random" else 150))
        print("DONE", rb.write_count, flush=True)
    """
)


@pytest.mark.parametrize("stage", ["marked", "written", "random"])
def test_writer_killed_mid_extend_reopens_at_last_completed_extend(
    stage: str, tmp_path: Path
) -> None:
    """SIGKILL a process inside extend; the directory reopens at its last completed extend.

    ``marked``: killed after the rows to overwrite were marked, before any data is copied;
    ``written``: killed after the data was copied, before the metadata; ``random``: killed at
    an arbitrary moment while extending big batches.
    """
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    path = tmp_path / "mm"
    errors = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), stage],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    done = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("DONE"):
                if stage == "random" and done == 0:  # let it extend for a moment, then kill
                    threading.Timer(0.3, proc.send_signal, (signal.SIGKILL,)).start()
                done = int(line.split()[1])
            elif line.startswith("KILL"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
        errors.close()
    assert done > 0, (tmp_path / "stderr.txt").read_text()
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(1000, scratch_dir=path),
        sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
        batch_size=40,
    )
    assert rb.write_count == done if stage != "random" else rb.write_count >= done
    # Every stored row holds exactly the step the index says: g counts up in write order
    # (the Stream numbers env-major within a chunk), with no torn row.
    rows = torch.from_numpy(rb.index.live_rows())
    g = rb.storage.gather(rows)[("g",)]
    last = rb.write_count
    assert g.tolist() == list(range(last - len(rb), last))
    if stage == "written":
        assert len(rb) == 1000 - 100  # the rows the interrupted extend overwrote are dropped
    s = rb.sample()
    assert_slices_contiguous(s, live=set(g.tolist()))
    # ... and the buffer keeps working.
    stream = SyntheticStream(4, 20.0, seed=99, labels=True, first_id=10**9, first_step=last)
    before = len(rb)
    rb.extend(stream.chunk(30))
    assert len(rb) == min(1000, before + 120)


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
