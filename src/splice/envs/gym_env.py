"""Adapter for a single gymnasium ``Env``: the collector resets it itself at episode ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from splice.envs.base import ITEM_ERRORS, EnvAdapter, StepTargets, item_writer, write_item

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
        self._stepper: Callable[[Any, int], np.ndarray | None] | None = None
        self._init_spaces()
        self._scalar_action = isinstance(self.single_action_space, spaces.Discrete)
        self.random_action_space = self.single_action_space

    def bind(self, staging: StepTargets) -> None:
        super().bind(staging)
        self._stepper = None  # made for these targets at the next step_function()

    def _update_fast_path(self) -> None:
        super()._update_fast_path()
        self._stepper = None  # other leaves or info keys: made anew

    def reset(self, seed: int | None = None) -> None:
        obs, info = self.env.reset(seed=seed)
        self._check_obs(obs, "reset()")
        self.obs = self._obs_values(obs) + self._read_info(info, "reset()")
        self.check_next = True

    def step(self, action: Any, c: int) -> np.ndarray | None:
        return self.step_function()(action, c)

    def step_function(self) -> Callable[[Any, int], np.ndarray | None]:
        """:meth:`step` as one closure over the bound staging views and this env's layout
        (made once per :meth:`bind` and :meth:`select`): per step it makes one Python call,
        the env's, and writes each value with one item assignment. The first step of a
        batch (``check_next``) and info dicts the one-lookup read does not fit go through
        the checked reads (:meth:`_read_next_info`)."""
        if self._stepper is None:
            self._stepper = self._make_stepper()
        return self._stepper

    def _make_stepper(self) -> Callable[[Any, int], np.ndarray | None]:
        adapter, env_step, env_reset = self, self.env.step, self.env.reset
        flatten, single_leaf, next_obs = self._flatten, self._single_leaf, self._next_obs
        next_obs0 = next_obs[0]  # the one leaf's column (single_leaf)
        reward_col = self._reward
        infos = self.infos
        reads_info = bool(infos.keys)
        # One required entry at the top of the info dict (Taxi's action_mask, Atari's lives):
        # read with one lookup, written with one assignment.
        one_key = infos.single_top_level_key() if self._next_info else None
        info_col0 = self._next_info[0] if one_key is not None else np.empty(0)
        read_next_info = self._read_next_info
        # Scalar columns written through memoryviews (item_writer, write_item), the arrays once
        # a value does not fit one.
        obs_w, obs_ws = item_writer(next_obs0), [item_writer(arr) for arr in next_obs]
        info_w = item_writer(info_col0)
        term_w, trunc_w = item_writer(self._terminated), item_writer(self._truncated)

        def step(action: Any, c: int) -> np.ndarray | None:
            nonlocal obs_w, info_w
            obs, reward, terminated, truncated, info = env_step(action)
            check = adapter.check_next
            if check:
                adapter._check_step(obs, reward, terminated, truncated)
            # Per-step writes try the writer inline (a call per write costs 1-2% of a cheap
            # env's step, docs/design.md) and leave a refused value to write_item.
            if single_leaf:
                try:
                    obs_w[c] = obs
                except ITEM_ERRORS:
                    obs_w = write_item(obs_w, next_obs0, c, obs)
                values = [obs]
            else:  # one env: its non-tensor leaves are plain objects (no per-env array)
                values = flatten(obs)
                try:
                    for w, value in zip(obs_ws, values):  # noqa: B905 (one per leaf)
                        w[c] = value
                except ITEM_ERRORS:
                    for i, (arr, value) in enumerate(zip(next_obs, values)):  # noqa: B905
                        obs_ws[i] = write_item(obs_ws[i], arr, c, value)
            if reads_info:
                if one_key is not None and not check and one_key in info:
                    value = info[one_key]
                    try:
                        info_w[c] = value
                    except ITEM_ERRORS:
                        try:
                            info_w = write_item(info_w, info_col0, c, value)
                        except ValueError:
                            infos.raise_bad_values([value], "step()")
                    values.append(value)
                else:
                    values += read_next_info(info, c, check)
            reward_col[c] = reward
            if terminated or truncated:  # the flags are False at c unless written (StepTargets)
                if terminated:
                    term_w[c] = True
                if truncated:
                    trunc_w[c] = True
                obs, info = env_reset()
                values = flatten(obs)  # one env: no per-env object arrays to make
                if reads_info:
                    values += infos.read(info, "reset()")
                adapter.obs = values
                return _RESTART
            adapter.obs = values
            return None

        return step

    def reset_envs(self, mask: np.ndarray) -> None:
        if bool(mask[0]):
            obs, info = self.env.reset()
            self.obs = self._obs_values(obs) + self._read_info(info, "reset()")

    def env_action(self, action: np.ndarray) -> Any:
        return action.item() if self._scalar_action else action
