"""Replay buffer: splice vs TorchRL 0.14.1 vs the raw limit, measured in one process.

Workload (perf-baselines.md §4): a stream of CartPole-sized transitions (observation [4],
one-hot action [2], next observation, reward, done/terminated/truncated, trajectory ids;
geometric episode lengths, mean 20) extended in batches of 1,000 into a 1,000,000-step
buffer; batches of 512 frames (32 slices x 16 steps).

    python -m benchmarks.bench_replay [--quick] [--cpu-time] [--sections extend,concurrent]

``--cpu-time`` times the single-threaded sections in CPU time of the process
(``time.process_time``) instead of wall time: on a busy shared machine, wall time mostly
measures how often the process was preempted. The section with a writer thread always
measures wall-time latency.

Raw limits: a bare slice copy of each column into preallocated tensors, with torch's
``copy_`` and with numpy (extend: the ratio is to the faster of the two), and a bare torch
gather of precomputed slice indices (sampling, no boundary bookkeeping at all).

Prioritized replay: splice's ``PrioritizedSampler`` against TorchRL's, 512 of the buffer's
steps per draw (every step with its own random priority). TorchRL's sampler needs its C++
extension, which the 0.14.1 wheel cannot load with torch 2.13: see ``_torchrl_ext.py`` for
rebuilding it from TorchRL's sources (``TORCHRL_SRC``); without it that comparison is skipped.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict

from benchmarks._harness import Timing, interleaved, parser, ratio, table
from benchmarks._torchrl_ext import load_torchrl_extension
from splice.replay import (
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
)
from splice.testing import episode_lengths

SLICES, SLICE_LEN = 32, 16
#: The clock of the single-threaded sections (``--cpu-time``: ``time.process_time``).
CLOCK: list[Callable[[], float]] = [time.perf_counter]
BATCH = SLICES * SLICE_LEN
CHUNK = 1000


def cartpole_stream(n: int, mean_len: float, seed: int = 0) -> TensorDict:
    """``n`` flat transitions of one env, CartPole-sized, with trajectory ids."""
    rng = np.random.default_rng(seed)
    lengths = episode_lengths(n, mean_len, rng)
    ids = torch.from_numpy(np.repeat(np.arange(lengths.size), lengths))
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[torch.from_numpy(np.cumsum(lengths) - 1)] = True
    obs = torch.randn(n, 4)
    action = torch.zeros(n, 2, dtype=torch.int64)
    action[torch.arange(n), torch.from_numpy(rng.integers(0, 2, n))] = 1
    return TensorDict(
        {
            "observation": obs,
            "action": action,
            ("next", "observation"): torch.randn(n, 4),
            ("next", "reward"): torch.ones(n, 1),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
            ("collector", "traj_ids"): ids,
        },
        batch_size=[n],
    )


# ---------------------------------------------------------------------- contenders
def splice_buffer(capacity: int, sampler) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=BATCH)


def torchrl_buffer(capacity: int, sampler: str):
    from torchrl.data import LazyTensorStorage as TLazy
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler as TRandom
    from torchrl.data.replay_buffers import SliceSampler as TSlice

    samplers = {
        "random": lambda: TRandom(),
        "slice": lambda: TSlice(slice_len=SLICE_LEN, end_key=("next", "done")),
        "slice_cached": lambda: TSlice(
            slice_len=SLICE_LEN, end_key=("next", "done"), cache_values=True
        ),
    }
    return TensorDictReplayBuffer(
        storage=TLazy(capacity), sampler=samplers[sampler](), batch_size=BATCH
    )


class RawStore:
    """The raw limit: preallocated column tensors, bare slice copies and bare gathers."""

    def __init__(self, capacity: int, like: TensorDict) -> None:
        self.capacity = capacity
        self.cols = {
            k: torch.empty(capacity, *v.shape[1:], dtype=v.dtype)
            for k, v in like.items(include_nested=True, leaves_only=True)
        }
        self.cursor = 0
        self.starts = torch.empty(0, dtype=torch.int64)
        self.gen = torch.Generator().manual_seed(0)

    def extend(self, chunk: TensorDict) -> None:
        n = chunk.shape[0]
        for k, v in chunk.items(include_nested=True, leaves_only=True):
            self.cols[k][self.cursor : self.cursor + n].copy_(v)
        self.cursor = (self.cursor + n) % self.capacity

    def extend_numpy(self, chunk: TensorDict) -> None:
        """The same copies as numpy slice assignments (cheaper per call than torch's)."""
        n = chunk.shape[0]
        for k, v in chunk.items(include_nested=True, leaves_only=True):
            self.cols[k].numpy()[self.cursor : self.cursor + n] = v.numpy()
        self.cursor = (self.cursor + n) % self.capacity

    def precompute_starts(self, ids: torch.Tensor) -> None:
        """Valid 16-step slice starts, computed once (what a sampler would have to know)."""
        same = ids[SLICE_LEN - 1 :] == ids[: -(SLICE_LEN - 1)]
        self.starts = same.nonzero().squeeze(1)

    def gather(self) -> dict:
        pick = torch.randint(self.starts.numel(), (SLICES,), generator=self.gen)
        idx = (self.starts[pick][:, None] + torch.arange(SLICE_LEN)).reshape(-1)
        return {k: v.index_select(0, idx) for k, v in self.cols.items()}

    def gather_iid(self) -> dict:
        idx = torch.randint(self.capacity, (BATCH,), generator=self.gen)
        return {k: v.index_select(0, idx) for k, v in self.cols.items()}


def fill(rb, chunks) -> None:
    for chunk in chunks:
        rb.extend(chunk)


class FreshChunks:
    """More of the stream with fresh trajectory ids (a collector never reuses an id)."""

    def __init__(self, n: int) -> None:
        self.chunks = list(cartpole_stream(n, 20.0, seed=1).split(CHUNK))
        self.i = 0

    def next(self) -> TensorDict:
        cycle, k = divmod(self.i, len(self.chunks))
        self.i += 1
        chunk = self.chunks[k]
        if cycle == 0:
            chunk = chunk.clone()
        chunk[("collector", "traj_ids")] = chunk[("collector", "traj_ids")] + (cycle + 1) * 10**9
        return chunk


# ---------------------------------------------------------------------- measurements
def bench_extend(capacity: int, chunks: list[TensorDict], rounds: int) -> list[list[object]]:
    """Fill a fresh buffer, 1,000 steps per extend: flat ``[1000]`` batches and ``[B, T] =
    [8, 125]`` collector batches (TorchRL's 1-D storage takes them flattened, as its users
    must: its row is the same as the flat one). The raw copies write the same bytes into
    freshly allocated tensors."""

    def fresh_fill(make: Callable[[], object], data: list[TensorDict]) -> Callable[[], None]:
        return lambda: fill(make(), data)

    def raw_fill(numpy: bool) -> Callable[[], None]:
        def run() -> None:
            store = RawStore(capacity, chunks[0])
            for chunk in chunks:
                (store.extend_numpy if numpy else store.extend)(chunk)

        return run

    grid = [c.reshape(8, CHUNK // 8) for c in chunks]
    for make in (  # warm both libraries up (imports, first allocations)
        lambda: splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN)),
        lambda: torchrl_buffer(capacity, "slice"),
        lambda: torchrl_buffer(capacity, "random"),
    ):
        fill(make(), chunks[:5])
    contenders = {
        "splice, RandomSampler": fresh_fill(
            lambda: splice_buffer(capacity, RandomSampler()), chunks
        ),
        "splice, SliceSampler": fresh_fill(
            lambda: splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN)), chunks
        ),
        "splice, SliceSampler, [8, 125] batches": fresh_fill(
            lambda: splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN)), grid
        ),
        "TorchRL, RandomSampler": fresh_fill(lambda: torchrl_buffer(capacity, "random"), chunks),
        "TorchRL, SliceSampler": fresh_fill(lambda: torchrl_buffer(capacity, "slice"), chunks),
        "raw slice copy (torch copy_)": raw_fill(numpy=False),
        "raw slice copy (numpy)": raw_fill(numpy=True),
    }
    t = interleaved(contenders, rounds=rounds, warmup=0, clock=CLOCK[0])
    raw = min(t["raw slice copy (torch copy_)"].median, t["raw slice copy (numpy)"].median)
    ref = t["TorchRL, SliceSampler"].median
    return [
        [name, f"{x.median * 1e3:.0f} ms", ratio(x.median, ref), ratio(x.median, raw)]
        for name, x in t.items()
    ]


def bench_sample(capacity: int, chunks: list[TensorDict], rounds: int) -> tuple[list, dict]:
    data = torch.cat(chunks)  # the stream, to precompute the raw limit's slice starts
    bufs = {
        "splice RandomSampler": splice_buffer(capacity, RandomSampler(seed=0)),
        "splice SliceSampler (weighting=trajectory)": splice_buffer(
            capacity, SliceSampler(slice_len=SLICE_LEN, seed=0)
        ),
        "splice SliceSampler (weighting=transition)": splice_buffer(
            capacity, SliceSampler(slice_len=SLICE_LEN, weighting="transition", seed=0)
        ),
        "splice SliceSampler, [32, 16] + mask": splice_buffer(
            capacity, SliceSampler(slice_len=SLICE_LEN, as_sequences=True, seed=0)
        ),
        "splice PrioritizedSliceSampler": splice_buffer(
            capacity, PrioritizedSliceSampler(alpha=0.6, beta=0.4, slice_len=SLICE_LEN, seed=0)
        ),
        "TorchRL RandomSampler": torchrl_buffer(capacity, "random"),
        "TorchRL SliceSampler": torchrl_buffer(capacity, "slice"),
        "TorchRL SliceSampler(cache_values=True)": torchrl_buffer(capacity, "slice_cached"),
    }
    for rb in bufs.values():
        fill(rb, chunks)
    raw = RawStore(capacity, chunks[0])
    fill(raw, chunks)
    raw.precompute_starts(data[("collector", "traj_ids")][-capacity:])
    contenders: dict[str, Callable[[], object]] = {
        name: (lambda rb=rb: [rb.sample() for _ in range(10)]) for name, rb in bufs.items()
    }
    contenders["raw gather, 512 iid rows"] = lambda: [raw.gather_iid() for _ in range(10)]
    contenders["raw gather, precomputed slices"] = lambda: [raw.gather() for _ in range(10)]
    t = interleaved(contenders, rounds=rounds, warmup=1, clock=CLOCK[0])
    return _sample_rows(t), {k: v.median / 10 for k, v in t.items()}


def _sample_rows(t: dict[str, Timing]) -> list[list[object]]:
    per = {k: v.median / 10 for k, v in t.items()}
    uncached = per["TorchRL SliceSampler"]
    cached = per["TorchRL SliceSampler(cache_values=True)"]
    random = per["splice RandomSampler"]
    raw = per["raw gather, precomputed slices"]
    return [
        [
            name,
            f"{x * 1e3:.3f} ms",
            ratio(uncached, x),
            ratio(cached, x),
            ratio(x, random),
            ratio(x, raw),
        ]
        for name, x in per.items()
    ]


def bench_concurrent(capacity: int, chunks: list[TensorDict], seconds: float) -> list[list[object]]:
    """Sample latency alone and while a background thread extends (1,000 steps per extend,
    as fast as it can): three alternating phases of each, ``seconds`` long, on the same full
    buffer; medians over the phases. "writer CPU / sample": the writer thread's CPU time
    while a sample was in flight, per sample (what the writer took from the sample, in
    interpreter time: on a busy machine the latency ratio hides it, as the writer is
    preempted). The "training loop" row puts 1 ms of GIL-free work (a sleep, as a model
    update's kernels) between samples, as a learner does."""
    rows = []
    makers = {
        "splice SliceSampler": (
            lambda: splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN, seed=0)),
            0.0,
        ),
        "splice SliceSampler, training loop": (
            lambda: splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN, seed=0)),
            1e-3,
        ),
        "TorchRL SliceSampler": (lambda: torchrl_buffer(capacity, "slice"), 0.0),
        "TorchRL SliceSampler(cache_values=True)": (
            lambda: torchrl_buffer(capacity, "slice_cached"),
            0.0,
        ),
    }
    for name, (make, pause) in makers.items():
        rb = make()
        fill(rb, chunks)
        fresh = FreshChunks(min(capacity, 200_000))
        alone: list[float] = []
        busy: list[Latency] = []
        for _ in range(3):
            alone.append(_sample_latency(rb, seconds, None, pause).median)
            busy.append(_sample_latency(rb, seconds, fresh, pause))
        a = float(np.median(alone))
        b = float(np.median([x.median for x in busy]))
        p90 = float(np.median([x.p90 for x in busy]))
        stolen = float(np.median([x.writer_cpu for x in busy]))
        written = sum(x.written for x in busy)
        rows.append(
            [
                name,
                f"{a * 1e3:.3f} ms",
                f"{b * 1e3:.3f} ms (p90 {p90 * 1e3:.3f})",
                f"{b / a:.2f}x",
                f"{stolen * 1e3:.3f} ms",
                f"{written / (3 * seconds):,.0f}",
            ]
        )
    return rows


@dataclass(frozen=True)
class Latency:
    """One phase of :func:`_sample_latency`."""

    median: float
    p90: float
    writer_cpu: float  # the writer's CPU seconds while a sample was in flight, per sample
    written: int


def _sample_latency(rb, seconds: float, fresh: FreshChunks | None, pause: float) -> Latency:
    """``sample()`` latency over ``seconds`` (``pause`` seconds of sleep between samples),
    with a writer thread extending from ``fresh`` when given; and the steps it wrote."""
    stop = threading.Event()
    started = threading.Event()
    written = [0]
    writer_ident = [0]

    def writer() -> None:
        assert fresh is not None
        writer_ident[0] = threading.get_ident()
        started.set()
        while not stop.is_set():
            rb.extend(fresh.next())
            written[0] += CHUNK
            time.sleep(0)  # let the sampling thread in (both libraries alike)

    thread = threading.Thread(target=writer) if fresh is not None else None
    writer_clock: Callable[[], float] = lambda: 0.0  # noqa: E731
    if thread is not None:
        thread.start()
        started.wait()
        if hasattr(time, "pthread_getcpuclockid"):  # Linux: another thread's CPU clock
            clock_id = time.pthread_getcpuclockid(writer_ident[0])
            writer_clock = lambda: time.clock_gettime(clock_id)  # noqa: E731
    times, stolen = [], 0.0
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            w = writer_clock()
            start = time.perf_counter()
            rb.sample()
            times.append(time.perf_counter() - start)
            stolen += writer_clock() - w
            if pause:
                time.sleep(pause)
    finally:
        stop.set()
        if thread is not None:
            thread.join()
    return Latency(
        float(np.median(times)),
        float(np.percentile(times, 90)),
        stolen / len(times),
        written[0],
    )


def bench_loop(capacity: int, chunks: list[TensorDict], rounds: int) -> list[list[object]]:
    """The off-policy loop in one thread: extend(1,000) then sample(512)."""
    bufs = {
        "splice SliceSampler": splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN, seed=0)),
        "TorchRL SliceSampler": torchrl_buffer(capacity, "slice"),
        "TorchRL SliceSampler(cache_values=True)": torchrl_buffer(capacity, "slice_cached"),
    }
    for rb in bufs.values():
        fill(rb, chunks)
    fresh = {name: FreshChunks(min(capacity, 100_000)) for name in bufs}
    data = {name: [f.next() for _ in range(5 * (rounds + 1))] for name, f in fresh.items()}
    state = {name: 0 for name in bufs}

    def step(name: str, rb) -> None:
        for _ in range(5):
            rb.extend(data[name][state[name]])
            state[name] += 1
            rb.sample()

    t = interleaved(
        {n: (lambda n=n, rb=rb: step(n, rb)) for n, rb in bufs.items()},
        rounds=rounds,
        clock=CLOCK[0],
    )
    ref = t["splice SliceSampler"].median
    return [[n, f"{x.median / 5 * 1e3:.3f} ms", ratio(x.median, ref)] for n, x in t.items()]


def bench_prioritized(capacity: int, chunks: list[TensorDict], rounds: int) -> list[list[object]]:
    """PrioritizedSampler (proportional PER, alpha 0.6, beta 0.4) against TorchRL's: the
    sampler's draw of 512 rows (indices and importance weights), the whole ``sample()``, an
    update of 512 priorities, and the two in turn (a PER training step: every draw then
    follows a change of the tree). Raw limits of ``sample()``: splice's draw followed by a
    bare ``np.take`` of every stored column at the drawn rows (no buffer, no TensorDict),
    and that bare gather alone at 512 random rows.

    The priorities are uniform in [0.01, 1.01): splice's sum tree then draws its top node by
    rejection (see ``SumTree.sample``). The last rows repeat the draw and ``sample()`` with
    heavy-tailed priorities (log-normal, sigma 3), where it searches the running sum of the
    top instead."""
    from torchrl.data import LazyTensorStorage as TLazy
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TPrioritized

    mine = ReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=PrioritizedSampler(capacity, alpha=0.6, beta=0.4, seed=0),
        batch_size=BATCH,
    )
    theirs = TensorDictReplayBuffer(
        storage=TLazy(capacity),
        sampler=TPrioritized(capacity, alpha=0.6, beta=0.4),
        batch_size=BATCH,
    )
    gen = torch.Generator().manual_seed(0)
    for rb in (mine, theirs):
        fill(rb, chunks)
        rb.update_priority(torch.arange(capacity), torch.rand(capacity, generator=gen) + 0.01)
        rb.sample()
    rows = torch.randint(capacity, (BATCH,), generator=gen)
    prio = torch.rand(BATCH, generator=gen) + 0.01
    reps = 20
    columns = [c.numpy() for c in mine.storage.columns.values()]

    def draw_and_gather() -> list[np.ndarray]:
        picked = mine.sampler.draw(BATCH).rows
        return [c.take(picked, axis=0) for c in columns]

    def bare_gather() -> list[np.ndarray]:
        picked = torch.randint(capacity, (BATCH,), generator=gen).numpy()
        return [c.take(picked, axis=0) for c in columns]

    contenders: dict[str, Callable[[], object]] = {
        "draw: splice": lambda: [mine.sampler.draw(BATCH) for _ in range(reps)],
        "draw: TorchRL": lambda: [
            theirs.sampler.sample(theirs.storage, BATCH) for _ in range(reps)
        ],
        "sample(): splice": lambda: [mine.sample() for _ in range(reps)],
        "sample(): TorchRL": lambda: [theirs.sample() for _ in range(reps)],
        "raw: draw + bare gather": lambda: [draw_and_gather() for _ in range(reps)],
        "raw: bare gather": lambda: [bare_gather() for _ in range(reps)],
        "update_priority(512): splice": lambda: [
            mine.update_priority(rows, prio) for _ in range(reps)
        ],
        "update_priority(512): TorchRL": lambda: [
            theirs.update_priority(rows, prio) for _ in range(reps)
        ],
        "sample() + update_priority(512): splice": lambda: [
            (mine.sample(), mine.update_priority(rows, prio)) for _ in range(reps)
        ],
        "sample() + update_priority(512): TorchRL": lambda: [
            (theirs.sample(), theirs.update_priority(rows, prio)) for _ in range(reps)
        ],
    }
    t = interleaved(contenders, rounds=rounds, warmup=1, clock=CLOCK[0])
    per = {k: v.median / reps for k, v in t.items()}
    out = []
    for what in ("draw", "sample()", "update_priority(512)", "sample() + update_priority(512)"):
        a, b = per[f"{what}: splice"], per[f"{what}: TorchRL"]
        out.append([what, f"{a * 1e3:.3f} ms", f"{b * 1e3:.3f} ms", ratio(b, a)])
    theirs_sample = per["sample(): TorchRL"]
    for what, key in (
        ("raw: splice's draw + bare gather", "raw: draw + bare gather"),
        ("raw: bare gather of 512 rows", "raw: bare gather"),
    ):
        out.append([what, f"{per[key] * 1e3:.3f} ms", "—", ratio(theirs_sample, per[key])])
    heavy = torch.exp(3.0 * torch.randn(capacity, generator=gen))
    for rb in (mine, theirs):
        rb.update_priority(torch.arange(capacity), heavy)
    t = interleaved(
        {k: contenders[k] for k in ("draw: splice", "draw: TorchRL")}
        | {k: contenders[k] for k in ("sample(): splice", "sample(): TorchRL")},
        rounds=rounds,
        warmup=1,
        clock=CLOCK[0],
    )
    per = {k: v.median / reps for k, v in t.items()}
    for what in ("draw", "sample()"):
        a, b = per[f"{what}: splice"], per[f"{what}: TorchRL"]
        row = f"{what}, log-normal priorities (tree search)"
        out.append([row, f"{a * 1e3:.3f} ms", f"{b * 1e3:.3f} ms", ratio(b, a)])
    return out


def bench_extend_phases(capacity: int, chunks: list[TensorDict]) -> list[list[object]]:
    """Where an extend's time goes: fill a fresh buffer (``SliceSampler``, flat and
    ``[8, 125]`` batches) with a thread-CPU timer around each phase, by wrapping the
    buffer's own steps for the duration (a diagnostic: the wrappers add about 1 us per
    phase). Outside the lock: "check + flatten" (the batch's signature or the checked path)
    and "keys + plan" (trajectory keys, runs); under it: "copy" (the storage's column
    copies), "index" (``ReplayIndex.write_plan``), "sampler" (``on_write``), and the rest
    ("bookkeeping": commit state, returned rows, lock). The raw numpy copy of the same
    batches, per batch, is measured in the same run."""
    from splice.replay import _write as write_module
    from splice.replay import buffer as buffer_module
    from splice.replay.index import ReplayIndex

    clock = time.thread_time_ns
    spent: dict[str, int] = {}
    patches = [
        (buffer_module.ReplayBuffer, "extend", "total"),
        (write_module.Writer, "prepare", "outside the lock"),
        (write_module, "place", "keys + plan"),
        (LazyTensorStorage, "write", "copy"),
        (ReplayIndex, "write_plan", "index"),
        (SliceSampler, "on_write", "sampler"),
    ]
    originals = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patches]

    def timed(fn: Callable[..., object], label: str) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0) + clock() - start

        return run

    rows = []
    try:
        for owner, name, label in patches:
            setattr(owner, name, timed(getattr(owner, name), label))
        for layout, data in (("flat", chunks), ("[8, 125]", [c.reshape(8, 125) for c in chunks])):
            rb = splice_buffer(capacity, SliceSampler(slice_len=SLICE_LEN))
            rb.extend(data[0])  # the first write allocates; not counted
            spent.clear()
            for chunk in data[1:]:
                rb.extend(chunk)
            per = {k: v / (len(data) - 1) / 1e3 for k, v in spent.items()}
            per["check + flatten"] = per["outside the lock"] - per["keys + plan"]
            parts = ("copy", "index", "sampler")
            per["bookkeeping"] = per["total"] - per["outside the lock"] - sum(per[k] for k in parts)
            order = ("check + flatten", "keys + plan", "copy", "index", "sampler", "bookkeeping")
            rows.append([layout, *(f"{per[k]:.0f}" for k in order), f"{per['total']:.0f}"])
    finally:
        for owner, name, fn in originals:
            if fn is None:  # inherited: drop the wrapper
                delattr(owner, name)
            else:
                setattr(owner, name, fn)
    store = RawStore(capacity, chunks[0])
    start = clock()
    for chunk in chunks:
        store.extend_numpy(chunk)
    raw = (clock() - start) / len(chunks) / 1e3
    rows.append(["raw numpy copy", "", "", f"{raw:.0f}", "", "", "", f"{raw:.0f}"])
    return rows


#: Context steps before each slice in the ``context`` section, and the keys read there.
CONTEXT = 48
CONTEXT_KEYS = ("observation", "action", ("next", "reward"))


class RawWindows:
    """The raw limit of a window sample: precomputed window starts (every ``width`` steps in
    one trajectory: no masking, no boundary bookkeeping) and bare gathers of every key, or of
    ``keys`` at every column and the other keys at the last ``train`` columns."""

    def __init__(self, raw: RawStore, ids: torch.Tensor, width: int) -> None:
        self.raw, self.width = raw, width
        same = ids[width - 1 :] == ids[: -(width - 1)]
        self.starts = same.nonzero().squeeze(1)

    def gather(self, train: int, keys: tuple | None) -> dict:
        pick = torch.randint(self.starts.numel(), (SLICES,), generator=self.raw.gen)
        idx = self.starts[pick][:, None] + torch.arange(self.width)
        every, tail = idx.reshape(-1), idx[:, self.width - train :].reshape(-1)
        return {
            k: v.index_select(0, every if keys is None or k in keys else tail)
            for k, v in self.raw.cols.items()
        }


def bench_context(capacity: int, rounds: int) -> list[list[object]]:
    """Slices of 16 training steps with the ``CONTEXT`` steps before each (32 slices, a
    transformer's context), on a stream with longer episodes (mean 200). The nearest peer is
    TorchRL's SliceSampler drawing the whole window as one longer slice (no mask before the
    episode start: it draws only trajectories of at least that length); the raw limits are
    bare gathers of precomputed windows. Scaling: the same with 5x the context."""
    data = cartpole_stream(capacity, 200.0, seed=2)
    chunks = list(data.split(CHUNK))
    ids = data[("collector", "traj_ids")][-capacity:]
    raw = RawStore(capacity, chunks[0])
    fill(raw, chunks)
    keys = CONTEXT_KEYS

    def context(k: int, align: str, with_keys: bool) -> SliceSampler:
        return SliceSampler(
            slice_len=SLICE_LEN,
            burn_in=k,
            burn_in_align=align,
            burn_in_keys=list(CONTEXT_KEYS) if with_keys else None,
            as_sequences=True,
            seed=0,
        )

    long = 5 * CONTEXT
    bufs = {
        f"splice, context {CONTEXT} (right), context keys only": context(CONTEXT, "right", True),
        f"splice, context {CONTEXT} (right), every key": context(CONTEXT, "right", False),
        f"splice, burn-in {CONTEXT} (left), every key": context(CONTEXT, "left", False),
        f"splice, slice_len={CONTEXT + SLICE_LEN}, no context": SliceSampler(
            slice_len=CONTEXT + SLICE_LEN, as_sequences=True, seed=0
        ),
        f"splice, context {long} (right), context keys only": context(long, "right", True),
    }
    buffers = {}
    for name, sampler in bufs.items():
        batch = SLICES * (CONTEXT + SLICE_LEN if "no context" in name else SLICE_LEN)
        rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=batch)
        fill(rb, chunks)
        buffers[name] = rb
    from torchrl.data import LazyTensorStorage as TLazy
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers import SliceSampler as TSlice

    torchrl = TensorDictReplayBuffer(
        storage=TLazy(capacity),
        sampler=TSlice(slice_len=CONTEXT + SLICE_LEN, end_key=("next", "done")),
        batch_size=SLICES * (CONTEXT + SLICE_LEN),
    )
    fill(torchrl, chunks)
    windows = {w: RawWindows(raw, ids, w + SLICE_LEN) for w in (CONTEXT, long)}
    contenders: dict[str, Callable[[], object]] = {
        name: (lambda rb=rb: [rb.sample() for _ in range(10)]) for name, rb in buffers.items()
    }
    contenders[f"TorchRL SliceSampler(slice_len={CONTEXT + SLICE_LEN})"] = lambda: [
        torchrl.sample() for _ in range(10)
    ]
    for w, win in windows.items():
        contenders[f"raw gather, {w}+{SLICE_LEN} windows, every key"] = lambda win=win: [
            win.gather(SLICE_LEN, None) for _ in range(10)
        ]
        contenders[f"raw gather, {w}+{SLICE_LEN} windows, context keys only"] = lambda win=win: [
            win.gather(SLICE_LEN, keys) for _ in range(10)
        ]
    t = interleaved(contenders, rounds=rounds, warmup=1, clock=CLOCK[0])
    per = {k: v.median / 10 for k, v in t.items()}
    peer = per[f"TorchRL SliceSampler(slice_len={CONTEXT + SLICE_LEN})"]
    rows = []
    for name, x in per.items():
        w = long if f" {long} " in name or f"{long}+" in name else CONTEXT
        every = per[f"raw gather, {w}+{SLICE_LEN} windows, every key"]
        keyed = per[f"raw gather, {w}+{SLICE_LEN} windows, context keys only"]
        rows.append([name, f"{x * 1e3:.3f} ms", ratio(peer, x), ratio(x, every), ratio(x, keyed)])
    return rows


SECTIONS = ("extend", "phases", "sample", "context", "loop", "prioritized", "concurrent")


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--cpu-time", action="store_true", help="time in CPU time, not wall time")
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS)})",
    )
    args = p.parse_args()
    sections = set(args.sections.split(","))
    unknown = sections - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.cpu_time:
        CLOCK[0] = time.process_time
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # Before TorchRL is imported: its prioritized samplers need the C++ extension.
    missing_extension = (
        load_torchrl_extension(build=not args.quick) if "prioritized" in sections else None
    )
    capacity = 20_000 if args.quick else 1_000_000
    rounds = 2 if args.quick else 5
    chunks = list(cartpole_stream(capacity, 20.0).split(CHUNK))
    print(
        f"# Replay buffer: {capacity:,} CartPole transitions, extends of {CHUNK:,}, "
        f"samples of {BATCH} ({SLICES} x {SLICE_LEN}); "
        f"{'CPU' if args.cpu_time else 'wall'} time; load average {os.getloadavg()[0]:.1f}\n"
    )
    if "extend" in sections:
        print("## extend (whole fill)\n")
        print(
            table(
                ["contender", "time", "this / TorchRL slice", "this / raw (faster copy)"],
                bench_extend(capacity, chunks, 1 if args.quick else 3),
            )
        )
    if "phases" in sections:
        print("\n## extend: where the time goes (us of thread CPU per extend of 1,000)\n")
        print(
            table(
                [
                    "batches",
                    "check + flatten",
                    "keys + plan",
                    "copy",
                    "index",
                    "sampler",
                    "bookkeeping",
                    "total",
                ],
                bench_extend_phases(capacity, chunks),
            )
        )
    if "sample" in sections:
        print("\n## sample (buffer full)\n")
        rows, _ = bench_sample(capacity, chunks, 2 if args.quick else 11)
        print(
            table(
                [
                    "contender",
                    "per sample",
                    "TorchRL uncached / this",
                    "TorchRL cached / this",
                    "this / splice random",
                    "this / raw slices",
                ],
                rows,
            )
        )
    if "context" in sections:
        print(
            f"\n## sample with context: {SLICES} slices x ({CONTEXT} + {SLICE_LEN}) steps, "
            "episodes of mean 200\n"
        )
        print(
            table(
                [
                    "contender",
                    "per sample",
                    "TorchRL / this",
                    "this / raw (every key)",
                    "this / raw (context keys)",
                ],
                bench_context(capacity, 2 if args.quick else 11),
            )
        )
    if "loop" in sections:
        print("\n## extend(1,000) then sample(512), one thread\n")
        loop = bench_loop(capacity, chunks, rounds)
        print(table(["contender", "per extend+sample", "this / splice"], loop))
    if "prioritized" in sections:
        print(f"\n## PrioritizedSampler: 512 of {capacity:,} steps\n")
        if missing_extension is None:
            print(
                table(
                    ["operation", "splice", "TorchRL", "TorchRL / splice (raw: / raw)"],
                    bench_prioritized(capacity, chunks, 3 if args.quick else 11),
                )
            )
        else:
            print(f"TorchRL's PrioritizedSampler is unavailable: {missing_extension}")
    if "concurrent" in sections:
        print("\n## sample while a background thread extends\n")
        print(
            table(
                [
                    "contender",
                    "sample alone",
                    "sample, writer running",
                    "writer / alone",
                    "writer CPU / sample",
                    "steps written/s",
                ],
                bench_concurrent(capacity, chunks, 0.2 if args.quick else 2.0),
            )
        )


if __name__ == "__main__":
    main()
