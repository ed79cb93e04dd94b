"""Env adapters: observation spaces, action spaces, env kinds (factory, id, envpool-like)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from splice import Collector
from splice.envs import make_adapter
from splice.testing import CountingEnv


class SpaceEnv(gym.Env):
    """Observations drawn from any space; episodes of 3 steps; the step count in every leaf."""

    def __init__(self, obs_space: spaces.Space, act_space: spaces.Space | None = None) -> None:
        self.observation_space = obs_space
        self.action_space = act_space or spaces.Discrete(2)
        self.t = 0
        self.total = 0

    def _obs(self) -> Any:
        def fill(space):
            if isinstance(space, spaces.Dict):
                return {k: fill(s) for k, s in space.spaces.items()}
            if isinstance(space, spaces.Tuple):
                return tuple(fill(s) for s in space.spaces)
            if isinstance(space, spaces.Discrete):
                return np.int64(self.total % space.n)
            return np.full(space.shape, self.total % 2, dtype=space.dtype)

        return fill(self.observation_space)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        self.total += 1
        return self._obs(), 1.0, self.t >= 3, False, {}


OBS_SPACES = {
    "box": spaces.Box(0, 1, (2, 3), np.float32),
    "discrete": spaces.Discrete(5),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multibinary": spaces.MultiBinary(4),
    "dict": spaces.Dict(
        pos=spaces.Box(0, 1, (2,), np.float64), inner=spaces.Dict(flag=spaces.MultiBinary(2))
    ),
    "tuple": spaces.Tuple((spaces.Discrete(3), spaces.Box(0, 1, (1,), np.float32))),
}


@pytest.mark.parametrize("name", list(OBS_SPACES))
@pytest.mark.parametrize("vector", [False, True])
def test_observation_spaces(name, vector):
    space = OBS_SPACES[name]
    env = (
        SyncVectorEnv([lambda: SpaceEnv(space)] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
        if vector
        else SpaceEnv(space)
    )
    with Collector(env, frames_per_batch=8, total_frames=16) as c:
        batches = list(c)
    batch = batches[-1]
    lead = (2, 4) if vector else (8,)
    adapter_leaves = make_adapter(SpaceEnv(space)).obs_leaves
    for leaf in adapter_leaves:
        for root in (("observation",), ("next", "observation")):
            value = batch[(*root, *leaf.key)]
            assert tuple(value.shape) == (*lead, *leaf.shape)
            assert value.dtype == torch.from_numpy(np.zeros(0, leaf.dtype)).dtype
    if name == "dict":
        assert ("observation", "inner", "flag") in batch.keys(True)
    # counting payload: next obs of step t is the obs of step t + 1 within an episode
    first = batch[("next", "observation", *adapter_leaves[0].key)]
    assert first.shape[len(lead) - 1] == lead[-1]


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1, 1, (2,), np.float32),
        spaces.MultiDiscrete([2, 3]),
        spaces.MultiBinary(3),
        spaces.Discrete(4),
    ],
)
def test_random_actions_from_action_space(space):
    env = SyncVectorEnv([lambda: SpaceEnv(spaces.Discrete(2), space)] * 3)
    with Collector(env, frames_per_batch=30, total_frames=30, seed=0) as c:
        (batch,) = list(c)
    actions = batch["action"].numpy()
    assert actions.shape == (3, 10, *space.shape)
    assert all(space.contains(a.astype(space.dtype)) for a in actions.reshape(30, *space.shape))


def test_box_action_policy():
    space = spaces.Box(-1, 1, (2,), np.float32)

    def policy(td):
        td["action"] = torch.full((*td.batch_size, 2), 0.5)
        return td

    with Collector(
        SpaceEnv(spaces.Discrete(2), space), policy, frames_per_batch=4, total_frames=4
    ) as c:
        (batch,) = list(c)
    assert torch.equal(batch["action"], torch.full((4, 2), 0.5))


def test_env_factories_and_ids():
    with Collector(lambda: CountingEnv(2), frames_per_batch=4, total_frames=4) as c:
        assert next(iter(c)).batch_size == torch.Size([4])
    with Collector(
        lambda: SyncVectorEnv([CountingEnv] * 2), frames_per_batch=4, total_frames=4
    ) as c:
        assert next(iter(c)).batch_size == torch.Size([2, 2])
    with Collector("CartPole-v1", frames_per_batch=4, total_frames=4) as c:
        assert next(iter(c)).batch_size == torch.Size([4])
    with Collector("CartPole-v1", num_envs=3, frames_per_batch=6, total_frames=6) as c:
        assert next(iter(c)).batch_size == torch.Size([3, 2])
    with Collector(
        "CartPole-v1", env_kwargs={"max_episode_steps": 3}, frames_per_batch=6, total_frames=6
    ) as c:
        assert bool(next(iter(c))["next", "truncated"][2])


class EnvpoolLike(gym.vector.VectorEnv):
    """envpool's gymnasium API: action_space is the single-env space, NEXT_STEP autoreset,
    and reset() ignores options."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}  # noqa: RUF012

    def __init__(self, num_envs: int = 3, length: int = 2) -> None:
        self.num_envs = num_envs
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = self.single_observation_space  # as envpool does
        self.action_space = self.single_action_space
        self.length = length
        self.total = np.zeros(num_envs)
        self.t = np.zeros(num_envs, int)
        self.pending = np.zeros(num_envs, bool)

    def reset(self, *, seed=None, options=None):
        self.t[:] = 0
        self.pending[:] = False
        return self.total[:, None].astype(np.float32), {}

    def step(self, actions):
        assert np.shape(actions) == (self.num_envs,)
        dead = self.pending.copy()
        self.total[~dead] += 1
        self.t[~dead] += 1
        self.t[dead] = 0
        term = (self.t >= self.length) & ~dead
        self.pending = term
        reward = np.where(dead, 0.0, 1.0)
        return self.total[:, None].astype(np.float32), reward, term, np.zeros_like(term), {}


def test_envpool_like_vector_env():
    env = EnvpoolLike()
    with Collector(env, frames_per_batch=30, total_frames=90) as c:
        data = torch.cat(list(c), 1)
    assert bool((data["next", "reward"] == 1).all())  # no dead steps
    assert torch.equal(data["observation"][..., 0], torch.arange(30.0).expand(3, -1))
    with pytest.raises(ValueError, match="max_frames_per_traj"):
        Collector(EnvpoolLike(), frames_per_batch=3, max_frames_per_traj=2)


def test_envpool_async_mode_is_refused_up_front():
    class AsyncEnvpool(EnvpoolLike):
        """envpool made with batch_size < num_envs: steps return a subset of the envs."""

        is_async = True

        @property
        def config(self):
            return {"num_envs": 3, "batch_size": 2}

    with pytest.raises(ValueError, match=r"async mode \(batch_size=2 < num_envs=3\)"):
        Collector(AsyncEnvpool(), frames_per_batch=6)

    class ConfigOnly(EnvpoolLike):
        config = {"num_envs": 3, "batch_size": 1}  # noqa: RUF012

    with pytest.raises(ValueError, match="async mode"):
        Collector(ConfigOnly(), frames_per_batch=6)
    sync = EnvpoolLike()
    sync.config = {"num_envs": 3, "batch_size": 3}
    Collector(sync, frames_per_batch=6).shutdown()
