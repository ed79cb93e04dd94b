"""The single-process collection loop: policy ⇄ env, writing each step in place.

:class:`RolloutLoop` is the engine every collector reuses (the plain :class:`~splice.Collector`
today; multi-process and Ray workers later): ``loop.collect()`` returns one ``[B, T]`` batch
(``[T]`` for a single env) that follows the data contract.

How a batch is made (performance rules, DESIGN.md §3):

* The per-step results are written into preallocated *time-major* numpy staging arrays
  ``[C, B, ...]`` (a column per vector step; ``C >= T`` grows if ever needed). No TensorDict
  and no Python object per env is built per step; a TensorDict policy gets ONE reused step
  TensorDict (:class:`~splice.policies.PolicyRunner`).
* Trajectory ids, ``done``, the cut mark and episode statistics are computed once per batch,
  vectorized, not per step.
* Gymnasium's NEXT_STEP autoreset inserts a *dead* reset step after each episode; its column is
  marked invalid for that env and never reaches the data. The loop steps the vector env until
  every env row holds ``T`` valid steps ("top up"); rows that got more keep their surplus
  steps in staging as the start of the next batch ("carry over"). Nothing is lost.
* Each batch is copied out of staging into fresh tensors, so a yielded batch is never
  overwritten by later collection.

Trajectory ids are drawn when a batch is finalized, in order of episode start (time step, then
env row). Because time here is each env's own (valid) step count, the three autoreset modes give
the same ids, and the same batches, for the same seeds and a deterministic policy.

Examples:
    >>> import gymnasium as gym
    >>> from splice.collectors.ids import TrajectoryIds
    >>> from splice.collectors.rollout import RolloutLoop
    >>> from splice.envs import make_adapter
    >>> env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    >>> ids = TrajectoryIds(worker_id=7)
    >>> loop = RolloutLoop(make_adapter(env), None, steps=50, ids=ids, seed=0)
    >>> batch = loop.collect()
    >>> batch.batch_size
    torch.Size([4, 50])
    >>> bool(batch["is_init"][:, 0].all())  # fresh episodes at the start
    True
    >>> loop.close()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from splice.collectors.ids import TrajectoryIds
from splice.envs import EnvAdapter, Staging
from splice.layout import (
    ACTION,
    CUT,
    DONE,
    IS_INIT,
    NEXT,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
)
from splice.policies import PolicyRunner

__all__ = ["EpisodeStats", "RolloutLoop"]

Key = tuple[str, ...]


@dataclass
class EpisodeStats:
    """Episodes that ended (by the env or ``max_frames_per_traj``) in the last batch.

    Args:
        returns: undiscounted return of each episode (float64).
        lengths: number of steps of each episode.
    """

    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class RolloutLoop:
    """Steps a policy and an env adapter, and returns one batch per :meth:`collect` call.

    Args:
        adapter: the env adapter (:func:`splice.envs.make_adapter`).
        policy: a TensorDict policy, or ``None`` for uniform random actions from the action
            space (sampled in numpy, no TensorDict involved).
        steps: ``T``, the time steps of every batch.
        ids: where trajectory ids come from.
        max_frames_per_traj: truncate episodes at this many steps (``truncated=True``, the env
            is reset, a new id starts); needs an env that can reset a subset of its envs.
        set_truncated: also set ``truncated`` and ``done`` on the cut last step of each row
            (TorchRL's ``set_truncated``); ``("collector", "cut")`` stays True there.
        seed: seeds the first reset and the random actions.
        device: where the policy runs (``None``: CPU).
        storing_device: where batches are returned (``None``: CPU).
        track_episodes: compute ``episodes`` (returns and lengths) for every batch.

    Raises:
        ValueError: ``steps < 1``, a bad ``max_frames_per_traj``, or ``max_frames_per_traj``
            with an env that cannot reset a subset of its envs.

    Examples:
        >>> import gymnasium as gym
        >>> from splice.envs import make_adapter
        >>> loop = RolloutLoop(
        ...     make_adapter(gym.make("CartPole-v1")), None, steps=30,
        ...     ids=TrajectoryIds(worker_id=8), max_frames_per_traj=10, seed=0,
        ... )
        >>> batch = loop.collect()
        >>> batch.batch_size, int(batch["next", "truncated"].sum()) >= 1
        (torch.Size([30]), True)
        >>> loop.close()
    """

    def __init__(
        self,
        adapter: EnvAdapter,
        policy: Callable[[TensorDictBase], TensorDictBase] | None,
        *,
        steps: int,
        ids: TrajectoryIds,
        max_frames_per_traj: int | None = None,
        set_truncated: bool = False,
        seed: int | None = None,
        device: torch.device | str | None = None,
        storing_device: torch.device | str | None = None,
        track_episodes: bool = False,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if max_frames_per_traj is not None:
            if isinstance(max_frames_per_traj, bool) or max_frames_per_traj < 1:
                raise ValueError(
                    f"max_frames_per_traj must be a positive int, got {max_frames_per_traj!r}"
                )
            if not adapter.supports_partial_reset:
                raise ValueError(
                    f"max_frames_per_traj needs an env that can reset a subset of its envs; "
                    f"{type(adapter.env).__name__} (autoreset mode {adapter.autoreset_mode}) "
                    "cannot. "
                    "Use the env's own time limit (e.g. max_episode_steps=...) instead"
                )
        self.adapter = adapter
        self.steps = steps
        self.ids = ids
        self.max_frames_per_traj = max_frames_per_traj
        self.set_truncated = set_truncated
        self.storing_device = None if storing_device is None else torch.device(storing_device)
        self.track_episodes = track_episodes
        self.episodes = EpisodeStats()
        self._seed = seed
        b = adapter.num_envs
        self._b = b
        self._capacity = steps + max(8, steps // 4)
        self._arrays: dict[Key, np.ndarray] = {}
        self._obs_keys: list[Key] = [(OBSERVATION, *leaf.key) for leaf in adapter.obs_leaves]
        self._next_obs_keys: list[Key] = [(NEXT, *k) for k in self._obs_keys]
        for key, leaf in zip(self._obs_keys, adapter.obs_leaves, strict=True):
            self._allocate(key, leaf.shape, leaf.dtype)
        for key, leaf in zip(self._next_obs_keys, adapter.obs_leaves, strict=True):
            self._allocate(key, leaf.shape, leaf.dtype)
        self._allocate(REWARD, (), np.dtype(np.float32))
        self._allocate(TERMINATED, (), np.dtype(np.bool_))
        self._allocate(TRUNCATED, (), np.dtype(np.bool_))
        self._allocate((IS_INIT,), (), np.dtype(np.bool_))
        act = adapter.act_leaf
        self._allocate((ACTION,), act.shape, act.dtype)
        # True where a column is not a step of that env (a NEXT_STEP dead reset step, or a
        # hole left by carry-over); False beyond the last written column.
        self._dead = np.zeros((self._capacity, b), np.bool_)
        self.adapter = adapter
        self._bind_adapter()
        self.runner: PolicyRunner | None = None
        if policy is not None:
            self.runner = PolicyRunner(
                policy,
                adapter.obs_leaves,
                act,
                num_envs=b,
                batched=adapter.batched,
                allocate=self._allocate,
                device=device,
            )
        self._no_init = np.zeros(b, np.bool_)
        self._all_init = np.ones(b, np.bool_)
        self._started = False
        self._c = 0
        self._holes = np.zeros(b, np.int64)
        self._init_now = self._all_init
        self._row_ids = np.full(b, -1, np.int64)
        self._ep_len = np.zeros(b, np.int64)
        self._carry_return = np.zeros(b, np.float64)
        self._carry_length = np.zeros(b, np.int64)

    # ------------------------------------------------------------------ staging
    def _allocate(self, key: Key, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        existing = self._arrays.get(key)
        if existing is not None:
            if existing.shape[2:] != tuple(shape) or existing.dtype != dtype:
                raise ValueError(
                    f"key {key!r} is written twice with different layouts: "
                    f"{list(existing.shape[2:])} {existing.dtype} vs {list(shape)} {dtype}"
                )
            return self._view(existing)
        arr = np.zeros((self._capacity, self._b, *shape), dtype)
        self._arrays[key] = arr
        return self._view(arr)

    def _view(self, arr: np.ndarray) -> np.ndarray:
        # A single env writes through [C, ...] views of its [C, 1, ...] staging: a scalar
        # write into a 1-D view is ~8x cheaper than a broadcast into a [1] row.
        return arr if self.adapter.batched else arr[:, 0]

    def _bind_adapter(self) -> None:
        a, v = self._arrays, self._view
        self.adapter.bind(
            Staging(
                next_obs=[v(a[k]) for k in self._next_obs_keys],
                reward=v(a[REWARD]),
                terminated=v(a[TERMINATED]),
                truncated=v(a[TRUNCATED]),
            )
        )

    def _grow(self, used: int) -> None:
        """Double the staging capacity (rare: only when NEXT_STEP surplus piles up)."""
        capacity = 2 * self._capacity
        for key, old in list(self._arrays.items()):
            new = np.zeros((capacity, *old.shape[1:]), old.dtype)
            new[:used] = old[:used]
            self._arrays[key] = new
        dead = np.zeros((capacity, self._b), np.bool_)
        dead[:used] = self._dead[:used]
        self._dead = dead
        self._capacity = capacity
        self._bind_adapter()
        if self.runner is not None and self.runner.discovered:
            self.runner.rebind({k: self._view(a) for k, a in self._arrays.items()})

    # -------------------------------------------------------------------- state
    @property
    def num_envs(self) -> int:
        """``B``."""
        return self._b

    @property
    def frames_per_batch(self) -> int:
        """The frames in every batch, ``B * T``."""
        return self._b * self.steps

    def restart(self, seed: int | None = None) -> None:
        """Forget everything in flight: the next :meth:`collect` resets every env and starts new
        episodes (new ids), with no carried-over steps; with ``seed``, that reset and the
        random actions are seeded."""
        if seed is not None:
            self._seed = seed
        self._started = False

    def reset_envs(self) -> None:
        """Reset every env now; the episodes in flight end with a cut, new ones start (new ids).

        Steps already collected but not yet returned (NEXT_STEP surplus) are kept: they come
        first in the next batch.
        """
        if not self._started:
            return
        self.adapter.reset(None)
        self._init_now = self._all_init
        self._ep_len[:] = 0
        if self.runner is not None:
            self.runner.reset_state()

    def _start(self) -> None:
        self.adapter.reset(self._seed)
        self.adapter.seed_actions(self._seed)
        self._seed = None  # only the very first reset is seeded; later ones continue the RNG
        self._c = 0
        self._holes[:] = 0
        self._dead[:] = False
        self._init_now = self._all_init
        self._row_ids[:] = -1
        self._ep_len[:] = 0
        self._carry_return[:] = 0
        self._carry_length[:] = 0
        if self.runner is not None:
            self.runner.reset_state()
        self._started = True

    # ------------------------------------------------------------------ collect
    def collect(self, *, random_actions: bool = False) -> TensorDict:
        """Collect one batch.

        Args:
            random_actions: use uniform random actions for this batch even if there is a
                policy (``init_random_frames``). Policy outputs are zero in such a batch.

        Returns:
            A ``[B, T]`` TensorDict (``[T]`` for a single env) following the data contract.

        If the policy or the env raises, the exception propagates and the next call starts
        over: every env is reset and new episodes (new ids) begin.
        """
        if not self._started:
            self._start()
        adapter = self.adapter
        adapter.check_next = True
        runner = self.runner
        use_random = runner is None or random_actions
        if runner is not None:
            if random_actions:
                self._prepare_random_batch(runner)
            else:
                runner.check_next_action()
        try:
            with torch.no_grad():
                self._run(use_random)
            return self._finalize(random_batch=runner is not None and random_actions)
        except BaseException:
            # A policy or env error mid-batch leaves staging half written: start over (fresh
            # episodes, new ids) if the caller collects again.
            self._started = False
            raise

    def _prepare_random_batch(self, runner: PolicyRunner) -> None:
        if not runner.discovered:
            # One call to learn the policy's output keys, so every batch has the same keys.
            with torch.no_grad():
                runner.step(self.adapter.obs, self._init_now, self._c)
            runner.reset_state()
        for _, arr in self._policy_arrays(runner):
            arr[self._c :] = 0

    def _policy_arrays(self, runner: PolicyRunner) -> list[tuple[Key, np.ndarray]]:
        keys = [key for key, _ in runner.outputs]
        keys += runner.state_keys + [(NEXT, *k) for k in runner.state_keys]
        return [(k, self._arrays[k]) for k in keys]

    def _run(self, use_random: bool) -> None:
        # The hot loop: numpy writes into preallocated staging only (no per-step TensorDict,
        # no per-env Python objects); everything per batch happens in _finalize.
        adapter = self.adapter
        runner = self.runner
        steps = self.steps
        c = self._c
        first = c
        target = steps + int(self._holes.max())
        dead_steps = adapter.dead_steps
        max_len = self.max_frames_per_traj
        ep_len = self._ep_len
        no_init = self._no_init
        init_now = self._init_now
        sample = adapter.action_sampler()
        env_step = adapter.step
        env_action = adapter.env_action
        obs_keys = self._obs_keys
        single_obs = len(obs_keys) == 1

        def bind_locals() -> tuple[
            list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray
        ]:
            a, v = self._arrays, self._view
            return (
                [v(a[k]) for k in obs_keys],
                v(a[obs_keys[0]]),
                a[(IS_INIT,)],  # [C, B] even for one env: init masks are [B] arrays
                v(a[(ACTION,)]),
                self._dead,
                v(a[TERMINATED]),
                v(a[TRUNCATED]),
            )

        obs_stage, obs_stage0, init_stage, action_stage, dead, term_stage, trunc_stage = (
            bind_locals()
        )
        while c < target:
            if c == self._capacity:
                self._grow(c)
                obs_stage, obs_stage0, init_stage, action_stage, dead, term_stage, trunc_stage = (
                    bind_locals()
                )
            obs = adapter.obs
            init_stage[c] = init_now
            if single_obs:
                obs_stage0[c] = obs[0]
            else:
                for arr, value in zip(obs_stage, obs, strict=True):
                    arr[c] = value
            if use_random:
                action = sample()
                action_stage[c] = action
            else:
                assert runner is not None
                action = env_action(runner.step(obs, init_now, c))
            if max_len is not None:
                if init_now is not no_init:
                    ep_len[init_now] = 0
                ep_len += 1
            restarted = env_step(action, c)
            if dead_steps and restarted is not None:
                dead[c] = restarted  # a dead reset step: never part of the data
            if max_len is not None:
                restarted = self._truncate_long(restarted, c, term_stage, trunc_stage)
            init_now = no_init if restarted is None else restarted
            c += 1
            if c == target and dead_steps:
                # Top up: rows that lost steps need more columns. Counted here, once the
                # planned columns are done, rather than at every step.
                holes = self._holes + np.count_nonzero(dead[first:c], axis=0)
                target = steps + int(holes.max())
        if dead_steps:
            self._holes = self._holes + np.count_nonzero(self._dead[first:c], axis=0)
        self._c = c
        self._init_now = init_now

    def _truncate_long(
        self, restarted: np.ndarray | None, c: int, term_stage: np.ndarray, trunc_stage: np.ndarray
    ) -> np.ndarray | None:
        assert self.max_frames_per_traj is not None
        hit = self._ep_len >= self.max_frames_per_traj
        if not np.count_nonzero(hit):
            return restarted
        hit &= ~(term_stage[c] | trunc_stage[c])  # the env ended it already
        if restarted is not None:
            hit &= ~restarted
        if not np.count_nonzero(hit):
            return restarted
        if self.adapter.batched:
            trunc_stage[c][hit] = True
        else:
            trunc_stage[c] = True
        self.adapter.reset_envs(hit)
        return hit if restarted is None else (restarted | hit)

    # ----------------------------------------------------------------- finalize
    def _take(self, c: int) -> dict[Key, np.ndarray]:
        """Copy the first ``T`` valid steps of every env row out of staging, ``[B, T, ...]``;
        move the surplus to the front of staging for the next batch.

        Gathers use ``np.take`` on the ``[C * B, ...]`` view of each staging array with one
        flat index (several times faster than 2-D fancy indexing or a transposed copy)."""
        steps, b = self.steps, self._b
        arrays = self._arrays
        if not self.adapter.batched:  # one env, never any dead step
            out = {k: a[:steps].swapaxes(0, 1).copy() for k, a in arrays.items()}
            self._c = 0
            return out
        self.adapter.detach_obs()  # it may view a staging row that is about to move
        if c == steps and not self._holes.any():
            flat = (np.arange(steps)[None, :] * b + np.arange(b)[:, None]).ravel()
            self._c = 0
            return {k: self._gather(a, flat, (b, steps)) for k, a in arrays.items()}
        # Env-major and C-contiguous, so the running count runs along contiguous rows (a
        # cumsum along strided rows is ~5x slower at 1024 envs).
        valid = np.ascontiguousarray(~self._dead[:c].T)  # [B, c]
        count_dtype = np.int16 if c < 2**15 else np.int64
        count: np.ndarray[Any, np.dtype[np.signedinteger[Any]]] = np.cumsum(
            valid.view(np.int8), axis=1, dtype=count_dtype
        )
        staging_row = np.arange(c)[None, :] * b + np.arange(b)[:, None]  # [B, c]: t * B + b
        flat = staging_row[valid & (count <= steps)]  # env-major, time order within a row
        out = {k: self._gather(a, flat, (b, steps)) for k, a in arrays.items()}
        n_surplus = count[:, -1].astype(np.int64) - steps
        # Carry over: every row's surplus lies after its T-th valid step, so the column block
        # [lo, c) holds all of it. Move that block to the front (a memmove, no gather) and mark
        # the steps in it that were just taken as invalid: they become holes.
        lo = int(np.argmax(count >= steps, axis=1).min()) + 1
        width = c - lo
        if width:
            for a in arrays.values():
                a[:width] = a[lo:c]
            self._dead[:width] = ~(valid[:, lo:c] & (count[:, lo:c] > steps)).T
        self._dead[width:c] = False
        self._holes = (width - n_surplus).astype(np.int64)
        self._c = width
        return out

    @staticmethod
    def _gather(a: np.ndarray, flat: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        rows = a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])
        return np.take(rows, flat, axis=0).reshape(*shape, *a.shape[2:])

    def _finalize(self, *, random_batch: bool) -> TensorDict:
        c = self._c
        out = self._take(c)
        b, steps = self._b, self.steps
        is_init = out[(IS_INIT,)]
        terminated = out[TERMINATED]
        truncated = out[TRUNCATED]
        done = terminated | truncated

        traj_ids = self._trajectory_ids(is_init)
        self._row_ids = traj_ids[:, -1].copy()

        cut = np.zeros((b, steps), np.bool_)
        cut[:, -1] = ~done[:, -1]  # the episode goes on in the next batch, same id
        if self.set_truncated:
            truncated[:, -1] |= cut[:, -1]
            done = done | cut
        if self.track_episodes:
            start = np.where(is_init, np.arange(steps)[None, :], -1)  # latest start, or -1
            np.maximum.accumulate(start, axis=1, out=start)
            self._episode_stats(out[REWARD], start, done & ~cut, cut)
        if random_batch and self.runner is not None:
            for key, _ in self._policy_arrays(self.runner):
                out[key][...] = 0

        squeeze = not self.adapter.batched

        def tensor(x: np.ndarray, *, flag: bool = False) -> torch.Tensor:
            t = torch.from_numpy(x[0] if squeeze else x)
            return t.unsqueeze(-1) if flag else t

        entries: dict[Any, torch.Tensor] = {}
        for key, value in out.items():
            if key in (TERMINATED, TRUNCATED):
                continue
            flag = key in (REWARD, (IS_INIT,))
            entries[key] = tensor(value, flag=flag)
        entries[TERMINATED] = tensor(terminated, flag=True)
        entries[TRUNCATED] = tensor(truncated, flag=True)
        entries[DONE] = tensor(done, flag=True)
        entries[TRAJ_IDS] = tensor(traj_ids)
        entries[CUT] = tensor(cut)
        batch = TensorDict(entries, batch_size=[steps] if squeeze else [b, steps])
        if self.storing_device is not None and self.storing_device.type != "cpu":
            batch = batch.to(self.storing_device)
        return batch

    def _trajectory_ids(self, is_init: np.ndarray) -> np.ndarray:
        """``[B, T]`` ids: fresh ids for the episodes starting in this batch, issued in order
        of (time step, env row); the steps before a row's first start continue its last id.

        Row-major segments of equal id start at every row's first step and at every episode
        start; one ``np.repeat`` fills them (~10x faster than a per-step gather at 1024 envs).
        """
        b, steps = is_init.shape
        begins = is_init.copy()
        begins[:, 0] = True
        seg = np.flatnonzero(begins)  # row-major positions, row * T + t
        seg_row, seg_t = np.divmod(seg, steps)
        starts = is_init.reshape(-1)[seg]
        issue_order = np.argsort(seg_t[starts] * b + seg_row[starts], kind="stable")
        fresh = np.empty(issue_order.size, np.int64)
        fresh[issue_order] = self.ids.take(issue_order.size)
        value = self._row_ids[seg_row]
        value[starts] = fresh
        return np.repeat(value, np.diff(seg, append=b * steps)).reshape(b, steps)

    def _episode_stats(
        self, reward: np.ndarray, start: np.ndarray, ended: np.ndarray, cut: np.ndarray
    ) -> None:
        steps = self.steps
        csum = np.cumsum(reward, axis=1, dtype=np.float64)
        before = np.where(
            start > 0, np.take_along_axis(csum, np.maximum(start - 1, 0), axis=1), 0.0
        )
        seg_return = csum - before
        seg_length = np.arange(1, steps + 1)[None, :] - np.maximum(start, 0)
        continuing = start < 0
        seg_return = seg_return + np.where(continuing, self._carry_return[:, None], 0.0)
        seg_length = seg_length + np.where(continuing, self._carry_length[:, None], 0)
        self.episodes = EpisodeStats(returns=seg_return[ended], lengths=seg_length[ended])
        last_open = ~ended[:, -1]
        self._carry_return = np.where(last_open, seg_return[:, -1], 0.0)
        self._carry_length = np.where(last_open, seg_length[:, -1], 0)

    def close(self) -> None:
        """Close the env."""
        self.adapter.close()
