"""Next observations stored once (``dedup_next``): stored bytes and sample time vs storing both.

Two tables, every contender measured in one process run:

1. **Atari-like stream**: ``[4, 84, 84]`` uint8 frame stacks (``obs[t]`` = frames ``t..t+3``
   of its episode, ``("next", obs)[t]`` = frames ``t+1..t+4``, so an episode's final
   observation is its own and the next episode starts from new frames), 8 envs, geometric
   episode lengths (mean 400 steps), extended in ``[8, 125]`` chunks. Contenders: splice's
   ``LazyTensorStorage`` storing next observations once (the default), the same storing both
   (``dedup_next=False``), TorchRL 0.14.1's ``LazyTensorStorage`` (stores both; it has no
   such option) and the raw limit (preallocated columns, bare slice copies, a bare gather of
   precomputed slice indices). Stored bytes are also given per 1M transitions (the ratio does
   not depend on the capacity: the pool holds episode ends and chunk ends). Sampling: 32
   slices x 16 steps (``SliceSampler``).
   Targets (issue 13): stored bytes <= 0.55x storing both; sample <= 1.5x storing both.
2. **Real envs**: ALE Pong with gymnasium's standard Atari wrappers (``[4, 84, 84]`` uint8)
   and raw MiniGrid (``[7, 7, 3]`` uint8 image, its text ``mission`` stored too), collected
   by :class:`splice.Collector` (4 envs, random actions) into both splice storages.

Run: ``python -m benchmarks.bench_dedup [--quick]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase

import splice
from benchmarks._harness import interleaved, parser, ratio, table
from benchmarks.bench_replay import RawStore
from splice.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
from splice.testing import ENV_ZOO, SyntheticStream

SLICES, SLICE_LEN = 32, 16
BATCH = SLICES * SLICE_LEN
FRAME = (84, 84)
STACK = 4
N_ENV, CHUNK_T = 8, 125  # 1,000 steps per extend
MEAN_LEN = 400.0
TABLE_FRAMES = 997  # distinct random frames the stream draws from (a prime)


# ---------------------------------------------------------------------- data
class FrameStream:
    """Atari-like chunks: frame stacks built from a table of random frames, indexed by the
    episode and the step, so consecutive stacks share frames exactly as a frame stack does."""

    def __init__(self, seed: int = 0) -> None:
        self.steps = SyntheticStream(N_ENV, MEAN_LEN, seed=seed, labels=True)
        gen = torch.Generator().manual_seed(seed)
        self.frames = torch.randint(
            0, 256, (TABLE_FRAMES, *FRAME), dtype=torch.uint8, generator=gen
        )

    def stacks(self, ep: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        frame = (ep * 7919 + first)[..., None] + torch.arange(STACK)
        return self.frames[frame % TABLE_FRAMES]

    def chunk(self) -> TensorDict:
        c = self.steps.chunk(CHUNK_T)
        ep, t = c["ep"], c["t"]
        return TensorDict(
            {
                "observation": self.stacks(ep, t),
                "action": c["action"],
                ("next", "observation"): self.stacks(ep, t + 1),
                ("next", "reward"): c["next", "reward"],
                ("next", "done"): c["next", "done"],
                ("next", "terminated"): c["next", "terminated"],
                ("next", "truncated"): c["next", "truncated"],
                ("collector", "traj_ids"): c["collector", "traj_ids"],
            },
            batch_size=c.batch_size,
        )


# ---------------------------------------------------------------------- contenders
def splice_buffer(capacity: int, dedup: bool, strict: bool = True) -> ReplayBuffer:
    return ReplayBuffer(
        storage=LazyTensorStorage(capacity, dedup_next=dedup),
        sampler=SliceSampler(slice_len=SLICE_LEN, strict_length=strict, seed=0),
        batch_size=BATCH,
    )


def torchrl_buffer(capacity: int):
    from torchrl.data import LazyTensorStorage as TLazy
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers import SliceSampler as TSlice

    return TensorDictReplayBuffer(
        storage=TLazy(capacity),
        sampler=TSlice(slice_len=SLICE_LEN, traj_key=("collector", "traj_ids")),
        batch_size=BATCH,
    )


def torchrl_nbytes(rb) -> int:
    stored = rb.storage._storage  # TorchRL keeps its columns in one TensorDict
    return sum(v.numel() * v.element_size() for v in stored.values(True, True))


def gib_per_million(nbytes: int, capacity: int) -> str:
    return f"{nbytes / capacity * 1e6 / 2**30:.1f} GiB"


# ---------------------------------------------------------------------- measurements
def bench_stream(capacity: int, rounds: int) -> list[list[object]]:
    stream = FrameStream()
    chunks = [stream.chunk() for _ in range(capacity // (N_ENV * CHUNK_T) + 2)]  # wrapped
    makers: dict[str, Callable[[], object]] = {
        "splice, stored once": lambda: splice_buffer(capacity, True),
        "splice, both stored": lambda: splice_buffer(capacity, False),
        "TorchRL LazyTensorStorage": lambda: torchrl_buffer(capacity),
        "raw slice copy / gather": lambda: RawStore(capacity, chunks[0].reshape(-1)),
    }
    filled: dict[str, object] = {}

    def filler(name: str) -> Callable[[], None]:
        def fill() -> None:
            filled.pop(name, None)  # free the previous round's buffer first
            rb = makers[name]()
            flat = not name.startswith("splice")  # TorchRL and the raw store: [B, T] as B*T rows
            for chunk in chunks:
                rb.extend(chunk.reshape(-1) if flat else chunk)
            filled[name] = rb

        return fill

    extend = interleaved({name: filler(name) for name in makers}, rounds=rounds, warmup=0)
    raw = filled["raw slice copy / gather"]
    assert isinstance(raw, RawStore)
    raw.precompute_starts(raw.cols[("collector", "traj_ids")])
    samplers: dict[str, Callable[[], object]] = {
        name: (lambda rb=rb: [rb.sample() for _ in range(5)])
        for name, rb in filled.items()
        if not isinstance(rb, RawStore)
    }
    samplers["raw slice copy / gather"] = lambda: [raw.gather() for _ in range(5)]
    sample = interleaved(samplers, rounds=max(rounds, 3) * 2, warmup=1)
    nbytes = {
        "splice, stored once": filled["splice, stored once"].storage.nbytes,  # type: ignore[attr-defined]
        "splice, both stored": filled["splice, both stored"].storage.nbytes,  # type: ignore[attr-defined]
        "TorchRL LazyTensorStorage": torchrl_nbytes(filled["TorchRL LazyTensorStorage"]),
        "raw slice copy / gather": sum(v.numel() * v.element_size() for v in raw.cols.values()),
    }
    once = filled["splice, stored once"]
    both = filled["splice, both stored"]
    live = torch.from_numpy(once.index.live_rows())  # type: ignore[attr-defined]
    assert torch.equal(
        once[live]["next", "observation"],  # type: ignore[index]
        both[live]["next", "observation"],  # type: ignore[index]
    ), "stored once must read back bit-identical"
    ref_bytes, ref_sample = nbytes["splice, both stored"], sample["splice, both stored"].median
    return [
        [
            name,
            f"{nbytes[name] / 2**20:.0f} MiB",
            f"{nbytes[name] / ref_bytes:.3f}x",
            gib_per_million(nbytes[name], capacity),
            f"{extend[name].median * 1e3 / len(chunks):.1f} ms",
            f"{sample[name].median * 1e3 / 5:.2f} ms",
            f"{sample[name].median / ref_sample:.2f}x",
            ratio(sample[name].median, sample["raw slice copy / gather"].median),
        ]
        for name in makers
    ]


def collect(family_name: str, frames: int) -> list[TensorDictBase]:
    family = next(f for f in ENV_ZOO if f.name == family_name)
    env = family.make_vec(4)
    batches = []
    with splice.Collector(env, frames_per_batch=400, total_frames=frames, seed=0) as collector:
        for batch in collector:
            batches.append(batch)
    return batches


def bench_envs(frames: int, rounds: int) -> list[list[object]]:
    rows = []
    for name, key in (("atari", "observation"), ("minigrid", ("observation", "image"))):
        try:
            batches = collect(name, frames)
        except ImportError as e:  # an optional env package is missing
            rows.append([name, f"skipped: {e}", "", "", "", ""])
            continue
        capacity = sum(b.numel() for b in batches)
        once, both = splice_buffer(capacity, True, False), splice_buffer(capacity, False, False)
        for batch in batches:
            once.extend(batch)
            both.extend(batch)
        live = torch.from_numpy(once.index.live_rows())
        next_key = ("next", *((key,) if isinstance(key, str) else key))
        assert torch.equal(once[live][next_key], both[live][next_key])
        t = interleaved(
            {
                "once": lambda once=once: [once.sample() for _ in range(5)],
                "both": lambda both=both: [both.sample() for _ in range(5)],
            },
            rounds=rounds,
            warmup=1,
        )
        shape = list(batches[0].get(key).shape[2:])
        pool = once.storage.shared[next_key].pool_rows_used
        rows.append(
            [
                f"{name} {shape} uint8, {capacity} steps",
                f"{pool} ({pool / capacity:.1%})",
                f"{once.storage.nbytes / 2**20:.1f} / {both.storage.nbytes / 2**20:.1f} MiB",
                f"{once.storage.nbytes / both.storage.nbytes:.3f}x",
                f"{t['once'].median * 1e3 / 5:.2f} / {t['both'].median * 1e3 / 5:.2f} ms",
                f"{t['once'].median / t['both'].median:.2f}x",
            ]
        )
    return rows


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)
    capacity = 2_000 if args.quick else int(os.environ.get("SPLICE_BENCH_DEDUP_CAPACITY", 20_000))
    rounds = 1 if args.quick else 3
    print(f"load: {os.getloadavg()[0]:.1f}; capacity {capacity}, chunks [8, 125], mean episode 400")
    print("\n## Atari-like [4, 84, 84] uint8 stream, 32 x 16 slices\n")
    print(
        table(
            [
                "storage",
                "stored",
                "vs both",
                "per 1M steps",
                "extend (1,000 steps)",
                "sample",
                "vs both",
                "vs raw",
            ],
            bench_stream(capacity, rounds),
        )
    )
    print("\n## Real envs, 4 envs, random actions, 32 x 16 slices\n")
    print(
        table(
            [
                "env",
                "next values in the pool",
                "stored once / both",
                "ratio",
                "sample once / both",
                "ratio",
            ],
            bench_envs(800 if args.quick else 12_000, 3 if args.quick else 7),
        )
    )


if __name__ == "__main__":
    main()
