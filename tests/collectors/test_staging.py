"""Staging: batches copied out of it live in recycled memory blocks (a block is written again
only once nothing refers to any piece of the batch it held); the work per batch does not grow
with the number of envs."""

from __future__ import annotations

import gc
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from hypothesis import given, settings
from hypothesis import strategies as st

from splice import Collector
from splice.collectors._staging import Staging
from splice.testing import counting_vec, threshold_policy


def test_a_kept_piece_of_a_batch_is_never_overwritten():
    kwargs = {"frames_per_batch": 12, "total_frames": 12 * 8, "worker_id": 94}
    with Collector(counting_vec([3, 5]), threshold_policy, **kwargs) as c:
        reference = [b.clone() for b in c]
    with Collector(counting_vec([3, 5]), threshold_policy, **kwargs) as c:
        kept = []
        for k, batch in enumerate(c):
            # one tensor of each batch (an unsqueezed view, a nested key, a numpy view...);
            # the rest of the batch is dropped at once
            pieces = [
                batch["next", "reward"],
                batch["observation"][0],
                batch["collector", "traj_ids"].numpy(),
            ]
            kept.append(pieces[k % 3])
            del batch, pieces
            gc.collect()
    for k, (piece, ref) in enumerate(zip(kept, reference, strict=True)):
        want = [ref["next", "reward"], ref["observation"][0], ref["collector", "traj_ids"]][k % 3]
        assert torch.equal(torch.as_tensor(piece), want)


def test_a_dropped_batch_frees_its_block_for_the_next():
    with Collector(counting_vec([3, 5]), threshold_policy, frames_per_batch=12) as c:
        it = iter(c)
        first = next(it)
        address = first["observation"].data_ptr()
        kept_address = next(it)["observation"].data_ptr()  # first is held: a new block
        assert kept_address != address
        del first
        # the second batch was dropped at once too, so one of the two blocks is free again
        assert next(it)["observation"].data_ptr() in (address, kept_address)


def test_a_for_loop_holding_the_previous_batch_alternates_two_blocks():
    # `for batch in c` keeps the previous batch alive while the next one is made
    with Collector(counting_vec([3, 5]), threshold_policy, frames_per_batch=12) as c:
        addresses = []
        reference = None
        for k, batch in enumerate(c):
            addresses.append(batch["observation"].data_ptr())
            if k == 2:
                reference = batch.clone()
                kept = batch
            if k == 7:
                break
    assert len(set(addresses[1:])) == 3  # batch 2 was kept: a third block from then on
    assert len(set(addresses[:3])) == 2  # before, the two blocks alternate
    assert torch.equal(kept["observation"], reference["observation"])  # never overwritten


class _NumpyVectorEnv(gym.vector.VectorEnv):
    """A vector entry point in pure numpy (no Python per env): every env ends its episode
    every ``length`` steps, all at once; NEXT_STEP autoreset."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}  # noqa: RUF012

    def __init__(self, num_envs: int, length: int = 7) -> None:
        self.num_envs, self.length, self.t = num_envs, length, 0
        self.single_observation_space = spaces.Box(-1, 1, (3,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros((self.num_envs, 3), np.float32), {}

    def step(self, actions):
        if self.t == self.length:  # the dead reset step
            return (
                self.reset()[0],
                np.zeros(self.num_envs),
                *([np.zeros(self.num_envs, bool)] * 2),
                {},
            )
        self.t += 1
        obs = np.full((self.num_envs, 3), self.t, np.float32)
        ended = np.full(self.num_envs, self.t == self.length)
        return obs, np.ones(self.num_envs), ended, np.zeros(self.num_envs, bool), {}


def _python_calls_per_batch(num_envs: int, whole_episodes: bool) -> list[int]:
    """Python lines run (and calls, returns) by each of 6 ``next()`` (after 2)."""
    counts = []
    # as many episodes per output as envs: each output takes the same number of batches
    kwargs = {"trajs_per_batch": num_envs, "traj_format": "cat"} if whole_episodes else {}
    with Collector(_NumpyVectorEnv(num_envs), frames_per_batch=num_envs * 10, **kwargs) as c:
        it = iter(c)
        for _ in range(2):
            next(it)
        for _ in range(6):
            n = [0]

            def count(frame, event, arg, n=n):
                n[0] += 1  # every Python line run, call and return
                return count

            sys.settrace(count)
            try:
                next(it)
            finally:
                sys.settrace(None)
            counts.append(n[0])
    return counts


@pytest.mark.parametrize("whole_episodes", [False, True])
def test_python_work_per_batch_does_not_grow_with_the_number_of_envs(whole_episodes):
    """The hot loop and the per-batch work are whole-array operations: 4 envs and 512 envs
    run exactly the same Python lines per output (random actions; a loop over envs, or over
    the episodes that end, would show)."""
    few = _python_calls_per_batch(4, whole_episodes)
    assert max(few) > 100  # batches were collected (a next() may only yield a pending output)
    assert few == _python_calls_per_batch(512, whole_episodes)


def test_fill_entering_copies_the_previous_next_values_where_no_episode_starts():
    staging = Staging(num_envs=2, batched=True, steps=4)
    staging.obs_keys, staging.next_obs_keys = [("observation",)], [("next", "observation")]
    for key in (("observation",), ("next", "observation"), ("is_init",)):
        staging.add(
            key,
            () if key == ("is_init",) else (3,),
            np.dtype(np.bool_ if key == ("is_init",) else np.float32),
        )
    obs, nxt, init = (
        staging.arrays[k] for k in (("observation",), ("next", "observation"), ("is_init",))
    )
    nxt[:5] = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    obs[:5] = -1  # what the loop wrote: column 0 (a run's first) and column 2 (a start)
    init[2] = [False, True]  # row 1 starts an episode at column 2: the column is written
    staging.fill_entering(1, 5)
    assert np.array_equal(obs[1], nxt[0])
    assert np.array_equal(obs[2], np.full((2, 3), -1))  # kept in both rows
    assert np.array_equal(obs[3:5], nxt[2:4])
    assert np.array_equal(obs[0], np.full((2, 3), -1))  # before the range: untouched
    before = obs.copy()
    staging.fill_entering(3, 3)  # an empty range writes nothing
    assert np.array_equal(obs, before)


@given(
    num_envs=st.integers(1, 3),
    starts=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=12),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_fill_entering_follows_the_rule(
    num_envs: int, starts: list[list[bool]], data: st.DataObject
) -> None:
    """Any pattern of episode starts, few (one slice copy, the starts put back) or many (a
    gather of the other columns): a column where no row starts gets the previous column's next
    values in every row, a column where one does keeps what the loop wrote, nothing outside
    the range changes."""
    staging = Staging(num_envs=num_envs, batched=True, steps=len(starts) + 1)
    staging.obs_keys, staging.next_obs_keys = [("observation",)], [("next", "observation")]
    staging.add(("observation",), (2,), np.dtype(np.int64))
    staging.add(("next", "observation"), (2,), np.dtype(np.int64))
    staging.add(("is_init",), (), np.dtype(np.bool_))
    obs, nxt, init = (
        staging.arrays[k] for k in (("observation",), ("next", "observation"), ("is_init",))
    )
    stop = len(starts) + 1
    nxt[:] = np.arange(nxt.size).reshape(nxt.shape)
    obs[:] = -np.arange(obs.size).reshape(obs.shape)  # what the loop wrote (or stale values)
    init[1:stop] = np.array(starts)[:, :num_envs]
    start = data.draw(st.integers(1, stop))
    expected = obs.copy()
    for c in range(start, stop):
        if not init[c].any():
            expected[c] = nxt[c - 1]
    staging.fill_entering(start, stop)
    assert np.array_equal(obs, expected)
