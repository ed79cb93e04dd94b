"""Clear errors for bad inputs: arguments, policies, environments."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from splice import Collector
from splice.envs import EnvError
from splice.policies import PolicyError
from splice.testing import CountingEnv, counting_vec


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"frames_per_batch": 0}, "frames_per_batch"),
        ({"frames_per_batch": -5}, "frames_per_batch"),
        ({"frames_per_batch": 10, "total_frames": 0}, "total_frames"),
        ({"frames_per_batch": 10, "total_frames": -3}, "total_frames"),
        ({"frames_per_batch": 10, "traj_format": "cat"}, "traj_format only applies"),
        (
            {"frames_per_batch": 10, "trajs_per_batch": 2, "traj_format": "nested"},
            "traj_format must be",
        ),
        ({"frames_per_batch": 10, "trajs_per_batch": 0}, "trajs_per_batch"),
        ({"frames_per_batch": 10, "trajs_per_batch": 2, "split_trajs": True}, "exclusive"),
        (
            {"frames_per_batch": 10, "trajs_per_batch": 2, "reset_at_each_iter": True},
            "reset_at_each_iter",
        ),
        ({"frames_per_batch": 10, "init_random_frames": -1}, "init_random_frames"),
        ({"frames_per_batch": 10, "max_frames_per_traj": 0}, "max_frames_per_traj"),
        ({"frames_per_batch": 10, "worker_id": -2}, "worker_id"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Collector(counting_vec([3]), **kwargs)


@pytest.mark.parametrize(
    "name",
    [
        "frames_per_batch",
        "total_frames",
        "max_frames_per_traj",
        "init_random_frames",
        "trajs_per_batch",
        "seed",
        "worker_id",
    ],
)
@pytest.mark.parametrize("value", [True, False, 2.5, "4"])
def test_count_arguments_refuse_bools_and_non_integers(name, value):
    """Every argument that takes an int refuses a bool (``True`` is not a count) and any other
    non-integer with a TypeError naming it (issue 11, item 12: ``seed=True`` was accepted)."""
    kwargs = {"frames_per_batch": 10, name: value}
    with pytest.raises(TypeError, match=name):
        Collector(counting_vec([3]), **kwargs)
    with pytest.raises(TypeError, match="num_envs"):
        Collector("CartPole-v1", frames_per_batch=10, num_envs=value)


def test_count_arguments_accept_numpy_integers():
    c = Collector(
        counting_vec([3]), frames_per_batch=np.int64(4), total_frames=np.int32(8), seed=np.int64(1)
    )
    assert [b.numel() for b in c] == [4, 4]
    c.shutdown()


def test_negative_seed_is_a_value_error():
    with pytest.raises(ValueError, match="seed"):
        Collector(counting_vec([3]), frames_per_batch=10, seed=-1)


def test_invalid_kinds():
    with pytest.raises(TypeError, match="extend"):
        Collector(counting_vec([3]), frames_per_batch=4, replay_buffer=object())
    with pytest.raises(TypeError, match="policy"):
        Collector(counting_vec([3]), 42, frames_per_batch=4)
    with pytest.raises(TypeError, match=r"gymnasium\.Env"):
        Collector(42, frames_per_batch=4)
    with pytest.raises(TypeError, match="factory"):
        Collector(lambda: 3, frames_per_batch=4)
    with pytest.raises(TypeError, match="num_envs"):
        Collector(CountingEnv(), frames_per_batch=4, num_envs=2)
    with pytest.raises(ValueError, match="num_envs"):
        Collector("CartPole-v1", frames_per_batch=4, num_envs=0)


def test_max_frames_per_traj_needs_partial_reset():
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    with pytest.raises(ValueError, match="max_episode_steps"):
        Collector(env, frames_per_batch=8, max_frames_per_traj=5)


def _policy(fn):
    def policy(td):
        return fn(td)

    return policy


@pytest.mark.parametrize(
    "make_out,match",
    [
        (lambda td: td, "no 'action'"),
        (
            lambda td: td.set("action", torch.zeros(*td.batch_size, 1, dtype=torch.long)),
            r"shape \[2\]",
        ),
        (lambda td: td.set("action", torch.zeros(td.batch_size)), "integer"),
        (lambda td: {"action": torch.zeros(2, dtype=torch.long)}, "returned dict"),
    ],
)
def test_bad_policy_outputs(make_out, match):
    c = Collector(counting_vec([3, 3]), _policy(make_out), frames_per_batch=4)
    with pytest.raises(PolicyError, match=match):
        next(iter(c))
    c.shutdown()


def test_policy_changing_its_action_shape_later_is_caught_at_the_next_batch():
    calls = {"n": 0}

    def policy(td):
        calls["n"] += 1
        shape = (*td.batch_size,) if calls["n"] <= 2 else (*td.batch_size, 1)
        return td.set("action", torch.zeros(shape, dtype=torch.long))

    c = Collector(counting_vec([3, 3]), policy, frames_per_batch=4)
    it = iter(c)
    next(it)
    with pytest.raises(PolicyError, match="action"):
        next(it)
    c.shutdown()


class BadShapes(gym.vector.VectorWrapper):
    def __init__(self, env, what):
        super().__init__(env)
        self.what = what

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        if self.what == "obs":
            obs = obs[:, :2]
        elif self.what == "reward":
            rew = rew[:1]
        elif self.what == "flags":
            term = term.astype(np.float32)
        return obs, rew, term, trunc, info


@pytest.mark.parametrize(
    "what,match", [("obs", "observation"), ("reward", "reward"), ("flags", "bool")]
)
def test_env_with_wrong_shapes(what, match):
    c = Collector(BadShapes(counting_vec([3, 3]), what), frames_per_batch=4)
    with pytest.raises(EnvError, match=match):
        next(iter(c))
    c.shutdown()


def test_single_env_wrong_obs_shape_on_reset():
    class Broken(CountingEnv):
        def reset(self, **kw):
            return np.zeros(5, np.float32), {}

    c = Collector(Broken(), frames_per_batch=4)
    with pytest.raises(EnvError, match=r"expected \[3\]"):
        next(iter(c))
    c.shutdown()


def test_unknown_autoreset_mode():
    env = counting_vec([3])
    env.metadata = {**env.metadata, "autoreset_mode": "Sometimes"}
    with pytest.raises(ValueError, match="Sometimes"):
        Collector(env, frames_per_batch=4)

    class Anonymous(gym.vector.VectorEnv):
        metadata: dict = {}  # noqa: RUF012

        def __init__(self):
            self.num_envs = 1
            self.single_observation_space = spaces.Box(0, 1, (1,))
            self.single_action_space = spaces.Discrete(2)

    with pytest.raises(ValueError, match="autoreset mode"):
        Collector(Anonymous(), frames_per_batch=4)


def test_unsupported_spaces():
    # Text is carried everywhere (tests/envs/test_non_tensor.py).
    class DictActionEnv(CountingEnv):
        def __init__(self):
            super().__init__()
            self.action_space = spaces.Dict(a=spaces.Discrete(2))

    with pytest.raises(TypeError, match="action space"):
        Collector(DictActionEnv(), frames_per_batch=4)


def test_progress_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(ImportError, match=r"splice-rl\[progress\]"):
        Collector(counting_vec([3]), frames_per_batch=4, progress=True)


def test_progress_bar_counts(capsys):
    c = Collector(counting_vec([3, 4]), frames_per_batch=20, total_frames=40, progress=True)
    list(c)
    err = capsys.readouterr().err
    assert "40.0/40.0" in err and "episodes=" in err and "mean_return=" in err
    c.shutdown()


def test_shut_down_collector_refuses_to_collect():
    c = Collector(counting_vec([3]), frames_per_batch=4)
    c.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        next(iter(c))


def test_collection_recovers_after_a_policy_error():
    calls = {"n": 0}

    def flaky(td):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("transient")
        return td.set("action", torch.zeros(td.batch_size, dtype=torch.long))

    c = Collector(counting_vec([4, 4]), flaky, frames_per_batch=10, total_frames=30)
    it = iter(c)
    with pytest.raises(RuntimeError, match="transient"):
        next(it)
    batch = next(iter(c))  # starts over: fresh episodes, full batch
    assert batch.batch_size == torch.Size([2, 5])
    assert bool(batch["is_init"][:, 0].all())
    assert torch.equal(batch["observation"][..., 1][:, :4], torch.arange(4.0).expand(2, -1))
    c.shutdown()
