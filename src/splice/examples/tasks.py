"""Any gymnasium env with discrete actions, as vectorised envs with flat float observations.

The Q-networks of :mod:`splice.examples.qnets` read one float vector per step, so
:func:`make_task` turns every observation space gymnasium can flatten into one:
``Discrete(n)`` becomes a one-hot vector of length ``n``, ``MultiDiscrete`` and ``Tuple`` /
``Dict`` spaces the concatenation of their parts (gymnasium's ``FlattenObservation``), cast
to ``float32``. Parts of a Dict observation that cannot be flattened (MiniGrid's Text
``mission``) are dropped. (splice's collector stores Dict/Tuple/Discrete observations as they
are; the flattening is for the networks.)

``CartPole-v1`` runs in gymnasium's vectorised implementation, with its velocities removed
when asked (``mask_velocity=True``: the main job's default task). Ids of packages that
register their envs on import (``popgym-...``, ``MiniGrid-...``, ``ALE/...``) import that
package first; ``"module:EnvId"`` imports ``module``.

Examples:
    >>> from splice.examples.tasks import make_task
    >>> env = make_task("popgym-RepeatFirstEasy-v0", num_envs=2)
    >>> env.single_observation_space, env.single_action_space
    (Box(0.0, 1.0, (4,), float32), Discrete(4))
    >>> obs, _ = env.reset(seed=0)
    >>> obs  # one-hot card suits
    array([[0., 0., 0., 1.],
           [0., 0., 0., 1.]], dtype=float32)
    >>> env.close()
    >>> make_task("CartPole-v1", num_envs=2, mask_velocity=True).single_observation_space.shape
    (2,)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import DtypeObservation, FilterObservation, FlattenObservation

from splice.examples.masked_cartpole import make_masked_cartpole

__all__ = ["MASKABLE", "make_task", "task_dims"]

#: The env id whose velocities ``mask_velocity=True`` removes.
MASKABLE = "CartPole-v1"
#: Id prefixes of packages that register their envs when imported.
_REGISTERING_PACKAGES = {"popgym-": "popgym", "MiniGrid-": "minigrid", "ALE/": "ale_py"}


def make_task(
    env_id: str,
    num_envs: int,
    *,
    mask_velocity: bool = False,
    max_episode_steps: int | None = None,
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` with ``float32`` vector observations.

    Args:
        env_id: a registered gymnasium id (or ``"module:EnvId"``) with a ``Discrete`` action
            space.
        num_envs: envs stepped together.
        mask_velocity: drop CartPole's two velocities (``env_id`` must be ``"CartPole-v1"``).
        max_episode_steps: time limit; ``None`` keeps the env's own.

    Raises:
        ValueError: the id is unknown, its actions are not ``Discrete``, no part of its
            observations can be flattened, or ``mask_velocity`` is asked of another env.
    """
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a str, got {type(env_id).__name__}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if mask_velocity and env_id != MASKABLE:
        raise ValueError(
            f"mask_velocity applies to {MASKABLE} only, not {env_id!r} (for other partially "
            "observed tasks use their own ids, e.g. popgym-PositionOnlyCartPoleEasy-v0)"
        )
    limit: dict[str, Any] = {}
    if max_episode_steps is not None:
        limit["max_episode_steps"] = max_episode_steps
    if env_id == MASKABLE:
        if mask_velocity:
            return make_masked_cartpole(num_envs, **limit)
        return gym.make_vec(
            env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **limit
        )
    env_id = _register(env_id)
    probe = gym.make(env_id)
    try:
        kept = _flattenable_keys(env_id, probe.observation_space, probe.action_space)
    finally:
        probe.close()
    wrappers: list[Callable[[gym.Env[Any, Any]], gym.Wrapper[Any, Any, Any, Any]]] = [
        FlattenObservation,
        _float32,
    ]
    if kept is not None:
        wrappers.insert(0, partial(FilterObservation, filter_keys=kept))
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="sync", wrappers=wrappers, **limit
    )


def task_dims(env: gym.vector.VectorEnv) -> tuple[int, int]:
    """``(observation size, number of actions)`` of a :func:`make_task` env.

    Examples:
        >>> task_dims(make_task("CartPole-v1", num_envs=1, mask_velocity=True))
        (2, 2)
    """
    obs, act = env.single_observation_space, env.single_action_space
    assert isinstance(obs, gym.spaces.Box) and isinstance(act, gym.spaces.Discrete)
    return int(np.prod(obs.shape)), int(act.n)


def _register(env_id: str) -> str:
    """Import the package that registers ``env_id``; return the id without a module prefix."""
    module, sep, name = env_id.partition(":")
    if sep:
        importlib.import_module(module)
        env_id = name
    for prefix, package in _REGISTERING_PACKAGES.items():
        if env_id.startswith(prefix) and env_id not in gym.registry:
            try:
                importlib.import_module(package)
            except ImportError:
                raise ValueError(
                    f"env {env_id!r} needs the {package!r} package: pip install {package}"
                ) from None
    if env_id not in gym.registry:
        raise ValueError(f"unknown gymnasium env id {env_id!r}")
    return env_id


def _flattenable_keys(env_id: str, obs: gym.Space[Any], act: gym.Space[Any]) -> list[str] | None:
    """Check the spaces; for a Dict observation with parts that cannot be flattened (a Text
    mission), the keys to keep, else ``None``."""
    if not isinstance(act, gym.spaces.Discrete):
        raise ValueError(f"env {env_id!r}: actions must be Discrete, got {act}")
    parts = obs.spaces if isinstance(obs, gym.spaces.Dict) else {"": obs}
    kept = [key for key, space in parts.items() if _flattenable(space)]
    if not kept:
        raise ValueError(
            f"env {env_id!r}: observation space {obs} cannot be flattened into a vector"
        )
    return kept if len(kept) < len(parts) else None


def _flattenable(space: gym.Space[Any]) -> bool:
    try:
        gym.spaces.flatten_space(space)
    except NotImplementedError:
        return False
    return True


def _float32(env: gym.Env[Any, Any]) -> gym.Wrapper[Any, Any, Any, Any]:
    return DtypeObservation(env, np.float32)
