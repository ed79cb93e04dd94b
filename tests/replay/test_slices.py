"""Slice samplers: boundary correctness (property tests), weighting, burn-in, output format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import cat_trajectories, split_trajectories
from splice.layout import CUT, DONE, IS_INIT, MASK, TERMINATED, TRAJ_IDS, TRUNCATED
from splice.replay import (
    BURN_IN,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.testing import SyntheticStream, assert_slices_contiguous

LAYOUTS = ("bt", "flat", "padded")


def fill(
    rb: ReplayBuffer,
    stream: SyntheticStream,
    chunk: int,
    n_chunks: int,
    layout: str,
    ids: bool = True,
) -> list[int]:
    """Extend ``rb`` with ``n_chunks`` chunks; return the global steps in write order.

    ``ids=False`` removes the trajectory ids: boundaries then come from the done flags.
    """
    written: list[int] = []
    for _ in range(n_chunks):
        batch = stream.chunk(chunk)
        if layout == "flat":
            batch = batch.reshape(-1)
        elif layout == "padded":
            batch = split_trajectories(batch)
        if not ids:
            batch = batch.exclude(TRAJ_IDS)
        g = batch["g"][batch[MASK]] if layout == "padded" else batch["g"].reshape(-1)
        written.extend(g.tolist())
        rb.extend(batch)
    return written


def live_steps(written: list[int], capacity: int) -> set[int]:
    return set(written[-capacity:])


samplers = st.sampled_from(["trajectory", "transition", "prioritized", "without"])


@settings(max_examples=100, deadline=None)
@given(
    n_env=st.integers(1, 4),
    chunk=st.integers(1, 12),
    n_chunks=st.integers(1, 8),
    mean_len=st.sampled_from([1.5, 4.0, 15.0]),
    capacity=st.integers(4, 80),
    slice_len=st.integers(1, 9),
    burn_in=st.integers(0, 4),
    strict=st.booleans(),
    kind=samplers,
    layout=st.sampled_from(LAYOUTS),
    ids=st.booleans(),
    seed=st.integers(0, 3),
)
def test_every_slice_is_a_contiguous_live_piece_of_one_trajectory(
    n_env, chunk, n_chunks, mean_len, capacity, slice_len, burn_in, strict, kind, layout, ids, seed
) -> None:
    kwargs = dict(slice_len=slice_len, burn_in=burn_in, strict_length=strict, as_sequences=True)
    if kind == "prioritized":
        sampler = PrioritizedSliceSampler(alpha=0.7, beta=0.5, seed=seed, **kwargs)
    elif kind == "without":
        sampler = SliceSamplerWithoutReplacement(seed=seed, **kwargs)
    else:
        sampler = SliceSampler(weighting=kind, seed=seed, **kwargs)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=slice_len * 3
    )
    stream = SyntheticStream(n_env, mean_len, seed=seed, labels=True)
    if not ids and layout == "padded":
        ids = True  # a padded row is one fragment: without ids, its continuation is unknown
    written = fill(rb, stream, chunk, n_chunks, layout, ids)
    live = live_steps(written, capacity)
    assert len(rb) == len(live)
    try:
        sample, info = rb.sample(return_info=True)
    except RuntimeError as err:
        assert strict and "no trajectory" in str(err)
        return
    W = burn_in + slice_len
    assert sample.shape[1] == W
    valid = sample.get(MASK, torch.ones(sample.shape, dtype=torch.bool))
    assert_slices_contiguous(sample, live=live)
    burn = sample[BURN_IN] if burn_in else torch.zeros_like(valid)
    train = valid & ~burn
    for i in range(sample.shape[0]):
        n_real, n_burn = int(valid[i].sum()), int(burn[i].sum())
        assert n_real == int(info["length"][i]) and n_burn == int(info["burn_in"][i])
        assert not bool(burn[i, n_burn:].any()), "burn-in after training steps"
        if strict:
            assert int(train[i].sum()) == slice_len
        assert n_burn <= burn_in
        # Burn-in is only short when the trajectory's first stored step is reached (without
        # ids, a flat batch's trajectories end at its edges: not checked then).
        if n_burn < burn_in and (ids or layout == "bt"):
            first_t = min(
                int(t)
                for t, e in zip(sample["t"][i].tolist(), sample["ep"][i].tolist(), strict=True)
                if e == int(sample["ep"][i, 0])
            )
            rows = torch.from_numpy(rb.index.live_rows())
            stored = rb.storage.gather(rows)
            stored_ts = [
                int(tt)
                for tt, ee in zip(stored[("t",)].tolist(), stored[("ep",)].tolist(), strict=True)
                if ee == int(sample["ep"][i, 0])
            ]
            assert first_t == min(stored_ts)
        end = int(valid[i].sum()) - 1
        assert bool(sample[TRUNCATED][i, end]) and bool(sample[DONE][i, end])
        assert not bool(sample[TRUNCATED][i, :end].any())
        assert not bool(sample[CUT][i, :end].any())
        assert bool(sample[IS_INIT][i, 0])


def test_chunks_of_50_allow_slices_of_80() -> None:
    """A 50-step chunk per extend (8 envs) must still give contiguous 80-step slices."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(20_000),
        sampler=SliceSampler(slice_len=80, as_sequences=True, seed=0),
        batch_size=80 * 16,
    )
    stream = SyntheticStream(8, mean_len=400.0, seed=1, labels=True)
    for _ in range(20):
        rb.extend(stream.chunk(50))
    sample = rb.sample()
    assert_slices_contiguous(sample)
    # Many slices span chunks: their global steps jump by 8 * 50 - 49 somewhere.
    jumps = (sample["g"][:, 1:] - sample["g"][:, :-1] != 1).any(1)
    assert bool(jumps.all())  # an 80-step slice always crosses a 50-step chunk edge


def test_interleaved_writers_need_no_flag() -> None:
    """Two collectors extending one buffer alternately: slices follow each trajectory."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(5000),
        sampler=SliceSampler(slice_len=12, as_sequences=True, seed=0),
        batch_size=12 * 32,
    )
    a = SyntheticStream(2, 30.0, seed=2, labels=True)
    # The second writer's ids are unique, as splice collectors make them.
    b = SyntheticStream(3, 30.0, seed=3, labels=True, first_id=10**6, first_step=10**7)
    for _ in range(15):
        rb.extend(a.chunk(7))
        rb.extend(b.chunk(5).reshape(-1))
    for _ in range(5):
        s = rb.sample()
        assert_slices_contiguous(s)


def test_flags_only_data_without_ids() -> None:
    """No trajectory ids: boundaries come from done flags; env rows continue across chunks;
    a collector cut marked done by set_truncated is not a boundary."""
    stream = SyntheticStream(3, 8.0, seed=4, set_truncated=True, labels=True)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(60),
        sampler=SliceSampler(slice_len=6, as_sequences=True, end_key=DONE, seed=0),
        batch_size=6 * 20,
    )
    written: list[int] = []
    for _ in range(10):
        batch = stream.chunk(5).exclude(TRAJ_IDS)
        written.extend(batch["g"].reshape(-1).tolist())
        rb.extend(batch)
    assert rb.index.num_trajectories <= len({*written[-60:]})
    s = rb.sample()
    assert_slices_contiguous(s, live=set(written[-60:]))
    # set_truncated marks inside a slice are cleared: done only at the slice end.
    assert not bool(s[DONE][:, :-1].any())


def test_cat_layout_and_add() -> None:

    stream = SyntheticStream(2, 5.0, seed=5, labels=True)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100), sampler=SliceSampler(slice_len=3, seed=0), batch_size=6
    )
    batch = cat_trajectories(split_trajectories(stream.chunk(20)))
    rb.extend(batch)
    step = stream.chunk(1)[0, 0]
    row = rb.add(step)
    assert len(rb) == 41 and row == 40
    s = rb.sample(as_sequences=True)
    assert_slices_contiguous(s)


@settings(max_examples=60, deadline=None)
@given(
    n_env=st.integers(1, 4),
    chunk=st.integers(1, 12),
    n_chunks=st.integers(1, 10),
    mean_len=st.sampled_from([1.5, 4.0, 15.0]),
    capacity=st.integers(4, 60),
    slice_len=st.integers(1, 9),
    strict=st.booleans(),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 3),
)
def test_trajectory_weighting_draws_from_exactly_the_long_enough_live_trajectories(
    n_env, chunk, n_chunks, mean_len, capacity, slice_len, strict, layout, seed
) -> None:
    """After every write (overwriting included: trajectories cut, freed, their slots reused),
    the trajectories ``weighting="trajectory"`` draws from are the live ones with at least
    ``slice_len`` stored steps (any, without ``strict_length``), counted from the stored rows."""
    sampler = SliceSampler(slice_len=slice_len, strict_length=strict, seed=seed)
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=slice_len)
    stream = SyntheticStream(n_env, mean_len, seed=seed, labels=True)
    # (a default batch size: the sampler keeps its structures from the start, on every write)
    for _ in range(n_chunks):
        fill(rb, stream, chunk, 1, layout)
        index = rb.index
        steps: dict[int, int] = {}
        for row in index.live_rows().tolist():
            key = index.describe(row)[0]
            steps[key] = steps.get(key, 0) + 1
        expected = {k for k, n in steps.items() if n >= (slice_len if strict else 1)}
        drawn = {int(index.traj.a["key"][slot]) for slot in sampler._trajs.members().tolist()}
        assert drawn == expected


def _trajectory_buffer(weighting: str, seed: int = 0) -> ReplayBuffer:
    ids = torch.tensor([0] * 4 + [1] * 20 + [2] * 76)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(200),
        sampler=SliceSampler(slice_len=4, weighting=weighting, seed=seed),
        batch_size=4 * 2000,
    )
    rb.extend(TensorDict({TRAJ_IDS: ids, "pos": torch.arange(100)}, batch_size=[100]))
    return rb


def _chi2_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    return stat < 20.0  # far above the 99.9% quantile for <= 3 degrees of freedom... margin


def test_transition_weighting_matches_transition_counts() -> None:
    rb = _trajectory_buffer("transition")
    s = rb.sample(as_sequences=True)
    ends = s["pos"][:, -1].contiguous()
    # Eligible ends: 1 in the 4-step trajectory, 17 in the 20-step one, 73 in the 76-step one.
    traj = torch.bucketize(ends, torch.tensor([4, 24]), right=True)
    counts = np.bincount(traj.numpy(), minlength=3)
    assert _chi2_ok(counts, np.array([1, 17, 73]) / 91)
    # ... and every eligible end equally likely within the long trajectory.
    long_ends = ends[traj == 2].numpy()
    per_end = np.bincount(long_ends - 27, minlength=73)
    assert per_end.min() > 0


def test_trajectory_weighting_is_torchrl_uniform_over_trajectories() -> None:
    rb = _trajectory_buffer("trajectory")
    s = rb.sample(as_sequences=True)
    traj = torch.bucketize(s["pos"][:, -1].contiguous(), torch.tensor([4, 24]), right=True)
    counts = np.bincount(traj.numpy(), minlength=3)
    assert _chi2_ok(counts, np.array([1, 1, 1]) / 3)


def test_without_replacement_covers_every_item_once_per_epoch() -> None:
    stream = SyntheticStream(3, 6.0, seed=6, labels=True)
    for weighting in ("trajectory", "transition"):
        sampler = SliceSamplerWithoutReplacement(slice_len=3, weighting=weighting, seed=1)
        rb = ReplayBuffer(storage=LazyTensorStorage(500), sampler=sampler, batch_size=3 * 7)
        rb.extend(stream.chunk(40))
        if weighting == "trajectory":
            expected = sorted(int(s) for s in sampler._trajs.members())
            items = [
                int(slot)
                for batch in rb
                for slot in rb.index.row_slot[batch["index"].view(-1, 3)[:, -1].numpy()]
            ]
        else:
            expected = sorted(int(r) for r in sampler._ends.members())
            items = [int(r) for batch in rb for r in batch["index"].view(-1, 3)[:, -1]]
        assert sorted(items) == expected, weighting
        assert sampler.ran_out
        # The next epoch starts over.
        again = [b for b in rb]
        assert sum(b.shape[0] for b in again) == 3 * len(expected)


def test_flat_output_is_torchrl_compatible() -> None:
    stream = SyntheticStream(2, 30.0, seed=7, labels=True)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1000), sampler=SliceSampler(num_slices=4, seed=0), batch_size=32
    )
    rb.extend(stream.chunk(100))
    s = rb.sample()
    assert s.batch_size == torch.Size([32])
    trunc = s[TRUNCATED].view(4, 8)
    assert bool(trunc[:, -1].all()) and not bool(trunc[:, :-1].any())
    assert bool(s[IS_INIT].view(4, 8)[:, 0].all())
    assert bool((s[DONE] == (s[TRUNCATED] | s[TERMINATED])).all())
    assert MASK not in s.keys(True)


def test_non_strict_flat_concatenates_and_pad_output_pads() -> None:
    ids = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1])
    data = TensorDict({TRAJ_IDS: ids, "pos": torch.arange(8)}, batch_size=[8])
    short = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=SliceSampler(slice_len=4, strict_length=False, seed=3),
        batch_size=40,
    )
    short.extend(data)
    s = short.sample()
    assert s.shape[0] < 40 and MASK not in s.keys(True)
    padded_rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=SliceSampler(slice_len=4, strict_length=False, pad_output=True, seed=3),
        batch_size=40,
    )
    padded_rb.extend(data)
    p = padded_rb.sample()
    assert p.shape == torch.Size([40])
    mask = p[MASK].view(10, 4)
    assert bool((mask.sum(1) >= 2).all())
    assert bool((p["index"][~p[MASK]] == -1).all())
    assert not bool(p[TRUNCATED][~p[MASK]].any())


def test_initial_state_is_the_stored_state_at_the_first_step() -> None:
    stream = SyntheticStream(2, 40.0, seed=8, labels=True)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1000),
        sampler=SliceSampler(slice_len=5, burn_in=3, state_keys=["g"], seed=0),
        batch_size=20,
    )
    rb.extend(stream.chunk(60))
    for shaped in (True, False):
        s, info = rb.sample(return_info=True, as_sequences=shaped)
        first = s["g"].view(4, -1)[:, 0] if shaped or s.shape[0] == 32 else None
        rows = info["index"]
        assert bool((info["initial_state"]["g"] == rb.storage.columns[("g",)][rows[:, 0]]).all())
        if first is not None:
            assert bool((info["initial_state"]["g"] == first).all())


def test_errors() -> None:
    with pytest.raises(TypeError):
        SliceSampler()
    with pytest.raises(TypeError):
        SliceSampler(num_slices=2, slice_len=3)
    with pytest.raises(ValueError, match="weighting"):
        SliceSampler(slice_len=2, weighting="episode")
    with pytest.raises(ValueError, match="divisible"):
        ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=3), batch_size=8)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=3), batch_size=6
    )
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    rb.extend(TensorDict({TRAJ_IDS: torch.tensor([0, 0, 1, 1])}, batch_size=[4]))
    with pytest.raises(RuntimeError, match="no trajectory has 3"):
        rb.sample()
    no_bounds = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    from splice.layout import LayoutError

    with pytest.raises(LayoutError, match="cannot find trajectory boundaries"):
        no_bounds.extend(TensorDict({"x": torch.zeros(3)}, batch_size=[3]))
    assert len(no_bounds) == 0


def test_non_strict_transition_weighting_starts_uniformly_and_covers_episode_ends() -> None:
    """Every stored step is equally likely to *start* a slice; slices are cut at the
    trajectory's last step, so terminal steps are trained on as often as interior ones."""
    ids = torch.tensor([0] * 4 + [1] * 20 + [2] * 76)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(200),
        sampler=SliceSampler(
            slice_len=10, weighting="transition", strict_length=False, as_sequences=True, seed=3
        ),
        batch_size=10 * 4000,
    )
    rb.extend(TensorDict({TRAJ_IDS: ids, "pos": torch.arange(100)}, batch_size=[100]))
    s = rb.sample()
    mask = s[MASK]
    starts = s["pos"][:, 0].numpy()
    per_start = np.bincount(starts, minlength=100)
    assert _chi2_ok(
        np.bincount(np.digitize(starts, [4, 24]), minlength=3), np.array([4, 20, 76]) / 100
    )
    assert per_start.min() > 0  # every step starts some slice, the last ones included
    # A slice starting k steps before its trajectory's end holds k + 1 steps, then padding.
    last = np.array([3] * 4 + [23] * 20 + [99] * 76)[starts]
    assert (mask.sum(1).numpy() == np.minimum(last - starts + 1, 10)).all()
    # The last step of the long trajectory is covered by the slices starting in its last 10.
    covered = (s["pos"] == 99) & mask
    expected = 10 / 100 * s.shape[0]
    assert abs(int(covered.sum()) - expected) < 4 * expected**0.5


@pytest.mark.parametrize("kind", ["prioritized", "trajectory"])
def test_non_strict_samples_short_trajectories_whole(kind: str) -> None:
    """Issue 10, bug 3: ``PrioritizedSliceSampler(strict_length=False)`` cut a 5-step
    trajectory into slices of 1-5 steps; like ``SliceSampler`` and TorchRL it samples a
    trajectory shorter than ``slice_len`` whole, and longer ones in full slices."""
    if kind == "prioritized":
        sampler = PrioritizedSliceSampler(slice_len=10, strict_length=False, seed=0)
    else:
        sampler = SliceSampler(slice_len=10, strict_length=False, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=10 * 50)
    ids = torch.tensor([0] * 5 + [1] * 20)
    rb.extend(TensorDict({TRAJ_IDS: ids, "t": torch.arange(25)}, [25]))
    lengths: dict[int, set[int]] = {0: set(), 1: set()}
    for _ in range(4):
        s, info = rb.sample(return_info=True, as_sequences=True)
        for i in range(s.shape[0]):
            n = int(info["length"][i])
            lengths[int(s[TRAJ_IDS][i, 0])].add(n)
            if s[TRAJ_IDS][i, 0] == 0:
                assert s["t"][i, :n].tolist() == [0, 1, 2, 3, 4]
    assert lengths == {0: {5}, 1: {10}}
    # The short trajectory grows: its short slice moves to its new last step, then it
    # becomes long enough for full slices only.
    rb.extend(TensorDict({TRAJ_IDS: torch.tensor([0] * 7), "t": torch.arange(25, 32)}, [7]))
    s, info = rb.sample(return_info=True, as_sequences=True)
    assert set(info["length"].tolist()) == {10}
