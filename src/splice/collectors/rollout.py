"""The single-process collection loop: policy ⇄ env, writing each step in place.

:class:`RolloutLoop` is the engine every collector reuses (:class:`~splice.Collector` in this
process, and each worker of the multi-process and Ray collectors): ``loop.collect()`` returns
one ``[B, T]`` batch (``[T]`` for a single env) that follows the data contract.

Per step, the env adapter writes the env's results and this loop the observation, ``is_init``
and the policy's outputs (:class:`~splice.collectors._policy_step.PolicyStep`) into the staging
arrays owned by :class:`~splice.collectors._staging.Staging` (no TensorDict, no per-env Python
object per step). NEXT_STEP autoreset's dead reset steps never reach the data: the loop tops
rows up until each holds ``T`` valid steps and carries the surplus over. Each batch is copied
out of staging into fresh tensors, so a yielded batch is never overwritten, and labelled once
(ids, ``done``, the cut mark, episode statistics:
:class:`~splice.collectors._episodes.BatchLabeller`). The reasons are in ``docs/design.md``
("Hot loop", "Autoreset modes").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from splice._rng import seed_from_torch
from splice.collectors._episodes import BatchLabeller, EpisodeStats, TimeLimit
from splice.collectors._policy_step import PolicyStep
from splice.collectors._settings import LoopOptions, positive_int
from splice.collectors._staging import BATCH_KEYS, FLAG_KEYS, Staging
from splice.collectors.ids import TrajectoryIds
from splice.envs import EnvAdapter
from splice.envs.base import ITEM_ERRORS, item_writer, write_item
from splice.layout import ACTION, IS_INIT, TERMINATED, TRUNCATED, as_key_tuple
from splice.policies import as_policy

__all__ = ["EpisodeStats", "RolloutLoop"]


class RolloutLoop:
    """Steps a policy and an env adapter, and returns one batch per :meth:`collect` call.

    Args:
        adapter: the env adapter (:func:`splice.envs.make_adapter`).
        policy: anything :func:`splice.policies.as_policy` accepts (it is applied here), or
            ``None`` for uniform random actions from the action space (sampled in numpy, no
            TensorDict involved).
        steps: ``T``, the time steps of every batch.
        ids: where trajectory ids come from.
        options: the loop's options (:class:`~splice.collectors.LoopOptions`): time limit,
            ``set_truncated``, ``reset_at_each_iter``, episode statistics, info and excluded
            keys, devices; ``None``: the defaults.
        seed: seeds the first reset and the random actions.

    Raises:
        ValueError: ``steps < 1``, a bad ``options.max_frames_per_traj``, or a time limit with
            an env that cannot reset a subset of its envs; a bad ``exclude_keys`` or
            ``info_keys`` entry.
        TypeError: a ``policy`` :func:`~splice.policies.as_policy` does not accept.

    Examples:
        >>> import gymnasium as gym
        >>> from splice.collectors._settings import LoopOptions
        >>> from splice.collectors.ids import TrajectoryIds
        >>> from splice.envs import make_adapter
        >>> loop = RolloutLoop(
        ...     make_adapter(gym.make("CartPole-v1")), None, steps=30,
        ...     ids=TrajectoryIds(worker_id=8), options=LoopOptions(max_frames_per_traj=10),
        ...     seed=0,
        ... )
        >>> batch = loop.collect()
        >>> batch.batch_size, int(batch["next", "truncated"].sum()) >= 1
        (torch.Size([30]), True)
        >>> loop.close()
    """

    def __init__(
        self,
        adapter: EnvAdapter,
        policy: Any,
        *,
        steps: int,
        ids: TrajectoryIds,
        options: LoopOptions | None = None,
        seed: int | None = None,
    ) -> None:
        positive_int("steps", steps)
        options = LoopOptions() if options is None else options
        wrapped = as_policy(policy)
        self._policy = None if wrapped is None else adapter.wrap_policy(wrapped)
        adapter.select(
            exclude_keys=[as_key_tuple(k) for k in options.exclude_keys],
            info_keys=options.info_keys,
        )
        self.adapter = adapter
        self.steps = steps
        self.ids = ids
        #: The loop's options.
        self.options = options
        self.storing_device = (
            None if options.storing_device is None else torch.device(options.storing_device)
        )
        self.track_episodes = options.track_episodes
        #: The episodes that ended in the last batch (with ``track_episodes``).
        self.episodes = EpisodeStats()
        self._labeller = BatchLabeller(
            adapter.num_envs,
            ids,
            set_truncated=options.set_truncated,
            track_episodes=options.track_episodes,
        )
        self._seed = seed
        self.staging = Staging.for_env(adapter, steps)
        self._device = options.device
        #: Runs the policy; made at the first reset, once the info leaves are known.
        self.policy_step: PolicyStep | None = None
        self._bound_version = -1  # the staging version the adapter writes into
        b = adapter.num_envs
        self._no_init = np.zeros(b, np.bool_)
        self._all_init = np.ones(b, np.bool_)
        self._started = False
        self._actions_seeded = False
        self._init_now = self._all_init
        limit = options.max_frames_per_traj
        self._limit = None if limit is None else TimeLimit(adapter, limit)

    # -------------------------------------------------------------------- state
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
        if self._started:
            self._reset_all(None)

    def _reset_all(self, seed: int | None) -> None:
        """Reset every env: each starts an episode at its next step (``is_init``, which also
        restarts its :class:`TimeLimit` count and is all the :class:`BatchLabeller` needs),
        with a zero recurrent state."""
        self.adapter.reset(seed)
        self._init_now = self._all_init
        if self.policy_step is not None:
            self.policy_step.reset_state()

    def _start(self) -> None:
        adapter = self.adapter
        self._reset_all(self._seed)
        # Random actions are seeded now with ``seed``, else from torch's global RNG when first
        # needed (a collector with a policy never draws from it).
        self._actions_seeded = self._seed is not None
        if self._seed is not None:
            adapter.seed_actions(self._seed)
        self._seed = None  # only the very first reset is seeded; later ones continue the RNG
        self.staging.add_info(adapter.info_leaves)  # known from the first reset on
        if self._policy is not None and self.policy_step is None:
            self.policy_step = PolicyStep.for_env(self._policy, adapter, self._device)
        self._clear_staging()
        self._started = True

    def _clear_staging(self) -> None:
        """Forget the steps in staging at a (re)start."""
        self.staging.clear()

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
        try:
            self._collect_steps(random_actions)
            return self._finalize(random_batch=self.policy_step is not None and random_actions)
        except BaseException:
            # A policy or env error mid-batch leaves staging half written: start over (fresh
            # episodes, new ids) if the caller collects again.
            self._started = False
            raise

    def _collect_steps(self, random_actions: bool) -> None:
        """Step until staging holds the next batch (the caller restarts the loop if this
        raises)."""
        if not self._started:
            self._start()
        elif self.options.reset_at_each_iter:
            self._reset_all(None)  # the episodes in flight end with a cut, new ones start
        self.adapter.check_next = True
        policy_step = self.policy_step
        if policy_step is not None:
            if not random_actions:
                policy_step.check_next_action()
            elif not policy_step.discovered:  # every batch has the policy's keys
                for spec in policy_step.discover(self.adapter.obs, self._init_now):
                    self.staging.add(*spec)
        use_random = policy_step is None or random_actions
        if use_random and not self._actions_seeded:
            self.adapter.seed_actions(seed_from_torch())
            self._actions_seeded = True
        with torch.no_grad():
            self._run(use_random)

    def _run(self, use_random: bool) -> None:
        """Step until every env row holds ``T`` valid steps (making room in staging as
        needed: see :meth:`Staging.make_room`)."""
        staging, policy_step = self.staging, self.policy_step
        while True:
            target = staging.target()
            c = staging.used
            if c >= target:
                if not self._incomplete_in_batch():
                    return
                target = c + 1  # a step of the batch awaits its results: one more column
            if target > staging.capacity:
                self.adapter.detach_obs()  # it may view a staging column that is about to move
                base = staging.base
                staging.make_room(target - c)
                self.adapter.columns_moved(staging.base - base)
                continue
            if self._bound_version != staging.version:
                self.adapter.bind(staging.step_targets())
                self._bound_version = staging.version
            if use_random and policy_step is not None:  # random steps: no policy outputs
                staging.zero_from(policy_step.output_keys, c)
            stop = self._run_columns(c, target, use_random)
            staging.used = stop
            if self.adapter.dead_steps:
                # Rows that lost steps need more columns (top up). Counted once the planned
                # columns are done, rather than at every step.
                staging.pending_dead += staging.count_dead(c, stop)

    def _incomplete_in_batch(self) -> bool:
        """Whether a step of the next batch still awaits its results (a turn-based agent's
        step completes at its next turn: :meth:`EnvAdapter.incomplete`)."""
        waiting = self.adapter.incomplete()
        if waiting is None:
            return False
        rows = np.flatnonzero(waiting >= 0)
        return bool(rows.size) and bool((waiting[rows] < self.staging.span().stop[rows]).any())

    def _run_columns(self, c: int, stop: int, use_random: bool) -> int:
        """The hot loop: steps columns ``[c, stop)``. Writes go into preallocated staging only
        (no per-step TensorDict, no per-env Python objects); everything per batch happens in
        :meth:`_finalize`. Returns the next column."""
        adapter, staging, policy_step = self.adapter, self.staging, self.policy_step
        obs_cols = [staging.column(k) for k in staging.input_keys]
        init_col = staging.column((IS_INIT,))
        batched = adapter.batched  # one env: its init mask is [True], written as a scalar
        action_col = staging.column((ACTION,))
        dead, term_col = staging.dead, staging.column(TERMINATED)
        trunc_col = staging.column(TRUNCATED)
        out_cols = [staging.column(k) for k in policy_step.output_keys] if policy_step else []
        limit = self._limit
        no_init, init_now = self._no_init, self._init_now
        sample, env_action = adapter.action_sampler(), adapter.env_action
        env_step = adapter.step_function()
        dead_steps = adapter.dead_steps
        own_starts = dead_steps and not adapter.dead_step_restarts  # agent slots
        discovering = policy_step is not None and not use_random and not policy_step.discovered
        if discovering:
            stop = min(stop, c + 1)  # the first call reveals the outputs: stored below
        # The values entering a step are written where an episode starts (and at the first
        # column); elsewhere they are the previous step's next values, filled in afterwards.
        first = c
        init_col[c:stop] = False
        term_col[c:stop] = False  # an adapter may write only True flags (StepTargets)
        trunc_col[c:stop] = False
        for arr, value in zip(obs_cols, adapter.obs, strict=True):
            arr[c] = value
        # Scalar columns written through memoryviews (item_writer), the arrays once a value
        # does not fit one (write_item). Per-step writes try the writer inline (a call per
        # write costs 1-2% of a cheap env's step, docs/design.md) and leave a refused value
        # to write_item.
        init_w, action_w = item_writer(init_col), item_writer(action_col)
        obs_ws = [item_writer(arr) for arr in obs_cols]
        outputs: list[np.ndarray] = []
        while c < stop:
            if init_now is not no_init:
                init_w[c] = init_now if batched else True
                try:
                    for w, value in zip(obs_ws, adapter.obs, strict=True):
                        w[c] = value
                except ITEM_ERRORS:
                    for i, (arr, value) in enumerate(zip(obs_cols, adapter.obs, strict=True)):
                        obs_ws[i] = write_item(obs_ws[i], arr, c, value)
            if use_random:
                action = env_act = sample()
            else:
                assert policy_step is not None
                action, outputs = policy_step.step(adapter.obs, init_now)
                if not discovering:
                    for arr, value in zip(out_cols, outputs, strict=True):
                        arr[c] = value
                env_act = env_action(action)
            try:
                action_w[c] = action
            except ITEM_ERRORS:
                action_w = write_item(action_w, action_col, c, action)
            if limit is not None:
                limit.count(None if init_now is no_init else init_now)
            restarted = env_step(env_act, c)
            if dead_steps and restarted is not None:
                dead[c] = restarted  # a dead step: never part of the data
            if own_starts:
                restarted = adapter.starting  # dead rows need not restart
            if limit is not None:
                restarted = limit.apply(restarted, c, term_col, trunc_col)
            init_now = no_init if restarted is None else restarted
            c += 1
        staging.fill_entering(first + 1, c)
        if discovering:
            assert policy_step is not None
            for (key, shape, dtype), value in zip(policy_step.output_specs, outputs, strict=True):
                staging.add(key, shape, dtype)
                staging.column(key)[c - 1] = value
        self._init_now = init_now
        return c

    # ----------------------------------------------------------------- finalize
    def _finalize(self, *, random_batch: bool) -> TensorDict:
        """Copy the next batch out of staging and label it (:class:`BatchLabeller`)."""
        out = self.staging.take(extra=BATCH_KEYS)
        self.episodes = self._labeller.label(out)
        if random_batch:
            assert self.policy_step is not None
            for key in self.policy_step.output_keys:
                out[key][...] = 0
        batch = self.staging.to_tensordict(out, flags=FLAG_KEYS)
        if self.storing_device is not None and self.storing_device.type != "cpu":
            batch = batch.to(self.storing_device)
        return batch

    def close(self) -> None:
        """Close the env."""
        self.adapter.close()
