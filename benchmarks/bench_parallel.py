"""Multi-process collection: splice's MultiSync/MultiAsync collectors vs one process, vs
TorchRL 0.14.1's multi-process collectors, vs plain gymnasium loops, and a replay buffer fed
by workers while the learner samples. Everything in one process run, ratios side by side.

* scaling: CartPole whose step also burns ~0.5 ms of CPU (``BusyCartPole``), random actions,
  one env per worker: 2 workers vs one ``splice.Collector`` on the same env;
* vs TorchRL: CartPole-v1 with a 2x64 MLP policy, 2 workers of one env each, splice's
  ``MultiSyncCollector``/``MultiAsyncCollector`` vs TorchRL's;
* overhead: cheap CartPole (random actions), 2 workers vs the same envs stepped by 2 plain
  gymnasium loops in 2 processes that return nothing (started the same way);
* sample latency: ``rb.sample()`` of a buffer that 2 workers feed (``start()``) vs the same
  buffer with no writer;
* worker start-up: the first start (the fork server imports splice/torch once) and later ones;
* Ray: the ``"ray"`` backend (each worker a Ray actor, batches through Ray's object store) vs
  the ``"process"`` backend on the same 1,000-frame batches of cheap CartPole, 2 workers: the
  time per batch of each, the difference (the Ray backend's per-batch overhead) and the ratio,
  and the raw limit: the same number of actor calls per batch (one per worker for a sync
  batch, one for an async one) to actors that return a fixed batch-sized reply. CPU time is
  read per thread to the nanosecond there (the 10-ms ticks of the other sections would make
  one round's figure uncertain by about +-1.5 ms per batch), and the overhead is the median
  of each round's difference. A local Ray instance (``ray.init(num_cpus=2)``) is started for
  it and shut down after (``--quick``: the sync collectors only).

Contenders are timed round-robin (a pause before each lets an async collector's batches in
flight finish, so they never run during another contender's timing); medians are printed.
Two figures per contender: frames per second of wall time, and frames per CPU second of all
the run's processes (the parent, workers, the fork server's children, TorchRL's workers). On a
shared, loaded machine the first depends on how much CPU the scheduler grants; the second is
the cost of the work itself. The load average is printed with the figures.

    python -m benchmarks.bench_parallel [--quick]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import splice
from benchmarks._harness import load, parser, table
from benchmarks.bench_collector import MLPPolicy, mlp_policy

WORKERS = 2
BUSY_SECONDS = 0.0005


class BusyCartPole(gym.Wrapper):  # type: ignore[type-arg]
    """CartPole-v1 whose every step also burns ``BUSY_SECONDS`` of CPU time (a costly env)."""

    def step(self, action: Any) -> Any:
        end = time.thread_time() + BUSY_SECONDS
        while time.thread_time() < end:
            pass
        return self.env.step(action)


def busy_cartpole() -> gym.Env:  # type: ignore[type-arg]
    return BusyCartPole(gym.make("CartPole-v1"))


def cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def cartpole8() -> gym.vector.VectorEnv:  # type: ignore[type-arg]
    return gym.vector.SyncVectorEnv([cartpole] * 8)


# ----------------------------------------------------------------------------- timing
def _process_tree() -> list[int]:
    """This process and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def tree_cpu_seconds() -> float:
    """CPU time used so far by this process and every process below it (workers, the fork
    server's children, TorchRL's workers): the work a contender costs, whatever the load.
    Read from the kernel's per-process counters, which tick at 10 ms."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in _process_tree():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def tree_cpu_seconds_precise() -> float:
    """:func:`tree_cpu_seconds` to the nanosecond: the run time of every live thread of the
    tree (``/proc/PID/task/TID/schedstat``). Threads that ended are not counted, so it is
    for contenders whose processes and threads all live through the timing (Ray's do: its
    services, workers and their threads are long-lived). A timing of 40 batches at 10-ms
    ticks over ~6 processes is uncertain by about +-1.5 ms per batch; this is not."""
    total = 0
    for pid in _process_tree():
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


class Batches:
    """A contender that takes ``frames`` frames of batches from a collector's iterator.

    ``ahead`` is the number of batches an asynchronous collector (splice's or TorchRL's) has
    granted its workers at any time; they are collected during the pause before a timing.
    :meth:`prepare` takes those (untimed), so that the timing starts with freshly granted
    batches and counts only work done inside it (the batches granted at its end are work
    done but not counted: a slight underestimate).
    """

    def __init__(self, collector: Any, frames: int, ahead: int = 0) -> None:
        self.iterator = iter(collector)
        self.frames = frames
        self.ahead = ahead

    def prepare(self) -> None:
        for _ in range(self.ahead):
            next(self.iterator)

    def __call__(self) -> int:
        done = 0
        while done < self.frames:
            done += next(self.iterator).numel()
        return done


def timed_rounds(
    contenders: dict[str, Callable[[], int]],
    rounds: int,
    settle: float,
    cpu_clock: Callable[[], float] = tree_cpu_seconds,
) -> dict[str, list[tuple[float, float]]]:
    """Frames/s and frames per CPU second (all processes, read by ``cpu_clock``) of each
    contender (``run() -> frames``; ``run.prepare()`` first if it has one) in each round,
    the contenders timed in turns."""
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            time.sleep(settle)
            prepare = getattr(run, "prepare", None)
            if prepare is not None:
                prepare()
            start, start_cpu = time.perf_counter(), cpu_clock()
            frames = run()
            wall = frames / (time.perf_counter() - start)
            timings[name].append((wall, frames / max(cpu_clock() - start_cpu, 1e-3)))
    return timings


def round_robin(
    contenders: dict[str, Callable[[], int]], rounds: int, settle: float
) -> dict[str, tuple[float, float]]:
    """Median frames/s and frames per CPU second of each contender over :func:`timed_rounds`."""
    return {
        name: (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
        for name, runs in timed_rounds(contenders, rounds, settle).items()
    }


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


# ---------------------------------------------------------------------------- scaling
def bench_scaling(quick: bool) -> list[list[str]]:
    fpb = 100 if quick else 400
    frames = fpb * (1 if quick else 5)
    single = splice.Collector(busy_cartpole(), frames_per_batch=fpb, seed=0)
    sync = splice.MultiSyncCollector(
        busy_cartpole, num_workers=WORKERS, frames_per_batch=fpb, seed=0
    )
    async_ = splice.MultiAsyncCollector(
        busy_cartpole, num_workers=WORKERS, frames_per_batch=fpb // WORKERS, seed=0
    )
    try:
        fps = round_robin(
            {
                "Collector (1 process)": Batches(single, frames),
                "MultiSyncCollector (2 workers)": Batches(sync, frames),
                "MultiAsyncCollector (2 workers)": Batches(async_, frames, ahead=WORKERS),
            },
            rounds=1 if quick else 5,
            settle=0.3,
        )
    finally:
        for c in (single, sync, async_):
            c.shutdown()
    base, base_cpu = fps["Collector (1 process)"]
    return [
        [name, f"{value:,.0f}", ratio(value, base), f"{per_cpu:,.0f}", ratio(per_cpu, base_cpu)]
        for name, (value, per_cpu) in fps.items()
    ]


# ---------------------------------------------------------------------------- TorchRL
def torchrl_collectors(fpb: int) -> dict[str, Any]:
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
    from torchrl.envs import GymEnv

    def make() -> Any:
        return GymEnv("CartPole-v1", categorical_action_encoding=True)

    return {
        "TorchRL MultiSyncCollector": MultiSyncCollector(
            [make] * WORKERS, mlp_policy(), frames_per_batch=fpb, total_frames=-1
        ),
        "TorchRL MultiAsyncCollector": MultiAsyncCollector(
            [make] * WORKERS, mlp_policy(), frames_per_batch=fpb // WORKERS, total_frames=-1
        ),
    }


def bench_torchrl(quick: bool) -> list[list[str]]:
    fpb = 200 if quick else 1000
    collectors: dict[str, Any] = {
        "splice MultiSyncCollector": splice.MultiSyncCollector(
            cartpole, mlp_policy(), num_workers=WORKERS, frames_per_batch=fpb, seed=0
        ),
        "splice MultiAsyncCollector": splice.MultiAsyncCollector(
            cartpole, mlp_policy(), num_workers=WORKERS, frames_per_batch=fpb // WORKERS, seed=0
        ),
    }
    collectors.update(torchrl_collectors(fpb))
    try:
        frames = {
            name: fpb * (1 if quick else (20 if name.startswith("splice") else 4))
            for name in collectors
        }
        fps = round_robin(
            {
                name: Batches(c, frames[name], ahead=WORKERS if "Async" in name else 0)
                for name, c in collectors.items()
            },
            rounds=1 if quick else 5,
            settle=0.3,
        )
    finally:
        for c in collectors.values():
            c.shutdown()
    rows = []
    for kind in ("Sync", "Async"):
        ours, theirs = fps[f"splice Multi{kind}Collector"], fps[f"TorchRL Multi{kind}Collector"]
        rows.append(
            [
                f"Multi{kind}Collector",
                f"{ours[0]:,.0f}",
                f"{theirs[0]:,.0f}",
                ratio(ours[0], theirs[0]),
                f"{ours[1]:,.0f}",
                f"{theirs[1]:,.0f}",
                ratio(ours[1], theirs[1]),
            ]
        )
    return rows


# --------------------------------------------------------------------------- overhead
def plain_loop(conn: Any, make: Callable[[], Any], steps: int) -> None:
    """Step ``make()`` with random actions ``steps`` times per request; return nothing."""
    env = make()
    env.reset(seed=0)
    env.action_space.seed(0)
    single = not isinstance(env, gym.vector.VectorEnv)
    while conn.recv():
        for _ in range(steps):
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if single and (term or trunc):
                env.reset()
        conn.send(True)
    env.close()


class PlainLoops:
    """The raw limit: ``WORKERS`` processes stepping their env, told when to go."""

    def __init__(self, make: Callable[[], Any], num_envs: int, frames: int) -> None:
        ctx = mp.get_context("forkserver")
        self.frames = frames
        steps = frames // (WORKERS * num_envs)
        self.conns, self.procs = [], []
        for _ in range(WORKERS):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=plain_loop, args=(child, make, steps))
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self) -> int:
        for conn in self.conns:
            conn.send(True)
        for conn in self.conns:
            conn.recv()
        return self.frames

    def close(self) -> None:
        for conn in self.conns:
            conn.send(False)
        for proc in self.procs:
            proc.join(10)


def bench_overhead(quick: bool) -> list[list[str]]:
    rows = []
    for name, make, num_envs in (
        ("1 env / worker", cartpole, 1),
        ("8 envs / worker", cartpole8, 8),
    ):
        fpb = 2000 if quick else 8000
        frames = fpb * (1 if quick else 20)
        plain = PlainLoops(make, num_envs, frames)
        sync = splice.MultiSyncCollector(make, num_workers=WORKERS, frames_per_batch=fpb, seed=0)
        async_ = splice.MultiAsyncCollector(
            make, num_workers=WORKERS, frames_per_batch=fpb // WORKERS, seed=0
        )
        try:
            plain.run()  # warm up
            fps = round_robin(
                {
                    "plain": plain.run,
                    "sync": Batches(sync, frames),
                    "async": Batches(async_, frames, ahead=WORKERS),
                },
                rounds=1 if quick else 5,
                settle=0.2,
            )
        finally:
            plain.close()
            sync.shutdown()
            async_.shutdown()
        for i, unit in ((0, "frames/s"), (1, "frames/CPU s")):
            plain_fps, sync_fps, async_fps = fps["plain"][i], fps["sync"][i], fps["async"][i]
            rows.append(
                [
                    name,
                    unit,
                    f"{plain_fps:,.0f}",
                    f"{sync_fps:,.0f}",
                    f"{async_fps:,.0f}",
                    ratio(sync_fps, plain_fps),
                    ratio(async_fps, plain_fps),
                ]
            )
    return rows


# ----------------------------------------------------------------------- sample latency
def sample_latency(rb: splice.ReplayBuffer, seconds: float) -> tuple[float, int]:
    """Median ``rb.sample()`` time over ``seconds`` of sampling, and the number of samples."""
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        rb.sample()
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(times)


def bench_latency(quick: bool) -> list[list[str]]:
    capacity = 50_000 if quick else 200_000
    rb = splice.ReplayBuffer(
        storage=splice.LazyTensorStorage(capacity),
        sampler=splice.SliceSampler(slice_len=16, seed=0),
        batch_size=512,
    )
    with splice.Collector(
        cartpole8(), frames_per_batch=capacity // 2, total_frames=capacity, replay_buffer=rb
    ) as filler:
        for _ in filler:
            pass
    seconds = 0.5 if quick else 3.0
    rows = []
    for kind in (splice.MultiSyncCollector, splice.MultiAsyncCollector):
        idle, _ = sample_latency(rb, seconds)
        collector = kind(
            cartpole8, num_workers=WORKERS, frames_per_batch=1000, seed=0, replay_buffer=rb
        )
        written = rb.write_count
        collector.start()
        time.sleep(0.5)
        start, before = time.perf_counter(), rb.write_count
        busy, samples = sample_latency(rb, seconds)
        rate = (rb.write_count - before) / (time.perf_counter() - start)
        collector.shutdown()
        assert rb.write_count - written == collector.frames == sum(collector.worker_frames)
        rows.append(
            [
                kind.__name__,
                f"{idle * 1e3:.2f} ms",
                f"{busy * 1e3:.2f} ms",
                ratio(busy, idle),
                f"{rate:,.0f}",
                str(samples),
            ]
        )
    return rows


# ---------------------------------------------------------------------------- start-up
def bench_startup() -> list[list[str]]:
    rows = []
    for label in ("first (fork server starts)", "later"):
        start = time.perf_counter()
        collector = splice.MultiSyncCollector(cartpole, num_workers=WORKERS, frames_per_batch=10)
        built = time.perf_counter() - start
        collector.shutdown()
        rows.append([label, f"{built:.2f} s", f"{time.perf_counter() - start - built:.2f} s"])
    return rows


# -------------------------------------------------------------------------------- Ray
RAY_FRAMES_PER_BATCH = 1000


RAY_ROUNDS = 10
#: Bytes of a worker's reply per frame of cheap CartPole (29,262 bytes for a 500-frame part).
RAY_REPLY_BYTES_PER_FRAME = 59


class FixedReply:
    """A Ray actor body answering every call with the same bytes: the raw limit of the Ray
    backend, an actor call that returns a batch-sized reply (no env, no policy, no packing)."""

    def __init__(self, size: int) -> None:
        self.reply = bytes(size)

    def collect_next(self) -> bytes:
        return self.reply


class RayCalls:
    """A contender that makes, per batch, the actor calls the Ray backend makes (one per
    worker for a sync batch, one for an async one) to :class:`FixedReply` actors."""

    def __init__(self, actors: list[Any], calls_per_batch: int, batches: int) -> None:
        self.actors, self.calls, self.batches = actors, calls_per_batch, batches
        self.turn = 0

    def __call__(self) -> int:
        import ray

        for _ in range(self.batches):
            refs = []
            for _ in range(self.calls):
                refs.append(self.actors[self.turn % len(self.actors)].collect_next.remote())
                self.turn += 1
            ray.get(refs)
        return self.batches * RAY_FRAMES_PER_BATCH


def bench_ray(quick: bool) -> list[list[str]]:
    """Milliseconds per 1,000-frame batch (wall and CPU of every process, Ray's own
    included), process backend vs Ray backend, sync and async: medians over the rounds, and
    the overhead as the median of each round's difference (the two timed back to back)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(
        num_cpus=WORKERS,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    batches = 4 if quick else 40
    # --quick: the sync collectors only (each Ray actor start imports torch: seconds).
    kinds = [splice.MultiSyncCollector] + ([] if quick else [splice.MultiAsyncCollector])
    fpb = RAY_FRAMES_PER_BATCH
    collectors: dict[str, Any] = {}
    try:
        for kind in kinds:
            for backend in ("process", "ray"):
                # Both Ray collectors' actors (4) fit in the 2 CPUs: they never run together.
                options = {"num_cpus": 0.5} if backend == "ray" else {}
                name = f"{'sync' if kind is splice.MultiSyncCollector else 'async'} {backend}"
                collectors[name] = kind(
                    cartpole,
                    num_workers=WORKERS,
                    frames_per_batch=fpb,
                    seed=0,
                    backend=backend,
                    backend_options=options,
                )
        contenders: dict[str, Callable[[], int]] = {}
        for name, c in collectors.items():
            kind = name.split()[0]
            ahead = WORKERS if kind == "async" else 0
            contenders[name] = Batches(c, fpb * batches, ahead=ahead)
            if name.endswith("ray"):  # the raw limit: Ray's calls alone, as many per batch
                calls = WORKERS if kind == "sync" else 1
                size = RAY_REPLY_BYTES_PER_FRAME * fpb // calls
                actors = [ray.remote(num_cpus=0)(FixedReply).remote(size) for _ in range(WORKERS)]
                ray.get([actor.collect_next.remote() for actor in actors])
                contenders[f"{kind} calls"] = RayCalls(actors, calls, batches)
        timings = timed_rounds(
            contenders,
            rounds=1 if quick else RAY_ROUNDS,
            settle=0.3,
            cpu_clock=tree_cpu_seconds_precise,
        )
    finally:
        for c in collectors.values():
            c.shutdown()
        ray.shutdown()
    rows = []
    for kind in ("sync",) if quick else ("sync", "async"):
        for i, unit in ((0, "wall"), (1, "CPU")):
            process_ms = [1e3 * fpb / t[i] for t in timings[f"{kind} process"]]
            ray_ms = [1e3 * fpb / t[i] for t in timings[f"{kind} ray"]]
            calls_ms = statistics.median(1e3 * fpb / t[i] for t in timings[f"{kind} calls"])
            overheads = [r - p for r, p in zip(ray_ms, process_ms, strict=True)]
            process, ray_median = statistics.median(process_ms), statistics.median(ray_ms)
            rows.append(
                [
                    f"Multi{kind.capitalize()}Collector",
                    unit,
                    f"{process:.2f} ms",
                    f"{ray_median:.2f} ms",
                    f"{statistics.median(overheads):+.2f} ms",
                    f"{min(overheads):+.2f} .. {max(overheads):+.2f} ms",
                    ratio(ray_median, process),
                    f"{calls_ms:.2f} ms",
                ]
            )
    return rows


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    torch.set_num_threads(1)
    quick = args.quick
    np.random.seed(0)
    print(f"# Multi-process collection ({WORKERS} workers)\n")
    print(f"start: {load()}\n")
    print("## Worker start-up (2 workers, CartPole)\n")
    print(table(["start", "construct", "shutdown"], bench_startup()))
    print("\n## Scaling: CartPole + 0.5 ms of CPU per step, random actions, frames/s\n")
    headers = ["collector", "frames/s", "vs Collector", "frames/CPU s", "vs Collector"]
    print(table(headers, bench_scaling(quick)))
    print("\n## vs TorchRL 0.14.1: CartPole, 2x64 MLP, 2 workers x 1 env\n")
    headers = [
        "collector",
        "splice frames/s",
        "TorchRL frames/s",
        "splice / TorchRL",
        "splice frames/CPU s",
        "TorchRL frames/CPU s",
        "splice / TorchRL (CPU)",
    ]
    print(table(headers, bench_torchrl(quick)))
    print("\n## Overhead: cheap CartPole, random actions, vs 2 plain loops in 2 processes\n")
    headers = [
        "envs",
        "unit",
        "plain loops",
        "MultiSync",
        "MultiAsync",
        "Sync / plain",
        "Async / plain",
    ]
    print(table(headers, bench_overhead(quick)))
    print("\n## Sample latency (512 frames, slices of 16) while 2 workers feed the buffer\n")
    headers = ["collector", "no writer", "2 workers writing", "ratio", "frames/s written", "n"]
    print(table(headers, bench_latency(quick)))
    print(f"\n## Ray vs process backend: time per {RAY_FRAMES_PER_BATCH:,}-frame batch\n")
    print(
        "(cheap CartPole, random actions, 2 workers x 1 env; CPU: every thread of every "
        f"process, Ray's too, to the ns; medians of {RAY_ROUNDS} rounds of 40 batches; "
        "overhead: median and range of each round's ray - process; Ray's calls alone: the "
        "same actor calls per batch to actors returning a fixed batch-sized reply, the raw "
        "limit)\n"
    )
    headers = [
        "collector",
        "time",
        "process",
        "ray",
        "ray overhead",
        "overhead range",
        "ray / process",
        "Ray's calls alone",
    ]
    print(table(headers, bench_ray(quick)))
    print(f"\nend: {load()}")


if __name__ == "__main__":
    main()

__all__ = ["MLPPolicy", "busy_cartpole", "cartpole", "cartpole8"]
