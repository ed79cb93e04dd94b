"""Adapters for gymnasium ``VectorEnv``: one per autoreset mode, same step stream out.

* NEXT_STEP (gymnasium's default): the step after an episode's end is a *dead* reset step —
  the env ignores the action and only returns the reset observation. The adapter reports it
  (``dead_steps = True``) and the collector loop drops it, so it never reaches the data. The
  observation returned at the end is the true final one.
* SAME_STEP: the env resets inside the ending step and returns the reset observation; the true
  final observation is taken from ``infos["final_obs"]``.
* DISABLED: the adapter resets the finished envs itself with
  ``reset(options={"reset_mask": done})``.

Works for ``SyncVectorEnv``, ``AsyncVectorEnv``, vector entry points such as
``gymnasium.make_vec("CartPole-v1", num_envs=1024, vectorization_mode="vector_entry_point")``,
vector wrappers, and any env following the ``VectorEnv`` API (envpool included).

Examples:
    >>> import gymnasium as gym
    >>> from splice.envs import make_adapter
    >>> env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    >>> adapter = make_adapter(env)
    >>> type(adapter).__name__, adapter.num_envs, adapter.dead_steps
    ('NextStepVectorAdapter', 3, True)
    >>> adapter.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space

from splice.envs.base import EnvAdapter, EnvError

__all__ = [
    "DisabledVectorAdapter",
    "GymVectorAdapter",
    "NextStepVectorAdapter",
    "SameStepVectorAdapter",
    "autoreset_mode_of",
    "refuse_async",
]


def refuse_async(env: Any) -> None:
    """Refuse an envpool env in async mode (``batch_size < num_envs``): each of its steps
    returns a different subset of envs (``info["env_id"]``), which a ``[B, T]`` batch of
    fixed env rows cannot hold. Make it with ``batch_size == num_envs`` (the default).

    Raises:
        ValueError: naming async mode and both sizes.

    Examples:
        >>> class AsyncPool:  # envpool's attributes
        ...     is_async = True
        ...     config = {"num_envs": 8, "batch_size": 4}
        >>> refuse_async(AsyncPool())
        Traceback (most recent call last):
        ...
        ValueError: AsyncPool is an envpool env in async mode (batch_size=4 < num_envs=8): ...
    """
    for candidate in (env, getattr(env, "unwrapped", env)):
        config = getattr(candidate, "config", None)
        sizes = (
            (config.get("num_envs"), config.get("batch_size")) if isinstance(config, dict) else ()
        )
        is_async = getattr(candidate, "is_async", False) is True or (
            len(sizes) == 2 and isinstance(sizes[1], int) and 0 < sizes[1] < (sizes[0] or 0)
        )
        if is_async:
            num_envs, batch_size = sizes or (None, None)
            raise ValueError(
                f"{type(env).__name__} is an envpool env in async mode (batch_size={batch_size} "
                f"< num_envs={num_envs}): each step returns a different subset of envs, which "
                "the collector does not support; make it with batch_size equal to num_envs "
                "(envpool's default)"
            )


def autoreset_mode_of(env: VectorEnv[Any, Any, Any]) -> AutoresetMode:
    """The autoreset mode a vector env declares in ``metadata["autoreset_mode"]``.

    Raises:
        ValueError: the env declares none, or an unknown one.

    Examples:
        >>> import gymnasium as gym
        >>> autoreset_mode_of(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"))
        <AutoresetMode.NEXT_STEP: 'NextStep'>
    """
    mode = (getattr(env, "metadata", None) or {}).get("autoreset_mode")
    if mode is None:
        mode = getattr(env, "autoreset_mode", None)
    if mode is None:
        raise ValueError(
            f"cannot tell the autoreset mode of {type(env).__name__}: it has no "
            "metadata['autoreset_mode']; set it to a gymnasium.vector.AutoresetMode "
            "(NEXT_STEP, SAME_STEP or DISABLED)"
        )
    try:
        return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)
    except ValueError:
        raise ValueError(
            f"{type(env).__name__} declares autoreset mode {mode!r}, which the collector does "
            f"not know; supported: {[m.value for m in AutoresetMode]}"
        ) from None


class GymVectorAdapter(EnvAdapter):
    """Shared part of the vector adapters (see the module docstring).

    Args:
        env: the vector env.
    """

    def __init__(self, env: VectorEnv[Any, Any, Any]) -> None:
        self.env = env
        self.num_envs = int(env.num_envs)
        self.batched = True
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        mode = autoreset_mode_of(env)
        self.autoreset_mode = mode.value
        self.dead_steps = mode == AutoresetMode.NEXT_STEP
        self.supports_partial_reset = mode == AutoresetMode.DISABLED or isinstance(
            env.unwrapped, SyncVectorEnv | AsyncVectorEnv
        )
        self._init_spaces()
        # Our own batched action space: envpool's ``action_space`` is the single-env space,
        # and sampling from a private copy leaves the env's own RNG streams untouched.
        self.random_action_space = batch_space(self.single_action_space, self.num_envs)
        self._step = env.step
        self._no_end = bytes(self.num_envs)  # the bytes of B False flags

    def reset(self, seed: int | None = None) -> None:
        obs, info = self.env.reset(seed=seed)
        self._check_obs(obs, "reset()")
        self.obs = self._obs_values(obs) + self._read_info(info, "reset()")
        self.check_next = True

    def reset_envs(self, mask: np.ndarray) -> None:
        if not self.supports_partial_reset:
            raise RuntimeError(
                f"{type(self.env).__name__} cannot reset a subset of its envs "
                f"(autoreset mode {self.autoreset_mode})"
            )
        mask = np.asarray(mask, dtype=np.bool_)
        entering_info = self.obs[len(self.obs_leaves) :]
        obs, info = self.env.reset(options={"reset_mask": mask})
        self.obs = self._obs_values(obs) + self._merge_reset_info(entering_info, info, mask)

    def _merge_reset_info(self, values: list[Any], info: Any, mask: np.ndarray) -> list[Any]:
        """``values`` (info leaves of every env) with the rows of the envs in ``mask`` taken
        from ``info``, the info of a ``reset(options={"reset_mask": mask})``."""
        if not self.infos.keys:
            return []
        rows = np.flatnonzero(mask)
        merged = []
        for value, fresh in zip(values, self.infos.read_rows(info, rows, "reset()"), strict=True):
            value = np.array(value, copy=True)
            value[rows] = fresh
            merged.append(value)
        return merged

    def _read_step(self, action: Any, c: int) -> np.ndarray | None:
        """Step the env and write the results at column ``c``; return the mask of envs whose
        episode ended, or None if none did."""
        obs, reward, terminated, truncated, info = self._step(action)
        check = self.check_next
        if check:
            self._check_step(obs, reward, terminated, truncated)
        self._last_info = info
        values = self._write_next_obs(obs, c)
        if self._reads_info:
            values += self._read_next_info(info, c, check)
        self.obs = values
        self._reward[c] = reward
        # The flags are False at c unless written (StepTargets): nothing to write when every
        # env goes on (all-zero bool flags compare as bytes, far cheaper than a numpy reduction)
        try:
            if terminated.tobytes() == self._no_end and truncated.tobytes() == self._no_end:
                return None
        except AttributeError:  # flags that are not numpy arrays: counted below
            pass
        self._terminated[c] = terminated
        self._truncated[c] = truncated
        if np.count_nonzero(terminated) or np.count_nonzero(truncated):
            return terminated | truncated
        return None


class NextStepVectorAdapter(GymVectorAdapter):
    """NEXT_STEP autoreset: reports the dead reset step that follows every episode end."""

    def __init__(self, env: VectorEnv[Any, Any, Any]) -> None:
        super().__init__(env)
        self._ended: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._ended = None

    def reset_envs(self, mask: np.ndarray) -> None:
        super().reset_envs(mask)
        if self._ended is not None:  # a reset env has no pending autoreset any more
            self._ended = self._ended & ~mask
            if not self._ended.any():
                self._ended = None

    def step(self, action: Any, c: int) -> np.ndarray | None:
        ended = self._read_step(action, c)
        # The observation entering the next step is the one just written to staging: read it
        # from there (C-contiguous) rather than from the env's array, which vector entry points
        # return transposed (copying that twice per step costs more than the physics).
        self.obs = [arr[c] for arr in self._next_inputs]
        dead = self._ended  # envs that ended last step: this step was their reset
        self._ended = ended  # a dead step never reports an end
        return dead


class SameStepVectorAdapter(GymVectorAdapter):
    """SAME_STEP autoreset: patches in the true final observation from ``infos["final_obs"]``."""

    def step(self, action: Any, c: int) -> np.ndarray | None:
        ended = self._read_step(action, c)
        if ended is None:
            return None
        info = self._last_info
        final = info.get("final_obs")
        if final is None:
            raise EnvError(
                f"{type(self.env).__name__} (SAME_STEP autoreset) ended episodes at env(s) "
                f"{np.flatnonzero(ended).tolist()} but gave no infos['final_obs']: the true "
                "final observation is lost"
            )
        rows = np.flatnonzero(ended)
        for r in rows:
            for arr, value in zip(self._next_obs, self._flatten(final[r]), strict=True):
                arr[c, r] = value
        if self.infos.keys:
            # The info of the final step, not the reset's (which is what info[key] holds).
            final_info = info.get("final_info", {})
            values = self.infos.read_rows(final_info, rows, "step() (infos['final_info'])")
            for arr, value in zip(self._next_info, values, strict=True):
                arr[c, rows] = value
        return ended


class DisabledVectorAdapter(GymVectorAdapter):
    """DISABLED autoreset: resets the finished envs with ``reset(options={"reset_mask": ...})``."""

    def step(self, action: Any, c: int) -> np.ndarray | None:
        ended = self._read_step(action, c)
        if ended is None:
            return None
        entering_info = self.obs[len(self.obs_leaves) :]
        obs, info = self.env.reset(options={"reset_mask": ended})
        self.obs = self._obs_values(obs) + self._merge_reset_info(entering_info, info, ended)
        return ended
