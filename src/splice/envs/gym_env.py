"""Adapter for a single gymnasium ``Env``: the collector resets it itself at episode ends."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from splice.envs.base import EnvAdapter

__all__ = ["GymEnvAdapter"]

_RESTART = np.ones(1, dtype=np.bool_)


class GymEnvAdapter(EnvAdapter):
    """A single ``gymnasium.Env`` as a one-env step stream (batches are ``[T]``).

    When an episode ends (terminated or truncated) the adapter writes the final observation
    as the step's next observation and resets the env at once, so there is never a dead step.

    Args:
        env: the environment.

    Examples:
        >>> import gymnasium as gym
        >>> adapter = GymEnvAdapter(gym.make("CartPole-v1"))
        >>> adapter.bind(adapter.allocate(capacity=100))
        >>> adapter.reset(seed=0)
        >>> restarts = [adapter.step(1, c) for c in range(100)]  # always push right: short episodes
        >>> first_end = next(c for c, r in enumerate(restarts) if r is not None)
        >>> bool(adapter.staging.terminated[first_end, 0])
        True
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        self.env = env
        self.num_envs = 1
        self.batched = False
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.dead_steps = False
        self.supports_partial_reset = True
        self.autoreset_mode = "single env (reset by the collector)"
        self._init_spaces()
        self._scalar_action = isinstance(self.single_action_space, spaces.Discrete)
        self._step = env.step
        self.random_action_space = self.single_action_space

    def reset(self, seed: int | None = None) -> None:
        obs, info = self.env.reset(seed=seed)
        self._check_obs(obs, "reset()")
        self.obs = self._obs_values(obs) + self._read_info(info, "reset()")
        self.check_next = True

    def step(self, action: Any, c: int) -> np.ndarray | None:
        obs, reward, terminated, truncated, info = self._step(action)
        check = self.check_next
        if check:
            self._check_step(obs, reward, terminated, truncated)
        if self._single_leaf:
            self._next_obs0[c] = obs
            values = [obs]
        else:  # one env: its non-tensor leaves are plain objects (no per-env array)
            values = self._flatten(obs)
            for arr, value in zip(self._next_obs, values, strict=True):
                arr[c] = value
        if self._reads_info:
            values += self._read_next_info(info, c, check)
        self._reward[c] = reward
        if terminated or truncated:  # the flags are False at c unless written (StepTargets)
            self._terminated[c] = terminated
            self._truncated[c] = truncated
            obs, info = self.env.reset()
            values = self._flatten(obs)  # one env: no per-env object arrays to make
            if self._reads_info:
                values += self.infos.read(info, "reset()")
            self.obs = values
            return _RESTART
        self.obs = values
        return None

    def reset_envs(self, mask: np.ndarray) -> None:
        if bool(mask[0]):
            obs, info = self.env.reset()
            self.obs = self._obs_values(obs) + self._read_info(info, "reset()")

    def env_action(self, action: np.ndarray) -> Any:
        return action.item() if self._scalar_action else action
