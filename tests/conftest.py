"""Shared test helpers: a counting env and a minimal replay buffer."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from tensordict import TensorDictBase


class CountingEnv(gym.Env):
    """obs = [real steps taken by this env so far, step in the episode, env tag].

    Episodes end (terminated) after ``length`` steps, or truncated after ``trunc`` steps.
    Resets never count as steps, so along an env row the first obs entry counts 0, 1, 2, ...
    across episodes and batches: a dead step, a lost step or a repeated step shows up as a jump.
    The reward is the action, so data from two runs can be compared step by step.
    """

    metadata: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self, length: int = 5, tag: int = 0, trunc: int | None = None) -> None:
        self.length, self.tag, self.trunc = length, tag, trunc
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.total = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.total, self.t, self.tag], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.total += 1
        self.t += 1
        terminated = self.t >= self.length
        truncated = self.trunc is not None and self.t >= self.trunc and not terminated
        return self._obs(), float(action), terminated, truncated, {}


def counting_vec(
    lengths: list[int],
    mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    *,
    asynchronous: bool = False,
    trunc: int | None = None,
) -> SyncVectorEnv | AsyncVectorEnv:
    fns = [lambda n=n, i=i: CountingEnv(n, tag=i, trunc=trunc) for i, n in enumerate(lengths)]
    if asynchronous:
        return AsyncVectorEnv(fns, autoreset_mode=mode, context="fork")
    return SyncVectorEnv(fns, autoreset_mode=mode)


class ListBuffer:
    """The smallest replay buffer: keeps what ``extend`` receives (thread-safe)."""

    def __init__(self) -> None:
        self.items: list[TensorDictBase] = []
        self._lock = threading.Lock()

    def extend(self, data: TensorDictBase) -> None:
        with self._lock:
            self.items.append(data)

    def __len__(self) -> int:
        with self._lock:
            return sum(int(d.numel()) for d in self.items)


def parity_policy(td: TensorDictBase) -> TensorDictBase:
    """A deterministic policy: push in the direction of the pole's velocity (short episodes)."""
    td["action"] = (td["observation"][..., 1] > 0).long()
    return td


@pytest.fixture(autouse=True)
def _torch_seed() -> None:
    torch.manual_seed(0)
