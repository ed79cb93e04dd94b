"""The collector and the replay buffer together, on real gymnasium environments."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDictBase

from splice import (
    Collector,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
)
from splice.layout import CUT, DONE, IS_INIT, MASK, TRAJ_IDS
from splice.testing import counting_vec


class GRUPolicy(torch.nn.Module):
    """A tiny recurrent policy following the ("next", state) convention."""

    def __init__(self, obs_dim: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(obs_dim, hidden)
        self.head = torch.nn.Linear(hidden, 2)
        self.hidden = hidden

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs = td["observation"]
        h = td.get("hidden", None)
        if h is None:
            h = obs.new_zeros(*obs.shape[:-1], self.hidden)
        with torch.no_grad():
            h = self.cell(obs.reshape(-1, obs.shape[-1]), h.reshape(-1, self.hidden))
            td["action"] = self.head(h).argmax(-1).reshape(obs.shape[:-1])
        td["next", "hidden"] = h.reshape(*obs.shape[:-1], self.hidden)
        return td


def assert_slices_are_clean(data: TensorDictBase) -> None:
    """Every [S, L] slice: one trajectory, consecutive steps (counting env), no padding inside."""
    real = data[MASK]
    ids = data[TRAJ_IDS]
    steps = data["observation"][..., 0]
    for s in range(data.shape[0]):
        r = real[s]
        assert (ids[s][r] == ids[s][r][0]).all()
        assert (torch.diff(steps[s][r]) == 1).all()


@pytest.mark.parametrize("storage_kind", ["memory", "memmap"])
def test_collector_extends_a_replay_buffer_with_its_batches(tmp_path, storage_kind) -> None:
    storage = (
        LazyTensorStorage(2_000)
        if storage_kind == "memory"
        else LazyMemmapStorage(2_000, scratch_dir=tmp_path / "rb")
    )
    rb = ReplayBuffer(
        storage=storage,
        sampler=SliceSampler(slice_len=6, as_sequences=True, strict_length=False, seed=0),
        batch_size=4 * 6,
    )
    env = counting_vec([7, 11, 13, 17])
    with Collector(env, frames_per_batch=40, total_frames=400, replay_buffer=rb, seed=0) as c:
        yielded = sum(b.numel() for b in c)
    assert yielded == 400 and len(rb) == 400 and rb.write_count == 400
    # Episodes of length 13 and 17 span the 10-step chunks; slices of 6 may span them too.
    for _ in range(20):
        assert_slices_are_clean(rb.sample())


def test_background_collection_fills_a_real_buffer_while_sampling() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10_000),
        sampler=SliceSampler(slice_len=8, as_sequences=True, strict_length=False, seed=1),
        batch_size=16 * 8,
    )
    env = counting_vec([9, 23, 31, 40])
    collector = Collector(env, frames_per_batch=80, total_frames=4_000, replay_buffer=rb, seed=1)
    collector.start()
    try:
        deadline = time.monotonic() + 30
        while len(rb) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        n_samples = 0
        while collector.running and n_samples < 200:
            assert_slices_are_clean(rb.sample())
            n_samples += 1
        collector.wait(timeout=60)
    finally:
        collector.shutdown(timeout=30)
    assert rb.write_count == 4_000  # total_frames honoured, no batch lost
    assert not collector.running


def test_complete_episodes_into_the_buffer_with_set_truncated() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(5_000), sampler=RandomSampler(seed=0))
    env = counting_vec([5, 13, 29])
    collector = Collector(
        env,
        frames_per_batch=30,
        total_frames=600,
        trajs_per_batch=4,
        traj_format="cat",
        set_truncated=True,
        replay_buffer=rb,
        seed=0,
    )
    for _ in collector:
        pass
    stored = rb[torch.arange(len(rb))]
    # Every stored complete episode has exactly one done, at its end, and no collector mark;
    # flushed fragments (end of run) end with cut=True and no done.
    ids = stored[TRAJ_IDS]
    for traj in ids.unique().tolist():
        ep = stored[ids == traj]
        done = ep[DONE].view(-1)
        if ep[CUT].any():
            assert ep[CUT].view(-1).tolist() == [False] * (len(ep) - 1) + [True]
            assert not done.any()
        else:
            assert done.tolist() == [False] * (len(ep) - 1) + [True]
            assert ep[IS_INIT][0].item()


def test_recurrent_state_is_stored_and_served_with_slices() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(4_000),
        sampler=SliceSampler(
            slice_len=10,
            burn_in=5,
            as_sequences=True,
            strict_length=False,
            state_keys=["hidden"],
            seed=0,
        ),
        batch_size=8 * 10,
    )
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    policy = GRUPolicy()
    with Collector(env, policy, frames_per_batch=200, total_frames=1_000, replay_buffer=rb) as c:
        for _ in c:
            pass
    data, info = rb.sample(return_info=True)
    h0 = info["initial_state"]["hidden"]
    assert h0.shape == (8, 8)
    assert torch.equal(h0, data["hidden"][:, 0])
    # The state entering an episode's first step is zero (the collector zeroes it at is_init),
    # and elsewhere it is the policy's state (not all zero).
    stored = rb[torch.arange(len(rb))]
    first = stored[IS_INIT].view(-1)
    assert first.any() and (~first).any()
    assert (stored["hidden"][first] == 0).all()
    assert (stored["hidden"][~first] != 0).any(-1).all()


def test_prioritized_replay_from_collector_batches() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1_000),
        sampler=PrioritizedSliceSampler(
            alpha=0.7, beta=0.5, slice_len=4, as_sequences=True, strict_length=False, seed=0
        ),
        batch_size=8 * 4,
    )
    env = counting_vec([6, 9, 14])
    with Collector(env, frames_per_batch=60, total_frames=600, replay_buffer=rb, seed=0) as c:
        for _ in c:
            pass
    data = rb.sample()
    assert_slices_are_clean(data)
    rows = data["index"][data[MASK]]
    rb.update_priority(rows, torch.full((rows.numel(),), 5.0))
    assert_slices_are_clean(rb.sample())


class MemoryPolicy(torch.nn.Module):
    """A policy that stores per-step "memory" with each step: its two layers' activations
    (what a TrXL-style agent keeps as episodic memory), 128 bytes per step."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 16), torch.nn.Linear(16, 16)])
        self.head = torch.nn.Linear(16, 2)

    def memory(self, obs: torch.Tensor) -> torch.Tensor:
        out, x = [], obs
        with torch.no_grad():
            for layer in self.layers:
                x = torch.tanh(layer(x))
                out.append(x)
        return torch.stack(out, -2)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        memory = self.memory(td["observation"])
        td["memory"] = memory
        with torch.no_grad():
            td["action"] = self.head(memory[..., -1, :]).argmax(-1)
        return td


def test_per_step_memory_written_by_a_policy_is_windowed_as_context() -> None:
    """A policy's per-step entry is stored like any key and served as a transformer's
    context: every window holds, for every real column, the memory the policy computed at
    that step (checked against the stored observation), the steps of one episode only, and
    fewer than K context steps only where the episode starts or its older steps were
    overwritten."""
    K, L = 12, 8
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1_000),  # 2,000 frames: the ring wraps
        sampler=SliceSampler(
            slice_len=L,
            burn_in=K,
            burn_in_align="right",
            burn_in_keys=["memory"],
            strict_length=False,
            as_sequences=True,
            seed=0,
        ),
        batch_size=16 * L,
    )
    torch.manual_seed(0)
    policy = MemoryPolicy()
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    with Collector(env, policy, frames_per_batch=200, total_frames=2_000, replay_buffer=rb) as c:
        for _ in c:
            pass
    for _ in range(3):
        data, info = rb.sample(return_info=True)
        real, burn = data[MASK], data["collector", "burn_in"]
        assert bool(real[:, K].all())  # every slice's first training step at column K
        for i in range(data.shape[0]):
            rows = data["index"][i][real[i]]
            stored = rb[rows]
            assert torch.allclose(data["memory"][i][real[i]], policy.memory(stored["observation"]))
            assert bool((stored[TRAJ_IDS] == stored[TRAJ_IDS][0]).all())
            b = int(info["burn_in"][i])
            assert int(burn[i].sum()) == b and bool(burn[i, K - b : K].all())
            assert not bool(data["observation"][i, :K].any())  # not asked for: zero
            assert not bool(stored[IS_INIT][1:].any())  # no episode start inside a window
            if b < K:  # the episode starts there, or its older steps were overwritten
                oldest = int(rb.index.steps_before(rows[:1].numpy())[0]) == 0
                assert bool(stored[IS_INIT][0]) or oldest
