"""Next observations stored once (``dedup_next``): what a buffer gives back is bit-identical to
a buffer storing both ``obs`` and ``("next", obs)``, across episode ends, collector cuts,
wrap-around, ``[B, T]`` and flat input, every sampler, in-place writes and persistence; and
only the values that are not the next row's ``obs`` take memory."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase

from splice.layout import LayoutError, all_leaves
from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.testing import SyntheticStream

OBS = ("pixels",)
NEXT_OBS = ("next", "pixels")
SHAPE = (4, 4, 4)  # 64 bytes of uint8: stored once by default (DEDUP_MIN_BYTES)

SAMPLERS = {
    "random": lambda: RandomSampler(seed=5),
    "without": lambda: SamplerWithoutReplacement(seed=5),
    "slice": lambda: SliceSampler(slice_len=3, strict_length=False, seed=5),
    "slice-burn-in": lambda: SliceSampler(
        slice_len=4, burn_in=2, strict_length=False, pad_output=True, seed=5
    ),
    "slice-without": lambda: SliceSamplerWithoutReplacement(
        slice_len=3, strict_length=False, seed=5
    ),
    "slice-prioritized": lambda: PrioritizedSliceSampler(
        alpha=0.7, beta=0.5, slice_len=3, strict_length=False, seed=5
    ),
}


def pixels(ep: torch.Tensor, t: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Observation ``t`` of episode ``ep`` (``final``: the episode's final observation, which
    is never the next episode's first one unless ``ep``/``t`` say so), ``[*, 4, 4, 4]``."""
    out = torch.zeros(*ep.shape, *SHAPE, dtype=torch.uint8)
    flat = out.view(*ep.shape, -1)
    flat[..., 0] = (ep % 256).to(torch.uint8)
    flat[..., 1] = (ep // 256 % 256).to(torch.uint8)
    flat[..., 2] = (t % 256).to(torch.uint8)
    flat[..., 3] = final.to(torch.uint8)
    return out


class Episodes:
    """A :class:`SyntheticStream` whose pixels are consistent: ``("next", pixels)`` of a step
    is ``pixels`` of the step after it in its episode, and an episode's last step has a final
    observation of its own (or, with ``final_is_reset``, the bytes of the next episode's first
    observation: equal bytes across a boundary, which the byte rule shares)."""

    def __init__(
        self, n_env: int, mean_len: float, seed: int, final_is_reset: bool, first_id: int = 0
    ) -> None:
        self.stream = SyntheticStream(n_env, mean_len, seed=seed, labels=True, first_id=first_id)
        self.final_is_reset = final_is_reset

    def chunk(self, steps: int) -> TensorDictBase:
        batch = self.stream.chunk(steps)
        ep, t, done = batch["ep"], batch["t"], batch["next", "done"][..., 0]
        batch.set(OBS, pixels(ep, t, torch.zeros_like(done)))
        if self.final_is_reset:
            final = pixels(torch.zeros_like(ep), torch.zeros_like(t), torch.zeros_like(done))
        else:
            final = pixels(ep, t + 1, torch.ones_like(done))
        after = pixels(ep, t + 1, torch.zeros_like(done))
        batch.set(NEXT_OBS, torch.where(done[..., None, None, None], final, after))
        del batch["observation"], batch["next", "observation"]
        return batch


def assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    keys_a = {key for key, _ in all_leaves(a)}
    assert keys_a == {key for key, _ in all_leaves(b)}
    for key in keys_a:
        assert torch.equal(a.get(key), b.get(key)), key


def pair(storage: Any, reference: Any, sampler: str) -> tuple[ReplayBuffer, ReplayBuffer]:
    """A buffer storing next pixels once and one storing both, with equal samplers."""
    return (
        ReplayBuffer(storage=storage, sampler=SAMPLERS[sampler](), batch_size=12),
        ReplayBuffer(storage=reference, sampler=SAMPLERS[sampler](), batch_size=12),
    )


PROPERTY = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@given(
    n_env=st.integers(1, 3),
    mean_len=st.sampled_from([1.0, 3.0, 8.0]),
    capacity=st.integers(4, 50),
    steps=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    flat=st.booleans(),
    final_is_reset=st.booleans(),
    sampler=st.sampled_from(sorted(SAMPLERS)),
    seed=st.integers(0, 2**16),
)
@PROPERTY
def test_reads_are_bit_identical_to_storing_both(
    n_env: int,
    mean_len: float,
    capacity: int,
    steps: list[int],
    flat: bool,
    final_is_reset: bool,
    sampler: str,
    seed: int,
) -> None:
    rb, ref = pair(
        LazyTensorStorage(capacity), LazyTensorStorage(capacity, dedup_next=False), sampler
    )
    episodes = Episodes(n_env, mean_len, seed, final_is_reset)
    for n in steps:
        batch = episodes.chunk(n)
        if flat:
            batch = batch.reshape(-1)
        rows = rb.extend(batch)
        assert torch.equal(rows, ref.extend(batch))
        if batch.numel() <= capacity:  # what was written reads back at the returned indices
            assert torch.equal(rb[rows]["next", "pixels"], batch["next", "pixels"])
            assert torch.equal(rb[rows]["pixels"], batch["pixels"])
        live = torch.from_numpy(rb.index.live_rows())
        assert_same(rb[live], ref[live])
        if len(rb) >= 3:
            assert_same(rb.sample(), ref.sample())
    assert ref.storage.shared == {} and NEXT_OBS in rb.storage.shared
    shared = rb.storage.shared[NEXT_OBS]
    assert shared.pool.shape[0] <= capacity  # never more slots than rows
    # memory: the pool holds the values that are not the next row's pixels, plus at most
    # one per write (a write's last step, whose next row is not written yet)
    live = torch.from_numpy(rb.index.live_rows())
    nxt, after = ref.storage.columns[NEXT_OBS], ref.storage.columns[OBS]
    own = sum(not torch.equal(nxt[r], after[(r + 1) % capacity]) for r in live.tolist())
    assert own <= shared.pool_rows_used <= own + len(steps)


@given(
    capacity=st.integers(6, 40),
    steps=st.lists(st.integers(1, 10), min_size=2, max_size=6),
    where=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
    key=st.sampled_from([OBS, NEXT_OBS]),
    seed=st.integers(0, 2**16),
)
@PROPERTY
def test_in_place_writes_keep_the_neighbours(
    capacity: int, steps: list[int], where: list[int], key: tuple[str, ...], seed: int
) -> None:
    """Overwriting ``pixels`` of a row changes the next value of the row before it only in a
    buffer storing both: the stored-once buffer keeps the old value for it."""
    rb, ref = pair(
        LazyTensorStorage(capacity), LazyTensorStorage(capacity, dedup_next=False), "random"
    )
    episodes = Episodes(2, 3.0, seed, final_is_reset=False)
    for n in steps:
        batch = episodes.chunk(n)
        rb.extend(batch)
        ref.extend(batch)
    live = rb.index.live_rows()
    rows = torch.from_numpy(live[np.array(where) % live.size])
    new = ref[rows]
    new.set(key, torch.randint(0, 255, (rows.numel(), *SHAPE), dtype=torch.uint8))
    rb[rows] = new
    ref[rows] = new
    assert_same(rb[torch.from_numpy(live)], ref[torch.from_numpy(live)])
    batch = episodes.chunk(3)  # and writes after it (wrapping over old rows) still line up
    rb.extend(batch)
    ref.extend(batch)
    live = torch.from_numpy(rb.index.live_rows())
    assert_same(rb[live], ref[live])


def expected_next(stored: TensorDictBase) -> torch.Tensor:
    """``("next", pixels)`` as :class:`Episodes` (``final_is_reset=False``) made it, from the
    stored labels."""
    ep, t, done = stored["ep"], stored["t"], stored["next", "done"][..., 0]
    final = pixels(ep, t + 1, torch.ones_like(done))
    return torch.where(
        done[..., None, None, None], final, pixels(ep, t + 1, torch.zeros_like(done))
    )


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_several_writers(storage: str, tmp_path: Path) -> None:
    """Threads extending one buffer side by side (as a collector's workers feed one buffer):
    whatever the interleaving, every row reads back the next value its writer gave it."""
    capacity = 300
    rb = ReplayBuffer(
        storage=LazyTensorStorage(capacity)
        if storage == "memory"
        else LazyMemmapStorage(capacity, scratch_dir=tmp_path / "mm"),
        sampler=SliceSampler(slice_len=3, strict_length=False, seed=0),
        batch_size=30,
    )
    errors: list[BaseException] = []
    # The writers run their rounds together (each round's extends and samples race), so the
    # newest rows hold all three writers' (free-running, one writer could finish its 40
    # extends before another started).
    rounds = threading.Barrier(3)

    def write(k: int) -> None:
        try:
            episodes = Episodes(2, 5.0, seed=k, final_is_reset=False, first_id=k * 10**6)
            for _ in range(40):
                rounds.wait(timeout=60)
                rb.extend(episodes.chunk(7))  # 560 steps per writer: wrapped many times
                rb.sample()
        except BaseException as e:  # reported below, in the test's thread
            rounds.abort()
            errors.append(e)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    live = torch.from_numpy(rb.index.live_rows())
    stored = rb[live]
    assert len(set((stored["ep"] // 10**6).tolist())) == 3  # the writers' rows interleave
    assert torch.equal(stored["next", "pixels"], expected_next(stored))
    assert torch.equal(
        stored["pixels"], pixels(stored["ep"], stored["t"], torch.zeros_like(stored["t"]))
    )
    sample = rb.sample()  # (its done flags mark slice ends: read the stored ones)
    assert torch.equal(sample["next", "pixels"], expected_next(rb[sample["index"]]))


def fill(rb: ReplayBuffer, seed: int, chunks: int = 7) -> None:
    episodes = Episodes(3, 4.0, seed, final_is_reset=False)
    for _ in range(chunks):
        rb.extend(episodes.chunk(9))  # 189 steps into 60 rows: wrapped


@pytest.mark.parametrize("sampler", ["random", "slice-prioritized"])
def test_persistence_round_trips(sampler: str, tmp_path: Path) -> None:
    """``state_dict``, ``dumps``/``loads`` and memory-mapped reopening give what a buffer
    storing both gives (a saved buffer holds the whole next column and is stored once again
    by whoever loads it, with or without ``dedup_next``)."""
    rb, ref = pair(LazyTensorStorage(60), LazyTensorStorage(60, dedup_next=False), sampler)
    directory = tmp_path / "mm"
    mm = ReplayBuffer(
        storage=LazyMemmapStorage(60, scratch_dir=directory),
        sampler=SAMPLERS[sampler](),
        batch_size=12,
    )
    for buffer in (rb, ref, mm):
        fill(buffer, seed=1)
    live = torch.from_numpy(rb.index.live_rows())
    want = ref[live]
    assert_same(mm[live], want)
    rb.dumps(tmp_path / "saved")
    loaded = []
    for dedup in (True, False):
        from_dict, from_dir = pair(
            LazyTensorStorage(60, dedup_next=dedup),
            LazyTensorStorage(60, dedup_next=dedup),
            sampler,
        )
        from_dict.load_state_dict(rb.state_dict())
        from_dir.loads(tmp_path / "saved")
        loaded += [from_dict, from_dir]
    mm.storage.flush()
    del mm
    reopened = ReplayBuffer(
        storage=LazyMemmapStorage(60, scratch_dir=directory),
        sampler=SAMPLERS[sampler](),
        batch_size=12,
    )
    assert list(reopened.storage.shared) == [NEXT_OBS]  # the directory's layout
    for other in [*loaded, reopened]:
        assert_same(other[live], want)
    first = ref.sample()
    for other in loaded:
        assert_same(other.sample(), first)
    fill(reopened, seed=2, chunks=3)  # a reopened storage keeps storing once, exactly
    fill(ref, seed=2, chunks=3)
    live = torch.from_numpy(ref.index.live_rows())
    assert_same(reopened[live], ref[live])
    reopened.storage.cleanup()


def test_memory_is_one_column_plus_the_episode_ends() -> None:
    """Atari-sized pixels, episodes of mean length 50 written in chunks of 8 x 25 steps: the
    storage holds about half of storing both (the pool holds episode ends and chunk ends)."""
    capacity = 2_000
    shape = (4, 84, 84)
    stream = SyntheticStream(8, 50.0, seed=0, labels=True)

    def chunk() -> TensorDictBase:
        batch = stream.chunk(25)
        ep, t = batch["ep"], batch["t"]
        frame = torch.zeros(*ep.shape, *shape, dtype=torch.uint8)
        frame.view(*ep.shape, -1)[..., :2] = torch.stack([ep % 256, t % 256], -1).to(torch.uint8)
        after = frame.clone()
        after.view(*ep.shape, -1)[..., 1] += 1
        return TensorDict(
            {"pixels": frame, ("next", "pixels"): after, "collector": batch["collector"]},
            batch_size=batch.batch_size,
        )

    rb = ReplayBuffer(storage=LazyTensorStorage(capacity))
    both = ReplayBuffer(storage=LazyTensorStorage(capacity, dedup_next=False))
    for _ in range(15):  # 3,000 steps: wrapped
        batch = chunk()
        rb.extend(batch)
        both.extend(batch)
    live = torch.from_numpy(rb.index.live_rows())
    assert torch.equal(rb[live]["next", "pixels"], both[live]["next", "pixels"])
    ratio = rb.storage.nbytes / both.storage.nbytes
    assert ratio <= 0.55, ratio


def test_options_and_errors(tmp_path: Path) -> None:
    batch = Episodes(2, 3.0, 0, final_is_reset=False).chunk(5)
    batch["small"] = torch.zeros(2, 5, 3)
    batch["next", "small"] = torch.zeros(2, 5, 3)
    rb = ReplayBuffer(storage=LazyTensorStorage(20))
    rb.extend(batch)
    assert list(rb.storage.shared) == [NEXT_OBS]  # 12 bytes per step: stored whole
    rb = ReplayBuffer(storage=LazyTensorStorage(20, dedup_next=["small", ("pixels",)]))
    rb.extend(batch)
    assert sorted(rb.storage.shared) == [NEXT_OBS, ("next", "small")]
    with pytest.raises(TypeError, match="dedup_next must be a bool or a list of keys"):
        LazyTensorStorage(20, dedup_next="pixels")
    with pytest.raises(ValueError, match="starts with 'next'"):
        LazyTensorStorage(20, dedup_next=[("next", "pixels")])
    rb = ReplayBuffer(storage=LazyTensorStorage(20, dedup_next=["missing"]))
    with pytest.raises(LayoutError, match="dedup_next names 'missing'"):
        rb.extend(batch)
    assert len(rb) == 0 and rb.storage.schema is None  # refused before anything was written
    directory = tmp_path / "mm"
    mm = ReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=directory))
    mm.extend(batch)
    del mm
    with pytest.raises(ValueError, match="leave dedup_next out to reopen"):
        LazyMemmapStorage(20, scratch_dir=directory, dedup_next=False)
