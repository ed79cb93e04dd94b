"""Autoreset modes: identical data, no dead steps, true final observations, full [B, T] batches."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict

from splice import Collector, validate_batch
from splice.testing import CountingEnv, counting_vec, threshold_policy

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _cartpole_vec(mode: AutoresetMode, n: int = 4, **kw) -> gym.vector.VectorEnv:
    return gym.make_vec(
        "CartPole-v1",
        num_envs=n,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": mode},
        **kw,
    )


def _collect(env, policy=threshold_policy, **kw) -> list[TensorDict]:
    kw.setdefault("frames_per_batch", 120)
    kw.setdefault("total_frames", 600)
    with Collector(env, policy, seed=3, worker_id=kw.pop("worker_id", 50), **kw) as c:
        return list(c)


@pytest.mark.parametrize("extra", [{}, {"max_frames_per_traj": 6}, {"set_truncated": True}])
def test_three_modes_identical_cartpole(extra):
    ref = _collect(_cartpole_vec(AutoresetMode.SAME_STEP), **extra)
    assert sum(int(b["next", "done"].sum()) for b in ref) > 20  # many episode ends
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED):
        out = _collect(_cartpole_vec(mode), **extra)
        assert len(out) == len(ref)
        for a, b in zip(ref, out, strict=True):
            assert set(a.keys(True, True)) == set(b.keys(True, True))
            assert (a == b).all(), mode


@pytest.mark.parametrize("mode", MODES)
def test_async_vector_env_matches_sync(mode):
    ref = _collect(counting_vec([1, 2, 3, 5]), worker_id=51, max_frames_per_traj=4)
    env = counting_vec([1, 2, 3, 5], mode, asynchronous=True)
    out = _collect(env, worker_id=51, max_frames_per_traj=4)
    for a, b in zip(ref, out, strict=True):
        assert (a == b).all()


@pytest.mark.parametrize("mode", MODES)
def test_no_dead_steps_no_lost_steps(mode):
    # Episode lengths 1..4: NEXT_STEP loses a step after every episode, at different times in
    # every row, so rows are topped up and surplus steps are carried to the next batch.
    lengths = [1, 2, 3, 4]
    batches = _collect(counting_vec(lengths, mode), frames_per_batch=40, total_frames=400)
    data = torch.cat(batches, dim=1)  # [B, sum T]: rows continue across batches
    for b in batches:
        assert b.batch_size == torch.Size([4, 10])
        validate_batch(b, required=[("collector", "traj_ids"), ("collector", "cut")])
    obs, nxt = data["observation"], data["next", "observation"]
    # the counting payload goes 0, 1, 2, ... along every row: no dead, lost or repeated step
    expected = torch.arange(data.shape[1], dtype=torch.float32).expand(4, -1)
    assert torch.equal(obs[..., 0], expected)
    assert torch.equal(nxt[..., 0], expected + 1)
    # at every episode end the next observation is the true final one (episode step == length)
    done = data["next", "done"].squeeze(-1)
    length = torch.tensor(lengths, dtype=torch.float32)[:, None].expand_as(done)
    assert torch.equal(nxt[..., 1][done], length[done])
    # is_init exactly after each end, and the episode step restarts at 0 there
    is_init = data["is_init"].squeeze(-1)
    assert torch.equal(is_init[:, 1:], done[:, :-1])
    assert torch.equal(obs[..., 1][is_init], torch.zeros(int(is_init.sum())))


def test_vector_entry_point_cartpole_no_dead_steps():
    env = gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="vector_entry_point")
    batches = _collect(env, None, frames_per_batch=64 * 50, total_frames=64 * 150)
    data = torch.cat(batches, dim=1)
    assert data.batch_size == torch.Size([64, 150])
    # dead reset steps of CartPoleVectorEnv have reward 0; real steps always reward 1
    assert bool((data["next", "reward"] == 1).all())
    done = data["next", "done"].squeeze(-1)
    term = data["next", "terminated"].squeeze(-1)
    nxt, obs = data["next", "observation"], data["observation"]
    # true final observations: a terminated step's next obs is outside the CartPole bounds
    x, theta = nxt[..., 0][term], nxt[..., 2][term]
    assert bool(((x.abs() > 2.4) | (theta.abs() > 12 * 2 * np.pi / 360)).all())
    # within an episode the next obs is the following step's obs
    cont = ~done[:, :-1]
    assert torch.equal(nxt[:, :-1][cont], obs[:, 1:][cont])
    assert int(done.sum()) > 100


def test_single_env_batches_are_1d_and_match_vector_of_one():
    env = CountingEnv(3)
    batches = _collect(env, frames_per_batch=7, total_frames=21)
    assert [b.batch_size for b in batches] == [torch.Size([7])] * 3
    data = torch.cat(batches)
    assert torch.equal(data["observation"][:, 0], torch.arange(21, dtype=torch.float32))
    vec = _collect(counting_vec([3]), frames_per_batch=7, total_frames=21)
    assert torch.equal(torch.cat(vec, 1)[0]["next", "observation"], data["next", "observation"])


def test_same_step_env_without_final_obs_is_an_error():
    env = counting_vec([2], AutoresetMode.SAME_STEP)

    class Forgetful(gym.vector.VectorWrapper):
        def step(self, actions):
            obs, rew, term, trunc, info = self.env.step(actions)
            info.pop("final_obs", None)
            return obs, rew, term, trunc, info

    with pytest.raises(ValueError, match="final_obs"):
        _collect(Forgetful(env))


def test_truncation_is_not_termination():
    batches = _collect(counting_vec([10, 10], trunc=4), frames_per_batch=20, total_frames=40)
    data = torch.cat(batches, 1)
    trunc = data["next", "truncated"].squeeze(-1)
    term = data["next", "terminated"].squeeze(-1)
    assert int(trunc.sum()) > 0 and int(term.sum()) == 0
    assert torch.equal(
        data["next", "observation"][..., 1][trunc], torch.full((int(trunc.sum()),), 4.0)
    )


@pytest.mark.parametrize("vector", [False, True])
def test_seed_reproduces_random_collection(vector):
    def make():
        env = _cartpole_vec(AutoresetMode.NEXT_STEP) if vector else gym.make("CartPole-v1")
        return Collector(
            env,
            frames_per_batch=80,
            total_frames=240,
            seed=11,
            worker_id=52,
            device="cpu",
            storing_device="cpu",
        )

    with make() as a, make() as b:
        for x, y in zip(a, b, strict=True):
            assert (x == y).all()
    with (
        make() as a,
        Collector(
            _cartpole_vec(AutoresetMode.NEXT_STEP) if vector else gym.make("CartPole-v1"),
            frames_per_batch=80,
            total_frames=80,
            seed=12,
            worker_id=52,
        ) as c,
    ):
        assert not torch.equal(next(iter(a))["action"], next(iter(c))["action"])
