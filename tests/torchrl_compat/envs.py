"""gymnasium versions of the TorchRL test envs the ported collector tests use.

TorchRL's tests build ``torchrl.testing.mocking_classes`` envs (``EnvBase``); splice collects
from gymnasium, so each is rewritten here as the same env in gymnasium's API:

* :class:`CountingEnv` — TorchRL's ``CountingEnv``: the observation is a counter (int32,
  ``[1]``) that starts at ``start_val`` and grows by the action (0 or 1; a ``Discrete(2)``
  action, TorchRL's ``Binary(1)``); the episode terminates once the counter exceeds
  ``max_steps``; the reward is 0.
* :func:`counting_env` — TorchRL's ``TransformedEnv(CountingEnv(max_steps), StepCounter(n))``:
  the same env under gymnasium's ``TimeLimit(n)``, which truncates after ``n`` steps as
  ``StepCounter`` does (there is no ``step_count`` key: tests that read it use
  :func:`steps_in_episode` on the batch instead, and say so).
* :func:`counting_vec` — TorchRL's ``SerialEnv(n, ...)`` of those envs: a ``SyncVectorEnv``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit
from tensordict import TensorDictBase


class CountingEnv(gym.Env[np.ndarray, np.int64]):
    """TorchRL's ``CountingEnv`` (``torchrl.testing.mocking_classes``) in gymnasium."""

    metadata: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self, max_steps: int = 5, start_val: int = 0) -> None:
        self.max_steps, self.start_val = max_steps, start_val
        self.observation_space = spaces.Box(-(2**30), 2**30, (1,), np.int32)
        self.action_space = spaces.Discrete(2)
        self.count = start_val

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.count = self.start_val
        return np.array([self.count], np.int32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.count += int(action)
        return np.array([self.count], np.int32), 0.0, self.count > self.max_steps, False, {}


class EnvThatErrorsAfter10Iters(gym.Env[np.ndarray, np.ndarray]):
    """TorchRL's ``EnvThatErrorsAfter10Iters``: zero observations, and a ``RuntimeError``
    at the 11th step."""

    metadata: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = spaces.Box(-1, 1, (1,), np.float32)
        self.counter = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.counter >= 10:
            raise RuntimeError("max steps!")
        self.counter += 1
        return np.zeros(1, np.float32), 0.0, False, False, {}


def counting_env(max_steps: int = 5, limit: int | None = None, start_val: int = 0) -> gym.Env:
    """``CountingEnv(max_steps)``, under ``TimeLimit(limit)`` when a limit is given."""
    env: gym.Env = CountingEnv(max_steps, start_val)
    return env if limit is None else TimeLimit(env, limit)


def counting_vec(
    n: int, max_steps: int | list[int] = 5, limit: int | None = None, start_val: int = 0
) -> SyncVectorEnv:
    """``n`` counting envs (``max_steps`` one for all or one per env) as a vector env."""
    steps = max_steps if isinstance(max_steps, list) else [max_steps] * n
    return SyncVectorEnv(
        [lambda m=m: counting_env(m, limit, start_val) for m in steps],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )


def ones_policy(td: TensorDictBase) -> TensorDictBase:
    """Always increments the counter (TorchRL's ``CountingEnvCountPolicy``)."""
    return td.set("action", torch.ones(td.batch_size, dtype=torch.int64))


def steps_in_episode(batch: TensorDictBase) -> torch.Tensor:
    """The step of each transition within its episode (TorchRL's ``step_count``),
    counted from the ``is_init`` flags along the last (time) dim."""
    init = batch["is_init"].squeeze(-1).to(torch.int64)
    t = torch.arange(init.shape[-1]).expand_as(init)
    last_start = torch.cummax(torch.where(init.bool(), t, torch.zeros_like(t)), dim=-1).values
    return t - last_start
