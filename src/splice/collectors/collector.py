"""``Collector``: gymnasium-native collection, persistent ids, whole episodes, background mode."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from splice.collectors._base import CollectorBase, EpisodeSource
from splice.collectors._settings import CollectorSettings
from splice.collectors._staged_episodes import WholeEpisodeLoop
from splice.collectors.ids import TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.envs import EnvLike, make_adapter
from splice.envs.infos import InfoKeysLike
from splice.layout import TrajFormat
from splice.policies import ModulePolicy

__all__ = ["Collector"]


class Collector(CollectorBase):
    """Collect batches of experience from a gymnasium env (or vector env) with a policy.

    Iterating yields batches that follow the data contract (``docs/data_contract.rst``): a
    ``[B, T]`` TensorDict for ``B`` vectorized envs, ``[T]`` for a single ``gymnasium.Env``,
    with ``T = ceil(frames_per_batch / B)``. Argument names follow TorchRL's ``Collector``.

    Every step carries a trajectory id (``("collector", "traj_ids")``, int64) that is unique
    across the envs, batches and collectors (see ``worker_id``) and never reused; an episode cut
    at a batch edge keeps its id in the next batch and has ``("collector", "cut") = True`` on
    its last step in this one (done stays False there unless ``set_truncated``).

    **Batch count.** Without ``trajs_per_batch``, a finite ``total_frames`` gives exactly
    ``len(collector) = ceil(total_frames / frames_per_batch)`` batches (``frames_per_batch`` as
    rounded up to ``B * T``), i.e. at least ``total_frames`` frames, the last batch whole.
    With ``trajs_per_batch`` the number of yields depends on episode lengths, so ``len()``
    raises ``TypeError`` (as it does for an endless collector); ``list(collector)`` works.

    **Frame accounting.** Every collected frame is accounted for:
    ``frames == stored + dropped_frames + frames_buffered``, where *stored* counts the frames
    delivered (yielded, and written to ``replay_buffer``) and :attr:`frames_buffered` the steps
    held to complete episodes (``trajs_per_batch``; 0 once the run has ended). Frames are
    dropped by ``drop_incomplete`` and when ``replay_buffer.extend`` raises (the whole output
    it was given); :attr:`dropped_trajs` counts their trajectories.

    Args:
        env: a ``gymnasium.Env``; a ``gymnasium.vector.VectorEnv`` (``SyncVectorEnv``,
            ``AsyncVectorEnv``, a vector entry point, envpool...) in any autoreset mode; a
            zero-argument callable returning either; or an env id string (see ``num_envs``).
        policy: a ``TensorDictModule``, a function or module ``td -> td``, a plain
            ``nn.Module`` (or callable) mapping the observation tensor to the action, a
            :func:`~splice.policies.as_policy` wrapper (Q-values, logits, several inputs,
            recurrent modules), or ``None`` for uniform random actions from the action space.
            See :mod:`splice.policies`.
        frames_per_batch: frames per batch (rounded up to a multiple of ``B``).
        total_frames: the frame budget; ``-1`` or ``None`` collects forever.
        num_envs: with an env id: ``None`` for one ``gymnasium.make`` env, an int for
            ``gymnasium.make_vec(env, num_envs)``.
        env_kwargs: keyword arguments for ``gymnasium.make``/``make_vec`` (env id only).
        max_frames_per_traj: end episodes after this many steps with ``truncated=True``; the env
            is reset and a new id starts (needs an env that can reset some of its envs).
        init_random_frames: batches are collected with random actions until this many frames
            have been collected (policy outputs are zero in those batches).
        reset_at_each_iter: reset every env before each batch (episodes in flight are cut and
            never continued). Cannot be combined with ``trajs_per_batch``.
        split_trajs: yield ``split_trajectories(batch)`` (``[n_traj, max_len]`` + mask).
        set_truncated: on the cut last step of each row also set ``truncated`` and ``done``
            (TorchRL compatibility); the ``("collector", "cut")`` flag tells it from a time limit.
        trajs_per_batch: yield exactly this many complete episodes per batch (each starts at
            ``is_init`` and ends at an env ``done``), assembled across batches.
        traj_format: ``"padded"`` (``[N, max_len]`` + ``("collector", "mask")``; default) or
            ``"cat"`` (flat ``[sum of lengths]``); only with ``trajs_per_batch``.
        drop_incomplete: with ``trajs_per_batch``, what happens at the end of the run
            (``total_frames`` reached, or ``shutdown()`` of a background run) to the episodes
            still in flight: ``False`` (default) yields them in a final batch together with the
            remaining complete episodes, each marked ``("collector", "cut") = True`` on its last
            step; ``True`` drops them (counted in :attr:`dropped_trajs`, their steps in
            :attr:`dropped_frames`). Complete episodes are never dropped.
        replay_buffer: any object with ``extend(batch)``: every batch (or set of episodes) is
            written to it, and the iterator still yields it. Required by :meth:`start`.
        device: where the policy runs (``None``: CPU).
        storing_device: where the batches live (``None``: CPU).
        seed: seeds the first env reset and the random actions (the envs' own RNGs go on from
            there). Does not touch torch's global RNG.
        worker_id: the id space of the trajectory ids (see :mod:`splice.collectors.ids`):
            collectors with different ``worker_id`` never share an id. ``None`` takes the next
            space unused in this process.
        progress: show a progress bar (frames, frames/s, episodes, mean return); needs tqdm
            (``pip install 'splice-rl[progress]'``).
        track_episodes: record every finished episode in :attr:`episode_log` (implied by
            ``progress``).
        info_keys: ``info`` entries to store, and to show the policy: a list of keys (``str``,
            or a tuple for a nested info dict) that every info carries, or a mapping key ->
            gymnasium space for entries only some infos carry (zero elsewhere; e.g.
            ``{"episode": splice.envs.EPISODE_STATISTICS}`` for
            ``RecordEpisodeStatistics``). Step ``t`` holds the info that came with its
            observation at ``key`` and the info its step returned at ``("next", key)`` (the
            final step's at an episode's end). See :mod:`splice.envs.infos`.
        exclude_keys: observation keys to leave out of the data and the policy input, e.g.
            ``[("observation", "mission")]`` for MiniGrid's text mission.

    Raises:
        ValueError: invalid arguments (the message names the argument); nothing is created.
        TypeError: an ``env`` or ``replay_buffer`` of the wrong kind, or a count (frames,
            ``seed``, ``worker_id``, ``num_envs``...) that is not an int; a bool is refused.
        ImportError: ``progress=True`` without tqdm.

    Examples:
        >>> import gymnasium as gym
        >>> from splice import Collector
        >>> env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
        >>> with Collector(
        ...     env, frames_per_batch=200, total_frames=400, seed=0, worker_id=3
        ... ) as collector:
        ...     batches = list(collector)
        >>> len(batches), batches[0].batch_size
        (2, torch.Size([4, 50]))
        >>> batches[0]["next", "done"].shape, batches[0]["collector", "traj_ids"].dtype
        (torch.Size([4, 50, 1]), torch.int64)

        Whole episodes:

        >>> collector = Collector(
        ...     "CartPole-v1", num_envs=4, frames_per_batch=200, trajs_per_batch=3, seed=0
        ... )
        >>> episodes = next(iter(collector))
        >>> episodes.batch_size[0], bool(episodes["is_init"][:, 0].all())
        (3, True)
        >>> collector.shutdown()
    """

    def __init__(
        self,
        env: EnvLike,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int | None = -1,
        num_envs: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        set_truncated: bool = False,
        trajs_per_batch: int | None = None,
        traj_format: TrajFormat | None = None,
        drop_incomplete: bool = False,
        replay_buffer: Any = None,
        device: torch.device | str | None = None,
        storing_device: torch.device | str | None = None,
        seed: int | None = None,
        worker_id: int | None = None,
        progress: bool = False,
        track_episodes: bool = False,
        info_keys: InfoKeysLike | None = None,
        exclude_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        settings = CollectorSettings.check(  # everything, before anything is created
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter,
            split_trajs=split_trajs,
            set_truncated=set_truncated,
            trajs_per_batch=trajs_per_batch,
            traj_format=traj_format,
            drop_incomplete=drop_incomplete,
            replay_buffer=replay_buffer,
            policy=policy,
            info_keys=info_keys,
            exclude_keys=exclude_keys,
            seed=seed,
            progress=progress,
            track_episodes=track_episodes,
            device=device,
            storing_device=storing_device,
        )
        self.adapter = make_adapter(env, num_envs=num_envs, env_kwargs=env_kwargs)
        try:
            b = self.adapter.num_envs
            steps = math.ceil(settings.frames_per_batch / b)
            self.ids = TrajectoryIds(worker_id)
            # Whole episodes stay in staging when each is one run of columns (not so for
            # turn-based agents: other agents' turns lie inside); else an assembler builds them.
            staged = settings.trajs_per_batch is not None and self.adapter.contiguous_episodes
            loop_type = WholeEpisodeLoop if staged else RolloutLoop
            self._loop = loop_type(
                self.adapter,
                policy,
                steps=steps,
                ids=self.ids,
                options=settings.loop,
                seed=None if seed is None else int(seed),
            )
        except BaseException:
            self.adapter.close()
            raise
        super().__init__(
            settings,
            policy=policy.module if isinstance(policy, ModulePolicy) else policy,
            replay_buffer=replay_buffer,
            frames_per_batch=b * steps,
        )
        self._next_iter: Iterator[TensorDictBase] | None = None  # next()'s iteration

    @property
    def num_envs(self) -> int:
        """``B``, the number of envs (1 for a single ``gymnasium.Env``)."""
        return self.adapter.num_envs

    def _collect_one(self, random_actions: bool) -> tuple[TensorDict, np.ndarray]:
        batch = self._loop.collect(random_actions=random_actions)
        return batch, self._loop.episodes.returns

    def _new_assembler(self) -> EpisodeSource:
        # Whole episodes stay in the loop's staging until emitted: no batch is copied out
        # and into an assembler's pool (see splice.collectors._staged_episodes).
        if not isinstance(self._loop, WholeEpisodeLoop):
            return super()._new_assembler()
        return self._loop.episodes_store

    def _collect_episodes(self) -> None:
        if not isinstance(self._loop, WholeEpisodeLoop):
            return super()._collect_episodes()
        random_actions = self._before_collecting()
        frames = self._loop.collect_episodes(random_actions=random_actions)
        self._count_collected(frames, self._loop.episodes.returns)

    def _restart(self) -> None:
        self._loop.restart()

    def next(self) -> TensorDictBase | None:
        """The next batch (as TorchRL's ``collector.next()``), or None once ``total_frames``
        is reached. Successive calls continue one iteration.

        Raises:
            RuntimeError: while collecting in the background.
        """
        if self._next_iter is None:
            self._next_iter = iter(self)
        try:
            return next(self._next_iter)
        except StopIteration:
            return None

    def reset(self) -> None:
        """Start over: the envs are reset at the next batch (new episodes, new ids), episodes
        in flight and buffered complete episodes (``trajs_per_batch``) are dropped. The frame
        count goes on.

        Raises:
            RuntimeError: while collecting in the background.
        """
        self._start_over(None)

    def set_seed(self, seed: int) -> int:
        """Seed the envs and the random actions: the envs are reset with ``seed`` at the next
        batch (env ``i`` of a vector env gets ``seed + i``, gymnasium's rule), as after
        :meth:`reset`. Two runs after the same ``set_seed`` give the same data (ids aside).

        Returns:
            The seed of the last env, ``seed + num_envs - 1`` (TorchRL returns the last
            env's seed too).

        Raises:
            TypeError: ``seed`` is not an int.
            RuntimeError: while collecting in the background.

        Examples:
            >>> from splice import Collector
            >>> collector = Collector("CartPole-v1", num_envs=2, frames_per_batch=20)
            >>> collector.set_seed(7)
            8
            >>> first = collector.next()
            >>> _ = collector.set_seed(7)
            >>> again = collector.next()
            >>> bool((first["observation"] == again["observation"]).all())
            True
            >>> collector.shutdown()
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self._start_over(seed)
        return seed + self.num_envs - 1

    def _start_over(self, seed: int | None) -> None:
        if self.running:
            raise RuntimeError("the collector is collecting in the background; shut it down first")
        self._loop.restart(seed)
        if self._assembler is not None:
            self._assembler.reset()

    def _close(self) -> None:
        self._loop.close()

    def _sync_weights(self) -> None:
        pass  # the loop runs the caller's policy object itself: its weights are live

    def _ids_state(self) -> Any:
        return self.ids.state_dict()

    def _load_ids_state(self, state: Any) -> None:
        self.ids.load_state_dict(state)
