"""Environment adapters: gymnasium ``Env`` and ``VectorEnv`` (all autoreset modes) as one
normalized step stream for the collector loop (see :class:`~splice.envs.EnvAdapter`).

Examples:
    >>> from splice.envs import make_adapter
    >>> adapter = make_adapter("CartPole-v1", num_envs=4)
    >>> adapter.num_envs, adapter.autoreset_mode
    (4, 'NextStep')
    >>> adapter.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, VectorEnv

from splice.envs._workers import WorkerWatch
from splice.envs.base import EnvAdapter, StepTargets
from splice.envs.errors import EnvError, EnvWorkerError
from splice.envs.gym_env import GymEnvAdapter
from splice.envs.gym_vector import (
    DisabledVectorAdapter,
    NextStepVectorAdapter,
    SameStepVectorAdapter,
    autoreset_mode_of,
    refuse_async,
)
from splice.envs.infos import EPISODE_STATISTICS, InfoKey
from splice.envs.pettingzoo import PettingZooEnvs, is_pettingzoo, make_agents_adapter

__all__ = [
    "EPISODE_STATISTICS",
    "EnvAdapter",
    "EnvError",
    "EnvLike",
    "EnvWorkerError",
    "InfoKey",
    "PettingZooEnvs",
    "StepTargets",
    "make_adapter",
]

#: What collectors take as ``env`` (see :func:`make_adapter`); PettingZoo envs (and lists of
#: them) too, typed ``Any`` here as PettingZoo is optional.
EnvLike = (
    gym.Env[Any, Any] | VectorEnv[Any, Any, Any] | PettingZooEnvs | Callable[[], Any] | str | Any
)


def make_adapter(
    env: EnvLike,
    *,
    num_envs: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> EnvAdapter:
    """Wrap ``env`` in the adapter that fits it.

    An ``AsyncVectorEnv`` is wrapped in :class:`WorkerWatch`: if one of its worker processes
    dies, the collector gets an :class:`EnvWorkerError` naming it, and the env is closed with
    its other workers ended.

    Args:
        env: a ``gymnasium.Env``; a ``gymnasium.vector.VectorEnv`` (any autoreset mode); a
            PettingZoo env, a list of copies, or
            :class:`~splice.envs.pettingzoo.PettingZooEnvs` (rows are agent slots:
            :mod:`splice.envs.pettingzoo`); a zero-argument callable returning one of these;
            or an env id string.
        num_envs: with an env id: ``None`` makes one env (``gymnasium.make``), an int makes a
            vector env (``gymnasium.make_vec`` with its default vectorization mode).
        env_kwargs: keyword arguments for ``gymnasium.make``/``make_vec`` (env id only).

    Raises:
        TypeError: ``env`` is none of the above, ``num_envs``/``env_kwargs`` are given with
            an env object, or ``num_envs`` is not an int (a bool included).
        ValueError: a vector env with an unknown autoreset mode, a non-positive ``num_envs``,
            an envpool env in async mode (``batch_size < num_envs``), or a SuperSuit vector
            env (pass the PettingZoo env instead).

    Examples:
        >>> import gymnasium as gym
        >>> make_adapter(lambda: gym.make("CartPole-v1")).batched
        False
        >>> vec = gym.make_vec(
        ...     "CartPole-v1", num_envs=2, vectorization_mode="sync",
        ...     vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        ... )
        >>> type(make_adapter(vec)).__name__
        'SameStepVectorAdapter'
    """
    if isinstance(env, str):
        kwargs = dict(env_kwargs or {})
        if num_envs is None:
            return make_adapter(gym.make(env, **kwargs))
        if isinstance(num_envs, bool) or not isinstance(num_envs, int):
            raise TypeError(f"num_envs must be an int, got {type(num_envs).__name__} {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        return make_adapter(gym.make_vec(env, num_envs=num_envs, **kwargs))
    if num_envs is not None or env_kwargs is not None:
        raise TypeError(
            "num_envs and env_kwargs only apply to an env id string; got them with "
            f"{type(env).__name__}"
        )
    if is_pettingzoo(env):
        return make_agents_adapter(env)
    refuse_async(env)
    if isinstance(env, VectorEnv):
        _refuse_supersuit(env)
        if isinstance(env.unwrapped, AsyncVectorEnv) and not isinstance(env, WorkerWatch):
            env = WorkerWatch(env)  # a dead worker: a clear error, the others ended
        mode = autoreset_mode_of(env)
        if mode == AutoresetMode.NEXT_STEP:
            return NextStepVectorAdapter(env)
        if mode == AutoresetMode.SAME_STEP:
            return SameStepVectorAdapter(env)
        return DisabledVectorAdapter(env)
    if isinstance(env, gym.Env):
        return GymEnvAdapter(env)
    if callable(env):
        made = env()
        if not isinstance(made, gym.Env | VectorEnv) and not is_pettingzoo(made):
            raise TypeError(
                f"the env factory returned {type(made).__name__}; expected a gymnasium.Env, a "
                "gymnasium.vector.VectorEnv or a PettingZoo env (a ParallelEnv or AECEnv, a "
                "list of copies, or splice.envs.pettingzoo.PettingZooEnvs)"
            )
        return make_adapter(made)
    raise TypeError(
        f"env must be a gymnasium.Env, a gymnasium.vector.VectorEnv, a PettingZoo env (a "
        "ParallelEnv or AECEnv, a list of copies, or splice.envs.pettingzoo.PettingZooEnvs), a "
        f"zero-argument callable returning one, or an env id string; got {type(env).__name__}"
    )


def _refuse_supersuit(env: Any) -> None:
    """Refuse SuperSuit's vector envs made from PettingZoo envs: one row per agent, but the
    agents' identities, deaths and the true final observations are lost on the way."""
    kind = type(getattr(env, "unwrapped", env))
    if kind.__module__.startswith("supersuit."):
        raise ValueError(
            f"{kind.__name__} is a SuperSuit vector env: it loses which agent each row is, "
            "fills dead agents' rows with zeros, and has no gymnasium autoreset mode. Pass "
            "the PettingZoo env itself (copies: splice.envs.pettingzoo.PettingZooEnvs(make_env, "
            "num_envs=N)); rows are then agent slots, one trajectory per agent life"
        )
