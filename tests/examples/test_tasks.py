"""make_task: any gymnasium env with discrete actions, as float vectors the Q-networks read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splice import Collector
from splice.examples.qnets import EpsilonGreedy, RecurrentQNet
from splice.examples.tasks import make_task, task_dims


@pytest.mark.parametrize(
    ("env_id", "obs_dim", "n_actions"),
    [
        ("popgym-RepeatFirstEasy-v0", 4, 4),  # Discrete(4) -> one-hot
        ("popgym-CountRecallEasy-v0", 4, 27),  # MultiDiscrete([2, 2]) -> two one-hots
        ("popgym-AutoencodeEasy-v0", 6, 4),  # Tuple(Discrete(2), Discrete(4))
        ("popgym-PositionOnlyCartPoleEasy-v0", 2, 2),  # the task's own masked variant
        ("MiniGrid-MemoryS7-v0", 7 * 7 * 3 + 4, 7),  # Dict; the Text mission is dropped
        ("Acrobot-v1", 6, 3),
    ],
)
def test_observations_become_float_vectors_the_collector_stores(
    env_id: str, obs_dim: int, n_actions: int
) -> None:
    env = make_task(env_id, num_envs=3)
    assert task_dims(env) == (obs_dim, n_actions)
    policy = EpsilonGreedy(RecurrentQNet(obs_dim, n_actions, hidden=8), n_actions, seed=0)
    collector = Collector(env, policy, frames_per_batch=3 * 20, total_frames=3 * 20, seed=0)
    batch = next(iter(collector))
    collector.shutdown()
    assert batch["observation"].shape == (3, 20, obs_dim)
    assert batch["observation"].dtype == torch.float32
    assert int(batch["action"].max()) < n_actions


def test_discrete_observation_is_one_hot() -> None:
    env = make_task("popgym-RepeatFirstEasy-v0", num_envs=4)
    obs, _ = env.reset(seed=0)
    assert np.array_equal(obs.sum(1), np.ones(4)) and set(np.unique(obs)) == {0.0, 1.0}


def test_masked_cartpole_keeps_position_and_angle() -> None:
    full, masked = (make_task("CartPole-v1", num_envs=2, mask_velocity=m) for m in (False, True))
    full_obs, _ = full.reset(seed=3)
    masked_obs, _ = masked.reset(seed=3)
    assert np.array_equal(masked_obs, full_obs[:, [0, 2]])


def test_max_episode_steps_truncates() -> None:
    env = make_task("popgym-RepeatFirstEasy-v0", num_envs=1, max_episode_steps=5)
    env.reset(seed=0)
    truncated = [env.step(np.zeros(1, dtype=np.int64))[3][0] for _ in range(5)]
    assert truncated == [False] * 4 + [True]


def test_module_prefix_imports_the_registering_package() -> None:
    env = make_task("popgym:popgym-RepeatPreviousEasy-v0", num_envs=1)
    assert task_dims(env) == (4, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env_id": "Pendulum-v1"}, "actions must be Discrete"),
        ({"env_id": "NoSuchEnv-v0"}, "unknown gymnasium env id 'NoSuchEnv-v0'"),
        ({"env_id": "popgym-RepeatFirstEasy-v0", "mask_velocity": True}, "CartPole-v1 only"),
        ({"env_id": "CartPole-v1", "num_envs": 0}, "num_envs must be >= 1"),
    ],
)
def test_bad_requests_are_refused_by_name(kwargs: dict, message: str) -> None:
    kwargs = {"num_envs": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        make_task(**kwargs)


def test_env_id_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="env_id must be a str"):
        make_task(3, num_envs=1)  # type: ignore[arg-type]
