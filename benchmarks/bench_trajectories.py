"""split_trajectories, cat_trajectories and the assembler: splice vs TorchRL 0.14.1 vs raw limit.

Run: ``python -m benchmarks.bench_trajectories [--quick]``.

* split: collector-like rollouts (``splice.testing.synthetic_rollout``: geometric episode
  lengths, counting payload, the full key set) of ``[8, 1000]`` (mean episode length 20 and 200,
  4-float observations and 84x84 uint8 frames) and flat ``[100000]`` with ~5,000 trajectories.
  Padded and nested output. The raw limit is the bare data movement with the destination
  index precomputed: zero-filled output plus one ``index_copy_`` per key.
* cat: ``cat_trajectories`` on the padded output vs a bare ``index_select`` with the kept
  positions precomputed (TorchRL has no inverse: its idiom ``td[mask]`` is timed instead).
* assembler: ``[8, 50]`` chunks ingested and emitted 16 episodes at a time, vs TorchRL's
  ``_traj_ingest`` / ``_traj_emit`` (what its collector's ``trajs_per_batch`` runs) and vs the
  raw limit (each frame copied into a pool once and scattered out once, indices precomputed).
* memory: peak resident memory one split adds (its output included), splice and TorchRL,
  next to the output's own size.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase

from benchmarks._harness import interleaved, parser, peak_extra_bytes, ratio, table
from splice import TrajectoryAssembler, cat_trajectories, split_trajectories
from splice.contract import flatten_steps
from splice.layout import CUT, MASK, TRAJ_IDS
from splice.testing import synthetic_rollout
from splice.trajectories._index import index_by_id
from splice.trajectories._tensordict import leaves
from splice.trajectories.split import _strided_view

warnings.filterwarnings("ignore")
try:
    from torchrl.collectors.utils import _traj_emit, _traj_ingest
    from torchrl.collectors.utils import split_trajectories as torchrl_split
except ImportError:  # pragma: no cover - the bench extra installs torchrl
    torchrl_split = None


def nbytes(td: TensorDictBase) -> int:
    total = 0
    for _, x in leaves(td):
        total += x.values().nbytes if x.is_nested else x.nbytes
    return total


def raw_padded(batch: TensorDict) -> Callable[[], object]:
    """Bare data movement of a padded split, destination index precomputed."""
    flat = flatten_steps(batch).columns
    index = index_by_id(flat[TRAJ_IDS])
    dest, rows = index.padded_dest(), index.n_rows * index.max_len
    tensors = list(flat.values())

    def run() -> list[torch.Tensor]:
        out = []
        for x in tensors:
            o = x.new_zeros((rows, *x.shape[1:]))
            o.index_copy_(0, dest, x)
            out.append(o)
        return out

    return run


def raw_nested(batch: TensorDict) -> Callable[[], object]:
    """Bare nested views over already-grouped data (sizes precomputed)."""
    flat = flatten_steps(batch).columns
    lengths = index_by_id(flat[TRAJ_IDS]).lengths
    tensors = list(flat.values())
    return lambda: [_strided_view(x, lengths) for x in tensors]


def split_cases(quick: bool) -> list[tuple[str, TensorDict]]:
    """The issue's cases; ``quick`` shrinks them ~20x for the CI smoke run."""
    n, flat_n = (50, 5_000) if quick else (1000, 100_000)
    pix = {"obs_shape": (84, 84), "obs_dtype": torch.uint8}
    return [
        (f"[8,{n}] obs4 mean20", synthetic_rollout(8, n, 20.0, seed=0)),
        (f"[8,{n}] obs4 mean200", synthetic_rollout(8, n, 200.0, seed=0)),
        (f"[8,{n}] pix84 mean20", synthetic_rollout(8, n, 20.0, seed=0, **pix)),
        (f"[8,{n}] pix84 mean200", synthetic_rollout(8, n, 200.0, seed=0, **pix)),
        (f"flat [{flat_n}] obs4 mean20", synthetic_rollout(1, flat_n, 20.0, seed=0).reshape(-1)),
    ]


def bench_split(quick: bool) -> list[list[object]]:
    rows = []
    rounds = 1 if quick else 5
    for name, batch in split_cases(quick):
        n_traj = int(batch[TRAJ_IDS].unique().numel())
        for nested in (False, True):
            contenders: dict[str, Callable[[], object]] = {
                "splice": lambda b=batch, n=nested: split_trajectories(b, as_nested=n),
                "raw": raw_nested(batch) if nested else raw_padded(batch),
            }
            if torchrl_split is not None:
                contenders["torchrl"] = lambda b=batch, n=nested: torchrl_split(b, as_nested=n)
            t = interleaved(contenders, rounds=rounds)
            theirs = t["torchrl"].median if "torchrl" in t else float("nan")
            rows.append(
                [
                    f"{name} ({n_traj} traj)",
                    "nested" if nested else "padded",
                    t["splice"].ms(),
                    t["torchrl"].ms() if "torchrl" in t else "n/a",
                    t["raw"].ms(),
                    ratio(theirs, t["splice"].median),
                    f"{t['raw'].median / t['splice'].median:.2f}x",
                ]
            )
    return rows


def bench_memory(quick: bool) -> list[list[object]]:
    def peak_mib(split: Callable[..., TensorDict], batch: TensorDict, nested: bool) -> float:
        extra, out = peak_extra_bytes(lambda: split(batch, as_nested=nested))
        del out
        return extra / 2**20

    rows = []
    for name, batch in split_cases(quick):
        for nested in (False, True):
            out_mib = nbytes(split_trajectories(batch, as_nested=nested)) / 2**20
            ours = peak_mib(split_trajectories, batch, nested)
            theirs = peak_mib(torchrl_split, batch, nested) if torchrl_split else float("nan")
            rows.append(
                [
                    name,
                    "nested" if nested else "padded",
                    f"{nbytes(batch) / 2**20:.1f}",
                    f"{out_mib:.1f}",
                    f"{ours:.1f}",
                    f"{ours / out_mib:.2f}",
                    f"{theirs:.1f}",
                ]
            )
    return rows


def bench_cat(quick: bool) -> list[list[object]]:
    rows = []
    for name, batch in split_cases(quick)[:2] + split_cases(quick)[4:]:
        padded = split_trajectories(batch)
        keep = padded[MASK].reshape(-1).nonzero().squeeze(1)
        n_pos = padded.numel()
        tensors = [x.reshape(n_pos, *x.shape[2:]) for _, x in leaves(padded.exclude(MASK))]
        mask = padded[MASK]
        t = interleaved(
            {
                "splice": lambda p=padded: cat_trajectories(p),
                "torchrl": lambda p=padded, m=mask: p[m],
                "raw": lambda ts=tensors, k=keep: [x.index_select(0, k) for x in ts],
            },
            rounds=1 if quick else 7,
        )
        rows.append(
            [
                name,
                t["splice"].ms(),
                t["torchrl"].ms(),
                t["raw"].ms(),
                ratio(t["torchrl"].median, t["splice"].median),
                f"{t['raw'].median / t['splice'].median:.2f}x",
            ]
        )
    return rows


def chunks(n_batches: int, mean_len: float) -> list[TensorDict]:
    stream = synthetic_rollout(8, 50 * n_batches, mean_len, seed=1, first_is_init=True)
    out = []
    for lo in range(0, stream.shape[1], 50):
        batch = stream[:, lo : lo + 50].clone()
        batch[CUT] = torch.zeros(batch.shape, dtype=torch.bool)
        batch[CUT][:, -1] = ~batch["next", "done"][:, -1, 0]
        out.append(batch)
    return out


def assembler_row(batches: list[TensorDict], label: str, traj_format: str) -> list[object]:
    """Ingest every chunk, emit 16 episodes whenever 16 are complete; frames/s."""
    n_frames = sum(b.numel() for b in batches)
    per_emit = 16

    def run_splice() -> int:
        asm, emitted = TrajectoryAssembler(), 0
        for b in batches:
            asm.ingest(b)
            while len(asm) >= per_emit:
                emitted += asm.emit(per_emit, traj_format=traj_format).numel()
        return emitted

    def run_torchrl() -> int:
        partial: dict = {}
        complete: list = []
        emitted = 0
        for b in batches:
            _traj_ingest(b, partial, complete)
            while len(complete) >= per_emit:
                emitted += _traj_emit(complete, per_emit, traj_format=traj_format).numel()
        return emitted

    raw_split = raw_padded(torch.cat(batches, 1))
    flat_batches = [list(flatten_steps(b).columns.values()) for b in batches]
    pool = [x.new_empty((n_frames, *x.shape[1:])) for x in flat_batches[0]]

    def run_raw() -> None:
        lo = 0
        for tensors in flat_batches:
            hi = lo + tensors[0].shape[0]
            for p, x in zip(pool, tensors, strict=True):
                p[lo:hi] = x
            lo = hi
        raw_split()

    contenders: dict[str, Callable[[], object]] = {"splice": run_splice, "raw": run_raw}
    if torchrl_split is not None:
        contenders["torchrl"] = run_torchrl
    t = interleaved(contenders, rounds=1 if len(batches) < 10 else 3)

    def fps(name: str) -> str:
        return f"{n_frames / t[name].median:,.0f}" if name in t else "n/a"

    vs_torchrl = ratio(t["torchrl"].median, t["splice"].median) if "torchrl" in t else "n/a"
    raw_share = f"{t['raw'].median / t['splice'].median:.2f}x"
    return [label, fps("splice"), fps("torchrl"), fps("raw"), vs_torchrl, raw_share]


def bench_assembler(quick: bool) -> list[list[object]]:
    n_batches = 5 if quick else 250
    rows = []
    for mean_len in (20.0, 200.0):
        batches = chunks(n_batches, mean_len)
        for fmt in ("padded", "cat"):
            rows.append(assembler_row(batches, f"mean {mean_len:.0f}, {fmt}", fmt))
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    torch.manual_seed(0)
    print("## split_trajectories (median of round-robin runs)\n")
    print(
        table(
            ["case", "output", "splice", "TorchRL", "raw limit", "TorchRL/splice", "raw/splice"],
            bench_split(args.quick),
        )
    )
    print("\n## Peak extra memory of one split (MiB)\n")
    print(
        table(
            [
                "case",
                "output",
                "input",
                "output size",
                "splice peak extra",
                "splice peak/output",
                "TorchRL peak extra",
            ],
            bench_memory(args.quick),
        )
    )
    print("\n## cat_trajectories (padded -> flat)\n")
    print(
        table(
            ["case", "splice", "TorchRL td[mask]", "raw limit", "TorchRL/splice", "raw/splice"],
            bench_cat(args.quick),
        )
    )
    print("\n## TrajectoryAssembler: [8, 50] chunks in, 16 episodes out (frames/s)\n")
    print(
        table(
            ["stream", "splice", "TorchRL", "raw limit", "splice/TorchRL", "raw/splice"],
            bench_assembler(args.quick),
        )
    )


if __name__ == "__main__":
    main()
