"""CartPole-v1 without its velocities: a partially observed task that needs memory.

The agent sees the cart position ``x`` and the pole angle ``theta`` only; the two velocities
(observation entries 1 and 3) are removed. A memoryless policy cannot tell which way the pole
is falling; a recurrent one can infer it from successive observations.

Examples:
    >>> from splice.examples.masked_cartpole import make_masked_cartpole
    >>> env = make_masked_cartpole(num_envs=4)
    >>> env.single_observation_space.shape, env.metadata["autoreset_mode"].name
    ((2,), 'NEXT_STEP')
    >>> obs, _ = env.reset(seed=0)
    >>> obs.shape
    (4, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers.vector import TransformObservation

__all__ = ["KEPT", "MaskVelocity", "greedy_returns", "make_masked_cartpole"]

#: Observation entries kept: cart position and pole angle.
KEPT = (0, 2)


def _masked_box(space: gym.spaces.Box) -> gym.spaces.Box:
    keep = list(KEPT)
    return gym.spaces.Box(space.low[keep], space.high[keep], dtype=np.float32)


class MaskVelocity(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Single-env wrapper: drop the velocity entries of a CartPole observation.

    Examples:
        >>> import gymnasium as gym
        >>> env = MaskVelocity(gym.make("CartPole-v1"))
        >>> env.reset(seed=0)[0].shape
        (2,)
    """

    def __init__(self, env: gym.Env[np.ndarray, Any]) -> None:
        super().__init__(env)
        assert isinstance(env.observation_space, gym.spaces.Box)
        self.observation_space = _masked_box(env.observation_space)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[list(KEPT)].astype(np.float32)


def make_masked_cartpole(num_envs: int, *, max_episode_steps: int = 500) -> gym.vector.VectorEnv:
    """``num_envs`` velocity-masked CartPole-v1 envs in gymnasium's vectorised implementation.

    The vector entry point steps all envs in one numpy call (NEXT_STEP autoreset, which
    splice's collector handles: the dead reset step never reaches the data).
    """
    env = gym.make_vec(
        "CartPole-v1",
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        max_episode_steps=max_episode_steps,
    )
    single = _masked_box(env.single_observation_space)  # type: ignore[arg-type]
    keep = list(KEPT)
    return TransformObservation(
        env,
        lambda obs: obs[:, keep].astype(np.float32),
        observation_space=batch_space(single, num_envs),
        single_observation_space=single,
    )


def greedy_returns(act: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` masked-CartPole episodes run side by side (capped at 500 steps).

    The evaluation every agent of :mod:`splice.examples` (and the sb3-contrib comparison in
    ``benchmarks/``) uses: env ``i`` is seeded ``seed + i``, all start together, and each
    episode's return counts until its first end. ``act`` maps the ``[episodes, 2]``
    observations of one step to ``episodes`` actions; it is called once per step, in order, so
    a recurrent agent carries its state in a closure (every episode starts on the first call).

    Examples:
        >>> always_left = lambda obs: np.zeros(len(obs), dtype=np.int64)
        >>> returns = greedy_returns(always_left, episodes=3, seed=0)
        >>> returns.shape, bool((returns < 20).all())
        ((3,), True)
    """
    env = make_masked_cartpole(episodes)
    try:
        obs, _ = env.reset(seed=seed)
        returns = np.zeros(episodes)
        alive = np.ones(episodes, dtype=bool)
        while alive.any():
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            returns += reward * alive
            alive &= ~(terminated | truncated)
        return returns
    finally:
        env.close()
