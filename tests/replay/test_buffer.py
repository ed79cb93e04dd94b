"""ReplayBuffer: layouts accepted by extend, atomic errors, the small API, priorities."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import cat_trajectories, split_trajectories
from splice.layout import DONE, MASK, TRAJ_IDS, LayoutError
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
from splice.testing import SyntheticStream


@pytest.fixture(params=["memory", "memmap"])
def storage_factory(request, tmp_path):
    def make(size: int):
        if request.param == "memory":
            return LazyTensorStorage(size)
        return LazyMemmapStorage(size, scratch_dir=tmp_path / f"mm{np.random.randint(1e9)}")

    return make


def stored_g(rb: ReplayBuffer) -> list[int]:
    rows = torch.from_numpy(rb.index.live_rows())
    return rb.storage.gather(rows)[("g",)].tolist()


def test_bt_batches_are_stored_env_major(storage_factory) -> None:
    rb = ReplayBuffer(storage=storage_factory(100))
    batch = SyntheticStream(3, 4.0, labels=True).chunk(5)
    rows = rb.extend(batch)
    assert rows.shape == batch.shape and rows.reshape(-1).tolist() == list(range(15))
    assert stored_g(rb) == batch["g"].reshape(-1).tolist()  # env 0's 5 steps, then env 1's ...


def test_padded_batches_drop_padding(storage_factory) -> None:
    rb = ReplayBuffer(storage=storage_factory(100))
    batch = split_trajectories(SyntheticStream(3, 4.0, labels=True).chunk(6))
    assert bool((~batch[MASK]).any())
    rb.extend(batch)
    assert len(rb) == 18
    assert sorted(stored_g(rb)) == list(range(18))
    assert MASK not in rb.storage.columns


def test_negative_ids_are_padding(storage_factory) -> None:
    rb = ReplayBuffer(storage=storage_factory(10))
    rb.extend(TensorDict({TRAJ_IDS: torch.tensor([3, -1, 3, -1]), "g": torch.arange(4)}, [4]))
    assert stored_g(rb) == [0, 2]


def test_bad_batches_raise_and_leave_the_buffer_unchanged(storage_factory) -> None:
    rb = ReplayBuffer(
        storage=storage_factory(30), sampler=SliceSampler(slice_len=2, seed=0), batch_size=4
    )
    good = SyntheticStream(2, 5.0, labels=True).chunk(10).reshape(-1)
    rb.extend(good)
    state = (len(rb), rb.write_count, stored_g(rb), rb.index.row_slot.copy())
    bad_batches = {
        "missing": good.exclude("t"),
        "extra": good.clone().set("new", torch.zeros(20)),
        "dtype": good.clone().set("t", torch.zeros(20, dtype=torch.int32)),
        "shape": good.clone().set("observation", torch.zeros(20, 5)),
        "done shape": good.clone().set(DONE, torch.zeros(20, dtype=torch.bool)),
        "ids dtype": good.clone().set(TRAJ_IDS, torch.zeros(20, dtype=torch.float32)),
        "mask": good.reshape(2, 10).set(MASK, torch.ones(2, 10)),
    }
    for name, bad in bad_batches.items():
        with pytest.raises(LayoutError):
            rb.extend(bad)
        after = (len(rb), rb.write_count, stored_g(rb), rb.index.row_slot)
        assert after[:3] == state[:3] and np.array_equal(after[3], state[3]), name
    with pytest.raises(TypeError):
        rb.extend({"x": 1})  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="add"):
        rb.extend(good[0])


def test_error_messages_name_the_key() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"obs": torch.zeros(2, 3), "r": torch.zeros(2)}, [2]))
    with pytest.raises(LayoutError, match=r"'obs'.*shape \[3\].*\[4\]"):
        rb.extend(TensorDict({"obs": torch.zeros(2, 4), "r": torch.zeros(2)}, [2]))
    with pytest.raises(LayoutError, match=r"missing keys 'r'"):
        rb.extend(TensorDict({"obs": torch.zeros(2, 3)}, [2]))


def test_len_write_count_getitem_empty_iter(storage_factory) -> None:
    rb = ReplayBuffer(storage=storage_factory(8), sampler=RandomSampler(seed=0), batch_size=3)
    rb.extend(TensorDict({"g": torch.arange(5)}, [5]))
    rb.extend(TensorDict({"g": torch.arange(5, 12)}, [7]))
    assert (len(rb), rb.write_count) == (8, 12)
    assert rb[0]["g"].item() == 8 and rb[torch.tensor([4, 5])]["g"].tolist() == [4, 5]
    batches = iter(rb)
    assert next(batches).batch_size == torch.Size([3])  # with replacement: never ends
    rb.empty()
    assert (len(rb), rb.write_count) == (0, 0)
    with pytest.raises(IndexError):
        rb[0]
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    rb.extend(TensorDict({"g": torch.arange(2)}, [2]))
    assert stored_g(rb) == [0, 1]


def test_storage_and_sampler_belong_to_one_buffer() -> None:
    storage, sampler = LazyTensorStorage(4), RandomSampler()
    ReplayBuffer(storage=storage, sampler=sampler)
    with pytest.raises(ValueError, match="storage"):
        ReplayBuffer(storage=storage)
    with pytest.raises(ValueError, match="sampler"):
        ReplayBuffer(storage=LazyTensorStorage(4), sampler=sampler)


def test_sampling_never_touches_the_global_rng() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100), sampler=SliceSampler(slice_len=2), batch_size=4
    )
    rb.extend(SyntheticStream(2, 5.0, labels=True).chunk(20).reshape(-1))
    state = torch.get_rng_state()
    rb.sample()
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomSampler(),
        lambda: SliceSampler(slice_len=2),
        lambda: SliceSampler(slice_len=2, weighting="transition"),
        lambda: PrioritizedSliceSampler(slice_len=2),
        lambda: SamplerWithoutReplacement(),
        lambda: PrioritizedSampler(100, alpha=0.7, beta=0.5),
    ],
)
def test_manual_seed_reproduces_a_run(make) -> None:
    """Issue 10, bug 4: a sampler built without seed/generator drew fresh OS entropy, so
    ``torch.manual_seed(0)`` did not reproduce a run. Its seed now comes from torch's global
    RNG at construction, as in torch.utils.data and TorchRL."""

    def run(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=make(), batch_size=4)
        rb.extend(SyntheticStream(2, 5.0, labels=True).chunk(20).reshape(-1))
        return [rb.sample()["g"].tolist() for _ in range(5)]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_same_seed_same_samples() -> None:
    def run(seed: int) -> torch.Tensor:
        rb = ReplayBuffer(
            storage=LazyTensorStorage(100),
            sampler=SliceSampler(slice_len=3, seed=seed),
            batch_size=9,
        )
        rb.extend(SyntheticStream(2, 5.0, labels=True).chunk(20).reshape(-1))
        return torch.stack([rb.sample()["g"] for _ in range(3)])

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_priorities_update_and_shape_the_draws() -> None:
    sampler = PrioritizedSliceSampler(alpha=1.0, beta=1.0, eta=0.5, slice_len=3, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler, batch_size=3 * 400)
    ids = torch.arange(40) // 10  # four 10-step trajectories
    rb.extend(TensorDict({TRAJ_IDS: ids, "g": torch.arange(40)}, [40]))
    # Uniform at first: new slices all get the same (max) priority.
    s, info = rb.sample(return_info=True, as_sequences=True)
    assert torch.allclose(info["priority_weight"], torch.ones(400))
    # Per-step priorities: step 25 is hot. R2D2: slice priority = .5 max + .5 mean.
    prio = torch.full((40,), 0.1)
    prio[25] = 10.0
    rb.update_priority(torch.arange(40), prio)
    leaves = sampler.priority(np.arange(40))
    for end in range(40):
        if end % 10 < 2:
            assert leaves[end] == 0  # no 3-step slice ends there
            continue
        window = prio[end - 2 : end + 1].double() + sampler.eps
        expected = 0.5 * window.max() + 0.5 * window.mean()
        assert leaves[end] == pytest.approx(float(expected))
    s, info = rb.sample(return_info=True, as_sequences=True)
    hot = (s["g"] == 25).any(1)
    assert hot.float().mean() > 0.8  # three hot slices vs 29 cold ones, ~50x the priority
    w = info["priority_weight"]
    assert bool((w[hot] < w[~hot].min()).all()) and float(w.max()) <= 1.0
    assert torch.equal(s["priority_weight"][:, 0], w)
    # A per-slice priority broadcasts over the slice's steps.
    rb.update_priority(s["index"][:1], torch.tensor([0.0]))
    end = int(s["index"][0, -1])
    assert sampler.priority(np.array([end]))[0] == pytest.approx(sampler.eps)
    with pytest.raises(ValueError, match="priorities"):
        rb.update_priority(torch.arange(2), torch.tensor([1.0, -1.0]))


def test_update_priority_ignores_padding_and_empty_rows() -> None:
    sampler = PrioritizedSliceSampler(alpha=1.0, beta=1.0, slice_len=2, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(6), sampler=sampler, batch_size=4)
    rb.extend(TensorDict({TRAJ_IDS: torch.tensor([0, 0, 0])}, [3]))
    before = sampler.priority(np.arange(6)).copy()
    rb.update_priority(torch.tensor([-1, 4, 5]), 5.0)  # padding, never-written rows
    assert np.array_equal(before, sampler.priority(np.arange(6)))
    with pytest.raises(IndexError):
        rb.update_priority(torch.tensor([6]), 1.0)


# ---------------------------------------------------------------------- issue 10, bugs 1 and 2
def test_extend_returns_the_row_of_every_input_step_in_input_order() -> None:
    """Bug 1: six rows into a 4-row storage returned ``[2, 3, 0, 1]``, and interleaved ids came
    back in storage order, so ``rb[rb.extend(td)]`` did not line up with ``td``."""
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    assert rb.extend(TensorDict({"x": torch.arange(6)}, [6])).tolist() == [0, 1, 2, 3, 0, 1]
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=1))
    td = TensorDict(
        {TRAJ_IDS: torch.tensor([0, 1, 0, 1]), "x": torch.tensor([10, 20, 11, 21])}, [4]
    )
    rows = rb.extend(td)
    assert rb[rows]["x"].tolist() == [10, 20, 11, 21]
    # ... so update_priority(rb.extend(td), td["priority"]) gives each step its own priority.
    sampler = PrioritizedSampler(10, alpha=1.0, beta=1.0, eps=0.0, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    td["priority"] = td["x"].float()
    rows = rb.extend(td)
    rb.update_priority(rows, td["priority"])
    assert sampler.priority(rows).tolist() == [10.0, 20.0, 11.0, 21.0]


def _as_layout(batch: TensorDict, layout: str, ids: bool) -> TensorDict:
    if layout == "flat":
        batch = batch.reshape(-1)
    elif layout == "time-major":  # trajectories interleave step by step
        batch = batch.transpose(0, 1).contiguous().reshape(-1)
    elif layout == "padded":
        batch = split_trajectories(batch)
    elif layout == "cat":
        batch = cat_trajectories(split_trajectories(batch))
    return batch if ids or layout == "padded" else batch.exclude(TRAJ_IDS)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(["bt", "flat", "time-major", "padded", "cat"]),
    ids=st.booleans(),
    n_env=st.integers(1, 4),
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    capacity=st.integers(4, 40),
    kind=st.sampled_from(["random", "slice", "prioritized"]),
    seed=st.integers(0, 5),
)
def test_rb_of_extend_equals_the_input_rows(layout, ids, n_env, chunks, capacity, kind, seed):
    """Bug 1 (property): ``rb[rb.extend(td)]`` equals ``td``'s rows in order, for every
    layout, with and without ids, while the ring wraps; padding positions get -1."""
    sampler = {
        "random": lambda: RandomSampler(seed=seed),
        "slice": lambda: SliceSampler(slice_len=2, seed=seed),
        "prioritized": lambda: PrioritizedSampler(capacity, alpha=0.6, beta=0.4, seed=seed),
    }[kind]()
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)
    stream = SyntheticStream(n_env, 3.0, seed=seed, labels=True)
    for steps in chunks:
        td = _as_layout(stream.chunk(steps), layout, ids)
        real = td.get(MASK, torch.ones(td.shape, dtype=torch.bool))
        if int(real.sum()) > capacity:
            continue  # steps of the same extend overwrite each other: covered above
        rows = rb.extend(td)
        assert rows.shape == td.shape
        assert bool((rows[~real] == -1).all()) and bool((rows[real] >= 0).all())
        back = rb[rows[real]]
        for key in ("g", "ep", "t", "observation", ("next", "done")):
            assert torch.equal(back[key], td[key][real]), key
        if layout != "padded":  # same shape as the input: [B, T] rows give a [B, T] sample
            assert torch.equal(rb[rows]["g"], td["g"])
        assert len(rb) == min(capacity, rb.write_count)


def test_slicing_a_buffer_that_is_not_full() -> None:
    """Bug 2: ``rb[:]``, ``rb[2:]`` and ``rb[-2:]`` raised IndexError before the ring was full;
    as in TorchRL they address the rows written so far."""
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    assert rb[:]["x"].tolist() == [0, 1, 2, 3]
    assert rb[2:]["x"].tolist() == [2, 3]
    assert rb[-2:]["x"].tolist() == [2, 3]
    assert rb[-1]["x"].item() == 3 and rb["x"].tolist() == [0, 1, 2, 3]
    with pytest.raises(IndexError, match="out of range"):
        rb[4]
    rb.extend(TensorDict({"x": torch.arange(4, 13)}, [9]))  # wraps: all 10 rows, storage order
    assert rb[:]["x"].tolist() == [10, 11, 12, 3, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("later", [False, True])
def test_ids_below_minus_one_are_refused_like_everywhere_else(later: bool) -> None:
    """The batch contract refuses an id below -1 (corrupt data, not padding) in every layer:
    in the first batch and in later ones, with nothing stored."""
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    if later:
        rb.extend(TensorDict({TRAJ_IDS: torch.tensor([0, 0]), "x": torch.zeros(2)}, [2]))
    bad = TensorDict({TRAJ_IDS: torch.tensor([1, -7, 1]), "x": torch.ones(3)}, [3])
    with pytest.raises(LayoutError, match="below -1, the first -7 at flat position 1"):
        rb.extend(bad)
    assert len(rb) == (2 if later else 0)


@pytest.mark.parametrize("shape", [[6], [2, 3]])
def test_a_batch_laid_out_as_the_last_one_still_has_its_ids_checked(shape: list[int]) -> None:
    """A batch with the keys, dtypes and shapes of the last checked one skips the layout
    checks (issue 16), not the ids' values: padding is still dropped and an id below -1 still
    refused, with nothing stored."""
    rb = ReplayBuffer(storage=LazyTensorStorage(50), sampler=SliceSampler(slice_len=2, seed=0))

    def batch(ids: list[int], x0: int) -> TensorDict:
        n = len(ids)
        data = {TRAJ_IDS: torch.tensor(ids), "x": torch.arange(x0, x0 + n, dtype=torch.float32)}
        return TensorDict(data, [n]).reshape(shape)

    rb.extend(batch([0, 0, 0, 1, 1, 1], 0))
    rb.extend(batch([1, 1, 2, 2, 2, 2], 6))  # same layout: the known path
    rows = rb.extend(batch([3, -1, 3, 3, -1, 4], 12))
    assert rows.reshape(-1).tolist() == [12, -1, 13, 14, -1, 15]
    assert rb[rows.reshape(-1)[rows.reshape(-1) >= 0]]["x"].tolist() == [12, 14, 15, 17]
    before = (len(rb), rb.write_count, rb[:]["x"].tolist())
    with pytest.raises(LayoutError, match="below -1"):
        rb.extend(batch([5, 5, -7, 5, 5, 5], 18))
    assert (len(rb), rb.write_count, rb[:]["x"].tolist()) == before
    rows = rb.extend(batch([5, 5, 5, 6, 6, 6], 18))  # and the known path goes on
    assert rb[rows.reshape(-1)]["x"].tolist() == list(range(18, 24))
    assert [rb.index.describe(r)[0] for r in rows.reshape(-1).tolist()] == [5, 5, 5, 6, 6, 6]


def _ids_batch(ids: list[int], x0: int, shape: list[int]) -> TensorDict:
    n = len(ids)
    data = {
        TRAJ_IDS: torch.tensor(ids),
        "x": torch.arange(x0, x0 + n, dtype=torch.float32),
        ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
    }
    return TensorDict(data, [n]).reshape(shape)


_CHANGES = {
    "dtype": lambda td: td.set("x", td["x"].double()),
    "per-step shape": lambda td: td.set("x", td["x"].unsqueeze(-1)),
    "missing key": lambda td: td.exclude(("next", "done")),
    "extra key": lambda td: td.set("y", torch.zeros(td.shape)),
    "nested dtype": lambda td: td.set(("next", "done"), td["next", "done"].to(torch.uint8)),
}


@pytest.mark.parametrize("shape", [[6], [2, 3]])
@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_a_batch_unlike_the_last_one_takes_the_full_check(shape: list[int], change: str) -> None:
    """The known path (a batch laid out as the last checked one skips the layout checks) is
    taken only for the same keys, dtypes and shapes: a batch that differs in one key's dtype,
    per-step shape or presence raises the checked path's error (the one a buffer that never
    took the known path raises), with nothing stored; the next good batch goes on."""
    rb = ReplayBuffer(storage=LazyTensorStorage(50), sampler=SliceSampler(slice_len=2, seed=0))
    rb.extend(_ids_batch([0, 0, 0, 1, 1, 1], 0, shape))
    rb.extend(_ids_batch([1, 1, 2, 2, 2, 2], 6, shape))  # the known path from here
    fresh = ReplayBuffer(storage=LazyTensorStorage(50), sampler=SliceSampler(slice_len=2))
    fresh.extend(_ids_batch([0, 0, 0, 1, 1, 1], 0, shape))  # checked path only
    bad = _CHANGES[change](_ids_batch([3, 3, 3, 4, 4, 4], 12, shape))
    with pytest.raises(LayoutError) as expected:
        fresh.extend(bad)
    before = (len(rb), rb.write_count, rb[:]["x"].tolist(), rb.index.state().row_slot.copy())
    with pytest.raises(LayoutError) as got:
        rb.extend(bad)
    assert str(got.value) == str(expected.value)
    after = (len(rb), rb.write_count, rb[:]["x"].tolist(), rb.index.state().row_slot)
    assert after[:3] == before[:3] and np.array_equal(after[3], before[3])
    rows = rb.extend(_ids_batch([3, 3, 3, 4, 4, 4], 12, shape))
    assert rb[rows.reshape(-1)]["x"].tolist() == list(range(12, 18))


@st.composite
def _env_batches(draw: st.DrawFn) -> tuple[int, list[tuple[list[list[int]], str]]]:
    """A capacity and batches of ``B`` envs' streams (ids increasing per env, episodes of
    random lengths), each given as ``[B, T]``, flattened env-major, or flattened time-major
    (trajectories interleave: the buffer regroups them)."""
    capacity = draw(st.integers(3, 40))
    n_envs = draw(st.integers(1, 3))
    next_id = [1000 * e for e in range(n_envs)]
    batches = []
    for _ in range(draw(st.integers(1, 8))):
        T = draw(st.integers(1, 9))
        ids = []
        for e in range(n_envs):
            row = []
            for _ in range(T):
                if draw(st.integers(0, 3)) == 0:
                    next_id[e] += 1  # a new episode of env e
                row.append(next_id[e])
            ids.append(row)
        batches.append((ids, draw(st.sampled_from(["grid", "env-major", "time-major"]))))
    return capacity, batches


@settings(max_examples=120, deadline=None)
@given(case=_env_batches(), contiguous=st.booleans())
def test_rows_returned_by_extend_address_the_written_steps(
    case: tuple[int, list[tuple[list[list[int]], str]]], contiguous: bool
) -> None:
    """On every path of ``extend`` (the first, checked batch; then the known path, numpy
    arrays to the storage; ``[B, T]``, flat env-major, flat time-major batches that the
    buffer regroups; strided inputs; the ring wrapping, batches larger than the storage),
    the row returned for each input step holds that step (its values and its trajectory);
    steps of a batch larger than the storage share rows, one of them stored."""
    capacity, batches = case
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=SliceSampler(slice_len=2))
    x0 = 0
    for ids, layout in batches:
        grid = torch.tensor(ids)  # [B, T]
        B, T = grid.shape
        x = torch.arange(x0, x0 + B * T, dtype=torch.float32).reshape(B, T)
        x0 += B * T
        if not contiguous:  # the same values in transposed (strided) memory
            grid, x = grid.T.contiguous().T, x.T.contiguous().T
        leaves = {TRAJ_IDS: grid, "x": x, "obs": torch.stack([x, -x], -1)}
        if layout == "time-major":
            leaves = {k: v.transpose(0, 1).reshape(B * T, *v.shape[2:]) for k, v in leaves.items()}
        elif layout == "env-major":
            leaves = {k: v.reshape(B * T, *v.shape[2:]) for k, v in leaves.items()}
        td = TensorDict(leaves, grid.shape if layout == "grid" else [B * T])
        rows = rb.extend(td)
        assert rows.shape == td.shape
        flat_rows = rows.reshape(-1).tolist()
        flat_x = td["x"].reshape(-1).tolist()
        flat_obs = td["obs"].reshape(-1, 2).tolist()
        flat_ids = td[TRAJ_IDS].reshape(-1).tolist()
        sharing: dict[int, list[int]] = {}  # row -> the input steps returned with it
        for i, row in enumerate(flat_rows):
            sharing.setdefault(row, []).append(i)
        assert set(sharing) <= set(range(capacity))
        for row, steps in sharing.items():
            # (a batch larger than the storage: steps that share a row were written there
            # one after the other, in the buffer's write order; one of them is stored)
            x_stored = rb[row]["x"].item()
            i = next(i for i in steps if flat_x[i] == x_stored)
            assert len(steps) == 1 or len(flat_rows) > capacity
            assert rb[row]["obs"].tolist() == flat_obs[i]
            assert rb.index.describe(row)[0] == flat_ids[i]


# ---------------------------------------------------------------------- issue 11
def test_len_and_write_count_are_consistent_under_a_concurrent_writer() -> None:
    """``len()`` and ``write_count`` read under the lock: a writer extending a full buffer is
    seen before or after each extend, never half-way (``len`` read 500 instead of 1000)."""
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    chunk = TensorDict({"x": torch.arange(100)}, [100])
    for _ in range(10):
        rb.extend(chunk)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            rb.extend(chunk)

    thread = threading.Thread(target=writer)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    thread.start()
    try:
        first = rb.write_count
        lengths = np.array([len(rb) for _ in range(200_000)])
        written = rb.write_count - first
        counts = np.array([rb.write_count for _ in range(20_000)])
    finally:
        stop.set()
        thread.join(timeout=30)
        sys.setswitchinterval(switch)
    assert written > 0  # the writer was writing while len() was read
    assert (lengths == 1000).all(), np.unique(lengths, return_counts=True)
    assert (counts % 100 == 0).all() and (np.diff(counts) >= 0).all()


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda v: LazyTensorStorage(v), "max_size"),
        (lambda v: LazyMemmapStorage(v), "max_size"),
        (lambda v: LazyTensorStorage(10, ndim=v), "ndim"),
        (lambda v: ReplayBuffer(batch_size=v), "batch_size"),
        (lambda v: SliceSampler(slice_len=v), "slice_len"),
        (lambda v: SliceSampler(num_slices=v), "num_slices"),
        (lambda v: SliceSampler(slice_len=2, burn_in=v), "burn_in"),
        (lambda v: PrioritizedSampler(v, alpha=1.0, beta=1.0), "max_capacity"),
        (lambda v: PrioritizedSliceSampler(v, slice_len=2), "max_capacity"),
    ],
)
@pytest.mark.parametrize("value", [True, 4.0, "4"])
def test_count_arguments_refuse_bools_and_non_integers(build, name: str, value) -> None:
    with pytest.raises(TypeError, match=name):
        build(value)


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="storage must be a splice Storage, got str"):
        ReplayBuffer(storage="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sampler must be a splice Sampler"):
        ReplayBuffer(sampler="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got NoneType"):
        ReplayBuffer().add(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="eta must be a number"):
        PrioritizedSliceSampler(slice_len=2, eta=True)


SAMPLERS_FOR_SIZES = {
    "random": lambda: RandomSampler(seed=0),
    "without": lambda: SamplerWithoutReplacement(seed=0),
    "prioritized": lambda: PrioritizedSampler(200, alpha=0.7, beta=0.5, seed=0),
    "slice": lambda: SliceSampler(slice_len=2, seed=0),
    "slice-transition": lambda: SliceSampler(slice_len=2, weighting="transition", seed=0),
    "slice-without": lambda: SliceSamplerWithoutReplacement(slice_len=2, seed=0),
    "slice-without-transition": lambda: SliceSamplerWithoutReplacement(
        slice_len=2, weighting="transition", seed=0
    ),
    "prioritized-slice": lambda: PrioritizedSliceSampler(slice_len=2, seed=0),
}


@pytest.mark.parametrize("kind", list(SAMPLERS_FOR_SIZES))
def test_bad_batch_sizes_are_clear_errors_that_change_nothing(kind: str, buffer_state) -> None:
    """``sample(0)``, ``sample(-4)``: ``ValueError``; ``sample(True)``, ``sample(2.0)``:
    ``TypeError``; for every sampler, with no reshuffled epoch or advanced generator."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(200), sampler=SAMPLERS_FOR_SIZES[kind](), batch_size=4
    )
    rb.extend(SyntheticStream(2, 5.0, labels=True).chunk(20))
    rb.sample()  # an epoch under way
    before = buffer_state(rb)
    for size in (0, -4):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            rb.sample(size)
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            rb.sample(batch_size=size)
    for size in (True, 2.0, "4"):
        with pytest.raises(TypeError, match="batch_size must be an int"):
            rb.sample(size)  # type: ignore[arg-type]
    assert buffer_state(rb) == before
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ReplayBuffer(sampler=SAMPLERS_FOR_SIZES[kind](), batch_size=0)


PRIORITIZED = {
    "steps": lambda: PrioritizedSampler(100, alpha=1.0, beta=0.5, seed=0),
    "slices": lambda: PrioritizedSliceSampler(alpha=1.0, beta=0.5, slice_len=4, seed=0),
}


@pytest.mark.parametrize("kind", list(PRIORITIZED))
@pytest.mark.parametrize("huge", [1e308, sys.float_info.max, 1e306])
def test_huge_priorities_are_refused_and_sampling_goes_on(
    kind: str, huge: float, buffer_state
) -> None:
    """A priority whose weight could overflow the sum of the buffer's weights (1e308 used to
    break every later draw) is refused with nothing updated, even the valid priorities of the
    same call; the limit itself is accepted and sampling stays correct."""
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=PRIORITIZED[kind](), batch_size=8)
    rb.extend(SyntheticStream(2, 8.0, labels=True).chunk(40))
    before = buffer_state(rb)
    rows = torch.arange(10)
    with pytest.raises(ValueError, match=r"sampling weight .* above"):
        rb.update_priority(rows, torch.tensor([1.0] * 9 + [huge], dtype=torch.float64))
    assert buffer_state(rb) == before
    # The largest accepted priority: every row may hold it and the sums stay finite.
    limit = sys.float_info.max / (2 * 100)
    rb.update_priority(torch.arange(100), torch.full((100,), limit * 0.999, dtype=torch.float64))
    for _ in range(20):
        sample, info = rb.sample(return_info=True)
        assert sample.batch_size == torch.Size([8]) and bool((sample["index"] >= 0).all())
        assert np.isfinite(np.asarray(info["priority_weight"])).all()


def test_a_storage_that_overrides_a_durability_hook_gets_every_call() -> None:
    """An extend builds the commit state and the rows for ``stage``/``begin_write``/
    ``commit`` only for a storage that overrides one of them (issue 16: the in-memory
    storage's are no-ops); a subclass, or a hook set on the instance, gets every call with
    the state after the write."""

    class Recording(LazyTensorStorage):
        calls: list[tuple[str, object]]

        def begin_write(self, rows: np.ndarray) -> None:
            self.calls.append(("begin_write", rows.tolist()))

    storage = Recording(4)
    storage.calls = []
    staged: list[object] = []
    storage.stage = staged.append  # type: ignore[method-assign]
    rb = ReplayBuffer(storage=storage)
    rb.extend(_ids_batch([0, 0, 1], 0, [3]))
    rb.extend(_ids_batch([1, 2, 2], 3, [3]))
    assert storage.calls == [("begin_write", [0, 1, 2]), ("begin_write", [3, 0, 1])]
    assert [(s.write_count, s.lo, s.kind) for s in staged] == [  # type: ignore[attr-defined]
        (3, 0, "tensordict"),
        (6, 2, "tensordict"),
    ]
