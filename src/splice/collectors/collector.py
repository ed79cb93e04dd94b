"""``Collector``: gymnasium-native collection, persistent ids, whole episodes, background mode."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from splice.collectors._progress import ProgressBar, require_tqdm
from splice.collectors.background import BackgroundRunner
from splice.collectors.ids import TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.envs import EnvLike, make_adapter
from splice.layout import MASK, PADDING_ID, TRAJ_IDS, TrajFormat
from splice.trajectories import TrajectoryAssembler, split_trajectories

__all__ = ["Collector"]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class Collector:
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

    Args:
        env: a ``gymnasium.Env``; a ``gymnasium.vector.VectorEnv`` (``SyncVectorEnv``,
            ``AsyncVectorEnv``, a vector entry point, envpool...) in any autoreset mode; a
            zero-argument callable returning either; or an env id string (see ``num_envs``).
        policy: a TensorDict policy (:mod:`splice.policies`), or ``None`` for uniform random
            actions from the action space.
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
            step; ``True`` drops them (counted in :attr:`dropped_trajs`). Complete episodes are
            never dropped.
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
            (``pip install 'splice[progress]'``).
        track_episodes: record every finished episode in :attr:`episode_log` (implied by
            ``progress``).

    Raises:
        ValueError: invalid arguments (the message names the argument); nothing is created.
        TypeError: an ``env`` or ``replay_buffer`` of the wrong kind.
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
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
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
    ) -> None:
        # Validate everything before anything is created.
        _positive_int("frames_per_batch", frames_per_batch)
        if total_frames is None:
            total_frames = -1
        if (
            isinstance(total_frames, bool)
            or not isinstance(total_frames, int)
            or (total_frames < 1 and total_frames != -1)
        ):
            raise ValueError(
                "total_frames must be a positive int, or -1/None for no limit; "
                f"got {total_frames!r}"
            )
        if init_random_frames is not None and (
            isinstance(init_random_frames, bool)
            or not isinstance(init_random_frames, int)
            or init_random_frames < 0
        ):
            raise ValueError(
                f"init_random_frames must be a non-negative int or None, got {init_random_frames!r}"
            )
        if trajs_per_batch is not None:
            _positive_int("trajs_per_batch", trajs_per_batch)
            if split_trajs:
                raise ValueError(
                    "split_trajs and trajs_per_batch are exclusive: trajs_per_batch already "
                    "yields one episode per row"
                )
            if reset_at_each_iter:
                raise ValueError(
                    "reset_at_each_iter cannot be combined with trajs_per_batch: episodes longer "
                    "than one batch would never complete (only short episodes would be emitted)"
                )
        if traj_format is not None:
            if trajs_per_batch is None:
                raise ValueError(
                    "traj_format only applies with trajs_per_batch; set trajs_per_batch=N"
                )
            if traj_format not in ("padded", "cat"):
                raise ValueError(f"traj_format must be 'padded' or 'cat', got {traj_format!r}")
        if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
            raise TypeError(
                "replay_buffer must have an extend(batch) method; "
                f"got {type(replay_buffer).__name__}"
            )
        if policy is not None and not callable(policy):
            raise TypeError(
                f"policy must be a callable td -> td or None, got {type(policy).__name__}"
            )
        if progress:
            require_tqdm()

        self.adapter = make_adapter(env, num_envs=num_envs, env_kwargs=env_kwargs)
        try:
            b = self.adapter.num_envs
            steps = math.ceil(frames_per_batch / b)
            self.ids = TrajectoryIds(worker_id)
            self._loop = RolloutLoop(
                self.adapter,
                policy,
                steps=steps,
                ids=self.ids,
                max_frames_per_traj=max_frames_per_traj,
                set_truncated=set_truncated,
                seed=seed,
                device=device,
                storing_device=storing_device,
                track_episodes=progress or track_episodes,
            )
        except BaseException:
            self.adapter.close()
            raise
        self.policy = policy
        self.frames_per_batch = b * steps
        self.total_frames = total_frames
        self.init_random_frames = init_random_frames or 0
        self.reset_at_each_iter = reset_at_each_iter
        self.split_trajs = split_trajs
        self.set_truncated = set_truncated
        self.trajs_per_batch = trajs_per_batch
        self.traj_format: TrajFormat = traj_format or "padded"
        self.drop_incomplete = drop_incomplete
        self.replay_buffer = replay_buffer
        self.progress = progress
        self._assembler = TrajectoryAssembler() if trajs_per_batch is not None else None
        self._frames = 0
        self._batches = 0
        self._finished = False
        #: Episodes in flight dropped at the end of a run (``drop_incomplete=True``).
        self.dropped_trajs = 0
        #: ``(frames collected, return)`` of every episode finished so far, in order; kept when
        #: ``track_episodes`` or ``progress`` is set (appended by the collecting thread).
        self.episode_log: list[tuple[int, float]] = []
        self._bar: ProgressBar | None = None
        self._runner: BackgroundRunner | None = None
        self._pending_weights: Any = None
        self._weights_lock = threading.Lock()
        self._closed = False
        self._next_iter: Iterator[TensorDictBase] | None = None

    # --------------------------------------------------------------- properties
    @property
    def num_envs(self) -> int:
        """``B``, the number of envs (1 for a single ``gymnasium.Env``)."""
        return self.adapter.num_envs

    @property
    def frames(self) -> int:
        """Frames collected so far (env steps written to batches)."""
        return self._frames

    def __len__(self) -> int:
        """The number of batches an iteration started now yields (see "Batch count" above):
        ``ceil(total_frames / frames_per_batch)`` for a fresh collector, fewer after some
        collection or :meth:`load_state_dict`.

        Raises:
            TypeError: endless collector, or ``trajs_per_batch`` (the count depends on the data).
        """
        if self.total_frames == -1:
            raise TypeError("len() is undefined for an endless collector (total_frames=-1)")
        if self.trajs_per_batch is not None:
            raise TypeError(
                "len() is undefined with trajs_per_batch: how many batches of complete episodes "
                "fit in total_frames depends on the episode lengths; iterate to the end instead"
            )
        return math.ceil(max(self.total_frames - self._frames, 0) / self.frames_per_batch)

    # --------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[TensorDictBase]:
        """Yield batches until ``total_frames`` (see the class docstring)."""
        if self._runner is not None and self._runner.alive:
            raise RuntimeError(
                "the collector is collecting in the background (start()); shut it down first"
            )
        return self._iterate()

    def _budget_left(self) -> bool:
        return self.total_frames == -1 or self._frames < self.total_frames

    def _collect_batch(self) -> TensorDict:
        if self._closed:
            raise RuntimeError("the collector is shut down")
        self._apply_pending_weights()
        if self.reset_at_each_iter and self._batches > 0:
            self._loop.reset_envs()
        random_actions = self._frames < self.init_random_frames
        batch = self._loop.collect(random_actions=random_actions)
        self._frames += self.frames_per_batch
        self._batches += 1
        if self._loop.track_episodes:
            self.episode_log.extend((self._frames, float(r)) for r in self._loop.episodes.returns)
        if self.progress:
            if self._bar is None:
                self._bar = ProgressBar(None if self.total_frames == -1 else self.total_frames)
            self._bar.update(self.frames_per_batch, self._loop.episodes.returns)
        return batch

    def _deliver(self, out: TensorDictBase) -> TensorDictBase:
        if self.replay_buffer is not None:
            self.replay_buffer.extend(out)
        return out

    def _produce(self) -> list[TensorDictBase]:
        """Collect one batch; return what it makes available (0..n outputs, delivered)."""
        batch = self._collect_batch()
        if self._assembler is None:
            out = split_trajectories(batch) if self.split_trajs else batch
            return [self._deliver(out)]
        assert self.trajs_per_batch is not None
        self._assembler.ingest(batch)
        outs = []
        while len(self._assembler) >= self.trajs_per_batch:
            outs.append(self._deliver(self._assembler.emit(self.trajs_per_batch, self.traj_format)))
        return outs

    def _final(self) -> TensorDictBase | None:
        """At the end of the run: the leftover complete episodes and (unless dropped) the
        in-flight ones, marked cut, in one last batch. Called once."""
        if self._finished or self._assembler is None:
            self._finished = True
            return None
        self._finished = True
        asm = self._assembler
        complete = asm.emit(None, self.traj_format) if len(asm) else None
        if self.drop_incomplete:
            self.dropped_trajs += asm.num_in_flight
            asm.reset()
            partial = None
        else:
            partial = asm.flush(self.traj_format)
        parts = [p for p in (complete, partial) if p is not None and p.batch_size[0] > 0]
        if not parts:
            return None
        out = parts[0] if len(parts) == 1 else _cat_rows(parts, self.traj_format)
        return self._deliver(out)

    def _iterate(self) -> Iterator[TensorDictBase]:
        try:
            while self._budget_left():
                yield from self._produce()
            final = self._final()
            if final is not None:
                yield final
        finally:
            if not self._budget_left() and self._bar is not None:
                self._bar.close()
                self._bar = None

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
        self._restart(None)

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
        self._restart(seed)
        return seed + self.num_envs - 1

    def _restart(self, seed: int | None) -> None:
        if self.running:
            raise RuntimeError("the collector is collecting in the background; shut it down first")
        self._loop.restart(seed)
        if self._assembler is not None:
            self._assembler.reset()

    # ------------------------------------------------------------ policy weights
    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
    ) -> None:
        """Make new policy weights effective for the following steps.

        The collector runs the policy object it was given, so weights changed in place (e.g.
        by an optimizer) are already live and the no-argument call does nothing. Pass new
        weights as an ``nn.Module`` (its weights are copied), a ``state_dict`` mapping, or a
        parameter TensorDict (``TensorDict.from_module``). In background mode (:meth:`start`) the
        weights are applied by the collection thread before its next batch.

        Raises:
            TypeError: weights given but the collector's policy is not an ``nn.Module``, or an
                unsupported weights object.
        """
        new = (
            policy_or_weights
            if policy_or_weights is not None
            else (weights if weights is not None else policy)
        )
        if new is None:
            if self._runner is not None:
                self._runner.check()
            return
        if not isinstance(self.policy, torch.nn.Module):
            raise TypeError(
                f"update_policy_weights_ with weights needs an nn.Module policy; the collector's "
                f"policy is {type(self.policy).__name__}"
            )
        if isinstance(new, torch.nn.Module):
            new = new.state_dict()
        if not isinstance(new, Mapping | TensorDictBase):
            raise TypeError(
                "weights must be an nn.Module, a state_dict or a TensorDict, "
                f"got {type(new).__name__}"
            )
        if self._runner is not None and self._runner.alive:
            self._runner.check()
            with self._weights_lock:
                self._pending_weights = new
        else:
            self._load_weights(new)

    def _apply_pending_weights(self) -> None:
        if self._pending_weights is None:
            return
        with self._weights_lock:
            new, self._pending_weights = self._pending_weights, None
        self._load_weights(new)

    def _load_weights(self, new: Any) -> None:
        assert isinstance(self.policy, torch.nn.Module)
        if isinstance(new, TensorDictBase):
            new.to_module(self.policy)
        else:
            self.policy.load_state_dict(new)

    # --------------------------------------------------------------- background
    def start(self) -> None:
        """Collect in a background thread into ``replay_buffer`` while the caller trains.

        The thread stops by itself at ``total_frames`` (with ``trajs_per_batch``, after the
        final batch) or on :meth:`shutdown`. Every collected batch is written to the buffer.

        Raises:
            RuntimeError: no ``replay_buffer``, already started, or shut down.
        """
        if self.replay_buffer is None:
            raise RuntimeError("start() needs a replay_buffer: Collector(..., replay_buffer=rb)")
        if self._runner is not None:
            raise RuntimeError("start() was already called on this collector")
        if self._closed:
            raise RuntimeError("the collector is shut down")

        def step() -> bool:
            if not self._budget_left():
                self._final()
                return False
            self._produce()
            return True

        def on_exit() -> None:
            if self._assembler is not None:
                self._final()  # a stop request also flushes (or drops) what is in flight
            if self._bar is not None:
                self._bar.close()
                self._bar = None

        self._runner = BackgroundRunner(step, on_exit=on_exit)
        self._runner.start()

    @property
    def running(self) -> bool:
        """Whether the background thread is collecting (or paused)."""
        return self._runner is not None and self._runner.alive

    def pause(self, timeout: float | None = None) -> _Resumer:
        """Pause background collection after the current batch; returns once paused.

        Also a context manager: ``with collector.pause(): ...`` resumes on exit.

        Raises:
            RuntimeError: not collecting in the background, or the thread failed.
        """
        if self._runner is None:
            raise RuntimeError("pause() applies to background collection; call start() first")
        self._runner.pause(timeout)
        return _Resumer(self)

    def resume(self) -> None:
        """Resume background collection after :meth:`pause`."""
        if self._runner is None:
            raise RuntimeError("resume() applies to background collection; call start() first")
        self._runner.resume()

    def wait(self, timeout: float | None = None) -> None:
        """Block until background collection ends by itself (``total_frames``).

        Raises:
            TimeoutError: still collecting after ``timeout`` seconds.
            RuntimeError: the thread failed (its exception is the cause).
        """
        if self._runner is None:
            raise RuntimeError("wait() applies to background collection; call start() first")
        self._runner.join(timeout)

    def async_shutdown(self, timeout: float | None = None) -> None:
        """Stop background collection after the current batch, join the thread, close the env.

        Same as :meth:`shutdown` (kept for TorchRL compatibility).
        """
        self.shutdown(timeout)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop (after the current batch is stored), join the thread, close the env.

        Raises:
            RuntimeError: the background thread failed (its exception is the cause).
            TimeoutError: the thread did not end within ``timeout`` seconds.
        """
        runner = self._runner
        try:
            if runner is not None:
                runner.request_stop()
                runner.join(timeout)
        finally:
            if runner is None or not runner.alive:
                if self._bar is not None:
                    self._bar.close()
                    self._bar = None
                if not self._closed:
                    self._closed = True
                    self._loop.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The id counter (``"ids"``), frames and batches so far, and the policy's state dict
        (``"policy"``, if it has one)."""
        state: dict[str, Any] = {
            "ids": self.ids.state_dict(),
            "frames": self._frames,
            "batches": self._batches,
        }
        if isinstance(self.policy, torch.nn.Module):
            state["policy"] = self.policy.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue a saved run: ids continue from the saved counter (in the saved id space),
        the frame count continues, and the policy weights are restored. The envs are reset at
        the next batch (new episodes, new ids); buffered episodes are discarded.

        Raises:
            RuntimeError: while collecting in the background.
        """
        if self.running:
            raise RuntimeError(
                "load_state_dict() while collecting in the background; shut down first"
            )
        self.ids.load_state_dict(state["ids"])
        self._frames = int(state.get("frames", 0))
        self._batches = int(state.get("batches", 0))
        if "policy" in state and isinstance(self.policy, torch.nn.Module):
            self.policy.load_state_dict(state["policy"])
        self._loop.restart()
        if self._assembler is not None:
            self._assembler.reset()
        self._finished = False


class _Resumer:
    """Returned by :meth:`Collector.pause`: resumes on ``__exit__``."""

    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def __enter__(self) -> _Resumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._collector.resume()


def _cat_rows(parts: list[TensorDictBase], traj_format: TrajFormat) -> TensorDictBase:
    """Stack episode batches row-wise (padding to the longest one in ``"padded"`` format)."""
    if traj_format == "cat":
        return torch.cat(parts, 0)
    width = max(p.batch_size[1] for p in parts)
    padded = []
    for p in parts:
        extra = width - p.batch_size[1]
        if extra:
            pad = p.apply(
                lambda x, n=extra: torch.zeros((x.shape[0], n, *x.shape[2:]), dtype=x.dtype),
                batch_size=[p.batch_size[0], extra],
            )
            pad.set(TRAJ_IDS, torch.full((p.batch_size[0], extra), PADDING_ID, dtype=torch.int64))
            pad.set(MASK, torch.zeros((p.batch_size[0], extra), dtype=torch.bool))
            p = torch.cat([p, pad], 1)
        padded.append(p)
    return torch.cat(padded, 0)
