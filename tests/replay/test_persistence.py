"""dumps/loads round trips, memory-mapped reopening, and a writer killed mid-extend."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from splice._non_tensor import to_non_tensor
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
    "context": lambda: SliceSampler(
        slice_len=4, seed=3, burn_in=3, burn_in_align="right", burn_in_keys=["g", "observation"]
    ),
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


def pixels(ep: torch.Tensor, t: torch.Tensor, final: bool) -> torch.Tensor:
    """64 bytes naming the episode and step (and whether it is an episode's final one)."""
    out = torch.zeros(*ep.shape, 64, dtype=torch.uint8)
    out[..., 0], out[..., 1] = (ep % 256).to(torch.uint8), (ep // 256 % 256).to(torch.uint8)
    out[..., 2], out[..., 3] = (t % 256).to(torch.uint8), int(final)
    return out


def with_pixels_and_text(batch: TensorDict) -> TensorDict:
    """The memory-mapped layouts of issue 13 too: ``("next", "pixels")`` stored once (it is
    the next step's ``pixels`` within an episode) and a text column (the step's ``g``)."""
    ep, t, done = batch["ep"], batch["t"], batch["next", "done"]
    batch["pixels"] = pixels(ep, t, False)
    batch["next", "pixels"] = torch.where(done, pixels(ep, t + 1, True), pixels(ep, t + 1, False))
    text = np.vectorize(str, otypes=[object])(batch["g"].numpy())
    batch.set("text", to_non_tensor(text))
    return batch


def kill_at_random_moments(
    tmp_path: Path, source: str, args: list[list[str]], ready: str, delays: np.ndarray
) -> list[list[str]]:
    """Run ``source`` as one process per entry of ``args`` (side by side); once a process
    has printed its first ``ready`` line, SIGKILL it after its delay. Returns every line each
    process printed (the first included); each must have died of the SIGKILL."""
    script = tmp_path / "script.py"
    script.write_text(source)
    procs = []
    for k, extra in enumerate(args):
        errors = (tmp_path / f"stderr{k}.txt").open("w")
        proc = subprocess.Popen(
            [sys.executable, str(script), *extra],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        procs.append((proc, errors))
    lines: list[list[str]] = [[] for _ in args]
    try:
        for k, (proc, _) in enumerate(procs):
            assert proc.stdout is not None
            lines[k].append(proc.stdout.readline())  # the process is going
            assert lines[k][0].startswith(ready), (tmp_path / f"stderr{k}.txt").read_text()
            threading.Timer(delays[k], proc.send_signal, (signal.SIGKILL,)).start()
        for k, (proc, _) in enumerate(procs):
            assert proc.stdout is not None
            lines[k].extend(proc.stdout)  # until the kill closes the pipe
            assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        for proc, errors in procs:
            proc.kill()
            proc.wait(timeout=60)
            if proc.stdout is not None:
                proc.stdout.close()
            errors.close()
    return lines


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from tensordict import TensorDict
    from splice._non_tensor import to_non_tensor
    from splice.replay import LazyMemmapStorage, ReplayBuffer, SliceSampler
    from splice.testing import SyntheticStream

    WRITE_HELPERS
    path = sys.argv[1]
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(1000, scratch_dir=path),
        sampler=SliceSampler(slice_len=4, seed=0),
        batch_size=8,
    )
    stream = SyntheticStream(4, 20.0, seed=0, labels=True)
    while True:
        # 600 steps: most of the time is spent inside extend
        rb.extend(with_pixels_and_text(stream.chunk(150)))
        print("DONE", rb.write_count, flush=True)
    """
).replace("WRITE_HELPERS", inspect.getsource(pixels) + inspect.getsource(with_pixels_and_text))

STEPS_PER_EXTEND = 600
KILLS = 4


def test_writer_killed_at_random_moments_reopens_at_an_extend_boundary(tmp_path: Path) -> None:
    """SIGKILL memory-mapped writers at random moments (several random delays, writers run
    side by side); each directory reopens at the end of an extend, with every extend that
    completed before the kill (its DONE line was printed) kept and no torn row."""
    delays = np.random.default_rng(7).uniform(0.05, 0.6, KILLS)
    args = [[str(tmp_path / f"mm{k}")] for k in range(KILLS)]
    lines = kill_at_random_moments(tmp_path, WRITER, args, "DONE", delays)
    done = [int(out[-1].split()[1]) for out in lines]
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
        stored = rb[rows]
        want = with_pixels_and_text(stored.exclude("pixels", ("next", "pixels"), "text"))
        for key in ("pixels", ("next", "pixels")):  # stored once, rebuilt exactly
            assert torch.equal(stored[key], want[key]), key
        assert stored.get("text").tolist() == want.get("text").tolist()
        assert list(rb.storage.shared) == [("next", "pixels")]
        assert len(rb) >= min(1000, last) - STEPS_PER_EXTEND
        assert_slices_contiguous(rb.sample(), live=set(g.tolist()))
        # ... and the buffer keeps working.
        stream = SyntheticStream(4, 20.0, seed=99, labels=True, first_id=10**9, first_step=last)
        rb.extend(with_pixels_and_text(stream.chunk(30)))
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
        # Sample until the writer has wrapped the ring (however the two threads are
        # scheduled: ~16k steps were written during 150 samples here, on one loaded core).
        checked, deadline = 0, time.monotonic() + 60
        while (checked < 150 or rb.write_count <= 3000) and time.monotonic() < deadline:
            s = rb.sample()
            # Each step's data matches its row's index entry at sampling time: consecutive
            # steps of one episode, nothing from a half-written batch.
            assert_slices_contiguous(s)
            checked += 1
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors
    assert checked >= 150
    assert rb.write_count > 3000  # the writer wrapped the ring while we sampled


DUMPER = textwrap.dedent(
    """
    import sys
    from splice.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
    from splice.testing import SyntheticStream

    path = sys.argv[1]


    def build(seed, chunks):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(20_000),
            sampler=SliceSampler(slice_len=4, seed=seed),
            batch_size=8,
        )
        stream = SyntheticStream(
            4, 20.0, seed=seed, labels=True, first_id=10**6 * seed, first_step=10**7 * seed
        )
        for _ in range(chunks):
            rb.extend(stream.chunk(1000))  # 4,000 steps
        rb.sample()
        return rb


    buffers = [build(1, 7), build(2, 8)]  # different contents in every file
    while True:  # dump over each other's dumps, back to back
        for rb in buffers:
            rb.dumps(path)
            print("DUMPED", rb.write_count, flush=True)
    """
)
DUMPERS = 3


def test_dumps_killed_at_random_moments_leave_a_whole_dump(tmp_path: Path) -> None:
    """SIGKILL processes that dump two different buffers over each other at random moments:
    every directory loads, and holds exactly one of the two buffers (a dump is atomic; an
    interrupted ``dumps`` used to leave a mixed directory that ``loads`` accepted)."""
    delays = np.random.default_rng(11).uniform(0.0, 0.3, DUMPERS)
    args = [[str(tmp_path / f"dump{k}")] for k in range(DUMPERS)]
    dumped = [len(out) for out in kill_at_random_moments(tmp_path, DUMPER, args, "DUMPED", delays)]
    for k in range(DUMPERS):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(20_000),
            sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
            batch_size=40,
        )
        rb.loads(tmp_path / f"dump{k}")
        seed = {28_000: 1, 32_000: 2}[rb.write_count]
        rows = torch.from_numpy(rb.index.live_rows())
        g = rb.storage.gather(rows)[("g",)]
        first = 10**7 * seed + rb.write_count - len(rb)
        assert g.tolist() == list(range(first, first + len(rb))), (k, dumped[k])
        assert_slices_contiguous(rb.sample(), live=set(g.tolist()))
        # What an interrupted dump left is gone after the next one.
        rb.dumps(tmp_path / f"dump{k}")
        assert len([p for p in (tmp_path / f"dump{k}").iterdir() if p.is_dir()]) == 1


LOADER = textwrap.dedent(
    """
    import sys
    from splice.replay import LazyMemmapStorage, ReplayBuffer, SliceSampler

    path, dumps = sys.argv[1], sys.argv[2]
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(20_000, scratch_dir=path),
        sampler=SliceSampler(slice_len=4, seed=0),
        batch_size=8,
    )
    while True:  # every operation that rewrites a memory-mapped buffer as a whole
        for name in ("a", "b"):
            rb.loads(f"{dumps}/{name}")
            print("LOADED", name, flush=True)
        rb.empty()
        print("EMPTIED", flush=True)
    """
)
LOADERS = 3


def test_memmap_loads_killed_at_random_moments_reopens_whole(tmp_path: Path) -> None:
    """SIGKILL processes that ``loads`` two different dumps into a memory-mapped buffer (and
    ``empty`` it) at random moments: every directory reopens as one of the two buffers, or
    empty (a ``loads`` marks every row before it copies, so an interrupted one reopens
    empty), never a mix; the reopened buffer samples and extends."""
    contents = {}
    for seed, name in ((1, "a"), (2, "b")):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(20_000), sampler=SliceSampler(slice_len=4, seed=0)
        )
        stream = SyntheticStream(
            4, 20.0, seed=seed, labels=True, first_id=10**6 * seed, first_step=10**7 * seed
        )
        for _ in range(6 + seed):
            rb.extend(stream.chunk(1000))  # 4,000 steps
        rb.dumps(tmp_path / "dumps" / name)
        rows = torch.from_numpy(rb.index.live_rows())
        contents[name] = (rb.write_count, rb.storage.gather(rows)[("g",)].tolist())
    delays = np.random.default_rng(5).uniform(0.0, 0.4, LOADERS)
    args = [[str(tmp_path / f"mm{k}"), str(tmp_path / "dumps")] for k in range(LOADERS)]
    ops = [len(out) for out in kill_at_random_moments(tmp_path, LOADER, args, "LOADED", delays)]
    for k in range(LOADERS):
        rb = ReplayBuffer(
            storage=LazyMemmapStorage(20_000, scratch_dir=tmp_path / f"mm{k}"),
            sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
            batch_size=40,
        )
        rows = torch.from_numpy(rb.index.live_rows())
        g = rb.storage.gather(rows)[("g",)].tolist() if len(rb) else []
        if len(rb):
            assert (rb.write_count, g) in contents.values(), (k, ops[k], rb.write_count)
            assert_slices_contiguous(rb.sample(), live=set(g))
        stream = SyntheticStream(4, 20.0, seed=9, labels=True, first_id=10**9, first_step=10**9)
        before = rb.write_count
        rb.extend(stream.chunk(30))
        assert rb.write_count == before + 120 and len(rb) == min(20_000, len(g) + 120)
