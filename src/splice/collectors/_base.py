"""The front end every collector shares, whatever produces its batches.

:class:`CollectorBase` turns a source of ``[B, T]`` batches into what the user iterates over:
``total_frames`` and the batch count, ``init_random_frames``, ``split_trajs``, whole episodes
(``trajs_per_batch``, assembled across batches and drained at the end of the run), the
``replay_buffer``, background collection (``start()`` and friends), the progress bar and
episode log, policy weights and the run's state. A subclass only says where batches come from:
:class:`~splice.Collector` from a :class:`~splice.collectors.RolloutLoop` in this process; the
multi-process and Ray collectors from their workers.
"""

from __future__ import annotations

import atexit
import math
import sys
import threading
import traceback
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from splice.collectors._progress import ProgressBar, require_tqdm
from splice.collectors._settings import CollectorSettings
from splice.collectors.background import BackgroundRunner
from splice.layout import MASK, TRAJ_IDS, TrajFormat
from splice.trajectories import TrajectoryAssembler, split_trajectories
from splice.trajectories.assembler import Drained

__all__ = ["CollectorBase", "EpisodeSource"]


class EpisodeSource(Protocol):
    """What holds whole episodes for ``trajs_per_batch`` (the interface the front end uses
    of :class:`~splice.TrajectoryAssembler`)."""

    def __len__(self) -> int:
        """Complete episodes ready to emit."""
        ...

    @property
    def frames_buffered(self) -> int:
        """Steps held (complete and in flight)."""
        ...

    def emit(self, n: int | None = None, traj_format: TrajFormat = "padded") -> TensorDict:
        """Remove and return ``n`` complete episodes."""
        ...

    def drain(
        self, traj_format: TrajFormat = "padded", *, drop_incomplete: bool = False
    ) -> Drained:
        """Remove everything: complete episodes, then the ones in flight marked cut."""
        ...

    def reset(self) -> None:
        """Forget everything."""
        ...


#: How long interpreter exit waits for a background collection to finish its current batch.
EXIT_TIMEOUT = 6.0  # ends worker processes within 10 s of exit, teardown included


class CollectorBase(ABC):
    """The shared front end of the collectors (see the module docstring).

    Args:
        settings: the checked arguments (:meth:`CollectorSettings.check`).
        policy: the policy the caller holds (its weights are what ``update_policy_weights_``
            and ``state_dict`` deal with), or ``None``.
        replay_buffer: where every output is also written, or ``None``.
        frames_per_batch: the frames of every batch the source makes (``B * T``).

    Subclasses implement :meth:`_collect_one`, :meth:`_restart`,
    :meth:`_close`, :meth:`_sync_weights`, :attr:`num_envs`, :meth:`_ids_state` and
    :meth:`_load_ids_state`; a source with batches in flight (worker processes) also
    overrides :meth:`_finish_in_flight` and :attr:`_policy_in_collection_thread`.

    **Frame accounting.** Every collected frame is accounted for: ``frames`` equals the frames
    delivered (yielded, and written to ``replay_buffer`` when there is one) plus
    :attr:`dropped_frames` plus :attr:`frames_buffered` (steps held to complete episodes for
    ``trajs_per_batch``; 0 once the run has ended). Frames are dropped by ``drop_incomplete``
    and when ``replay_buffer.extend`` raises (the whole output it was given; a buffer's extend
    is expected to be all or nothing); :attr:`dropped_trajs` counts their trajectories.
    """

    def __init__(
        self,
        settings: CollectorSettings,
        *,
        policy: Any,
        replay_buffer: Any,
        frames_per_batch: int,
    ) -> None:
        if settings.progress:
            require_tqdm()
        self.policy = policy
        self.frames_per_batch = frames_per_batch
        self.total_frames = settings.total_frames
        self.init_random_frames = settings.init_random_frames
        self.reset_at_each_iter = settings.loop.reset_at_each_iter
        self.split_trajs = settings.split_trajs
        self.set_truncated = settings.loop.set_truncated
        self.trajs_per_batch = settings.trajs_per_batch
        self.traj_format = settings.traj_format
        self.drop_incomplete = settings.drop_incomplete
        self.replay_buffer = replay_buffer
        self.progress = settings.progress
        self.track_episodes = settings.loop.track_episodes
        #: Where whole episodes are assembled (``trajs_per_batch``), or None.
        self._assembler = self._new_assembler() if self.trajs_per_batch is not None else None
        self._frames = 0
        self._batches = 0
        self._finished = False
        #: Trajectories never delivered: episodes in flight dropped at the end of a run
        #: (``drop_incomplete=True``) and the trajectories of an output whose
        #: ``replay_buffer.extend`` raised (fragments, for a plain batch) ...
        self.dropped_trajs = 0
        #: ... and their frames (see "Frame accounting").
        self.dropped_frames = 0
        #: ``(frames collected, return)`` of every episode finished so far, in order; kept when
        #: ``track_episodes`` or ``progress`` is set (appended by the collecting thread).
        self.episode_log: list[tuple[int, float]] = []
        self._bar: ProgressBar | None = None
        self._runner: BackgroundRunner | None = None
        self._pending_weights: Any = None
        self._weights_lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ the source
    @property
    @abstractmethod
    def num_envs(self) -> int:
        """``B``: the env rows of every batch."""

    @abstractmethod
    def _collect_one(self, random_actions: bool) -> tuple[TensorDict, np.ndarray]:
        """The next ``[B, T]`` batch, and the returns of the episodes that ended in it (empty
        unless :attr:`track_episodes`)."""

    @abstractmethod
    def _restart(self) -> None:
        """Forget what is in flight: the next batch starts new episodes (new ids)."""

    @abstractmethod
    def _close(self) -> None:
        """Free what the source holds (envs, processes); called once."""

    @abstractmethod
    def _ids_state(self) -> Any:
        """The id counters, for :meth:`state_dict`."""

    @abstractmethod
    def _load_ids_state(self, state: Any) -> None:
        """Continue the saved id counters."""

    @abstractmethod
    def _sync_weights(self) -> None:
        """Make the caller's policy weights effective where the policy runs."""

    #: Whether the collection thread runs :attr:`policy` itself: weights passed to
    #: :meth:`update_policy_weights_` during background collection are then loaded by that
    #: thread between two batches; otherwise (workers run copies) they are loaded at once.
    _policy_in_collection_thread = True

    def _new_assembler(self) -> EpisodeSource:
        """What assembles whole episodes (``trajs_per_batch``): a
        :class:`~splice.TrajectoryAssembler` fed with every batch, by default. A source that
        can keep its steps as episodes itself returns its own :class:`EpisodeSource` and
        overrides :meth:`_collect_episodes`."""
        return TrajectoryAssembler()

    def _collect_episodes(self) -> None:
        """Collect one batch into :attr:`_assembler` (``trajs_per_batch``)."""
        assert isinstance(self._assembler, TrajectoryAssembler)
        self._assembler.ingest(self._collect_batch())

    def _finish_in_flight(self) -> None:
        """At the end of background collection: collect and store (with :meth:`_produce`) the
        batches already requested from workers, so that none is lost. Nothing by default."""
        return

    # --------------------------------------------------------------- properties
    @property
    def frames(self) -> int:
        """Frames collected so far (env steps written to batches)."""
        return self._frames

    @property
    def frames_buffered(self) -> int:
        """Frames held to complete episodes (``trajs_per_batch``), not delivered yet."""
        return 0 if self._assembler is None else self._assembler.frames_buffered

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
        """Yield batches until ``total_frames`` (see the class docstring).

        Raises:
            RuntimeError: collecting in the background, background collection failed (its
                exception is the cause), or shut down.
        """
        if self._runner is not None and self._runner.alive:
            raise RuntimeError(
                "the collector is collecting in the background (start()); shut it down first"
            )
        self._raise_if_failed("iterate")
        if self._closed:
            raise RuntimeError("the collector is shut down")
        return self._iterate()

    def _raise_if_failed(self, action: str) -> None:
        """A collector whose background thread died does nothing more but shut down."""
        if self._runner is not None:
            self._runner.raise_failure(
                f"cannot {action}: background collection failed (the cause below); shut the "
                "collector down"
            )

    def _budget_left(self) -> bool:
        return self.total_frames == -1 or self._frames < self.total_frames

    def _collect_batch(self) -> TensorDict:
        random_actions = self._before_collecting()
        batch, returns = self._collect_one(random_actions)
        self._count_collected(batch.numel(), returns)
        return batch

    def _before_collecting(self) -> bool:
        """What comes before each batch (weights); returns whether the batch uses random
        actions (``init_random_frames``). ``reset_at_each_iter`` is the loop's own
        (:class:`~splice.collectors.LoopOptions`)."""
        if self._closed:
            raise RuntimeError("the collector is shut down")
        self._apply_pending_weights()
        return self._frames < self.init_random_frames

    def _count_collected(self, frames: int, returns: np.ndarray) -> None:
        """Count a collected batch: frames, episode log, progress bar."""
        self._frames += frames
        self._batches += 1
        if self.track_episodes:
            self.episode_log.extend((self._frames, float(r)) for r in returns)
        if self.progress:
            if self._bar is None:
                self._bar = ProgressBar(None if self.total_frames == -1 else self.total_frames)
            self._bar.update(frames, returns)

    def _deliver(self, out: TensorDictBase) -> TensorDictBase:
        if self.replay_buffer is not None:
            try:
                self.replay_buffer.extend(out)
            except BaseException:
                frames, trajs = _frames_and_trajectories(out)
                self.dropped_frames += frames
                self.dropped_trajs += trajs
                raise
        return out

    def _produce(self) -> list[TensorDictBase]:
        """Collect one batch; return what it makes available (0..n outputs, delivered)."""
        if self._assembler is None:
            batch = self._collect_batch()
            out = split_trajectories(batch) if self.split_trajs else batch
            return [self._deliver(out)]
        assert self.trajs_per_batch is not None
        self._collect_episodes()
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
        drained = self._assembler.drain(self.traj_format, drop_incomplete=self.drop_incomplete)
        self.dropped_trajs += drained.dropped_trajs
        self.dropped_frames += drained.dropped_frames
        return None if drained.batch is None else self._deliver(drained.batch)

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
            self._sync_weights()
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
            if self._policy_in_collection_thread:
                with self._weights_lock:
                    self._pending_weights = new
                return
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
        self._sync_weights()

    # --------------------------------------------------------------- background
    def start(self, *, gate: Callable[[], bool] | None = None) -> None:
        """Collect in a background thread into ``replay_buffer`` while the caller trains.

        The thread stops by itself at ``total_frames`` (with ``trajs_per_batch``, after the
        final batch) or on :meth:`shutdown`. Every collected batch is written to the buffer.
        A collector still collecting in the background when the interpreter exits is shut down
        then (the current batch is finished and stored; waits at most ``EXIT_TIMEOUT`` = 6 s),
        so no thread is left running while the interpreter tears down.

        Args:
            gate: called in the collecting thread before each batch; while it returns False the
                thread waits for it (polling every 0.5 ms; :meth:`pause` and :meth:`shutdown`
                still work). A rate limiter: ``gate=lambda: frames_ahead() < limit`` keeps the
                collector from running ahead of a learner however the two threads are scheduled,
                which a learner pausing the collector itself cannot guarantee (it may not run
                while the collector writes several batches).

        Raises:
            RuntimeError: no ``replay_buffer``, already started, or shut down.

        Examples:
            >>> import time
            >>> import gymnasium as gym
            >>> from splice import Collector, LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
            >>> collector = Collector(
            ...     gym.make("CartPole-v1"), frames_per_batch=50, total_frames=500, replay_buffer=rb
            ... )
            >>> collector.start(gate=lambda: len(rb) < 200)  # a learner would open it as it goes
            >>> while len(rb) < 200:
            ...     time.sleep(0.01)
            >>> time.sleep(0.05)
            >>> len(rb)  # the gate holds the thread: no batch past 200 steps
            200
            >>> collector.shutdown()
            >>> collector.running
            False
        """
        if self.replay_buffer is None:
            raise RuntimeError(
                f"start() needs a replay_buffer: {type(self).__name__}(..., replay_buffer=rb)"
            )
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
            try:
                self._finish_in_flight()  # batches workers are still collecting are stored too
            finally:
                if self._assembler is not None:
                    self._final()  # a stop request also flushes (or drops) what is in flight
                if self._bar is not None:
                    self._bar.close()
                    self._bar = None

        self._runner = BackgroundRunner(step, on_exit=on_exit, gate=gate)
        _shut_down_at_exit(self)
        self._runner.start()

    @property
    def running(self) -> bool:
        """Whether the background thread is collecting (or paused)."""
        return self._runner is not None and self._runner.alive

    def pause(self, timeout: float | None = None) -> _Resumer:
        """Pause background collection after the current batch; returns once paused.

        Also a context manager: ``with collector.pause(): ...`` resumes on exit. After the
        thread ended by itself (``total_frames``), pausing does nothing.

        Raises:
            RuntimeError: never started, shut down, or the thread failed (its exception is the
                cause).
            TimeoutError: not paused within ``timeout`` seconds.
        """
        self._check_controllable("pause")
        assert self._runner is not None
        self._runner.pause(timeout)
        return _Resumer(self)

    def resume(self) -> None:
        """Resume background collection after :meth:`pause`.

        Raises:
            RuntimeError: never started, shut down, or the thread failed (its exception is the
                cause).
        """
        self._check_controllable("resume")
        assert self._runner is not None
        self._runner.resume()

    def _check_controllable(self, action: str) -> None:
        if self._runner is None:
            raise RuntimeError(f"{action}() applies to background collection; call start() first")
        if self._closed:
            raise RuntimeError(f"{action}(): the collector is shut down")
        self._raise_if_failed(f"{action}()")

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
                _COLLECTING.discard(self)
                if self._bar is not None:
                    self._bar.close()
                    self._bar = None
                if not self._closed:
                    self._closed = True
                    self._close()

    def __enter__(self) -> CollectorBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The id counter (``"ids"``), frames and batches so far, and the policy's state dict
        (``"policy"``, if it has one)."""
        state: dict[str, Any] = {
            "ids": self._ids_state(),
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
        self._load_ids_state(state["ids"])
        self._frames = int(state.get("frames", 0))
        self._batches = int(state.get("batches", 0))
        if "policy" in state and isinstance(self.policy, torch.nn.Module):
            self.policy.load_state_dict(state["policy"])
        self._restart()
        if self._assembler is not None:
            self._assembler.reset()
        self._finished = False


def _frames_and_trajectories(out: TensorDictBase) -> tuple[int, int]:
    """The real steps of a collector output and the trajectories they belong to: rows of a
    padded output (mask), distinct ids otherwise."""
    mask = out.get(MASK, None)
    if mask is not None and out.ndim == 2:
        return int(mask.sum()), int(mask.any(-1).sum())
    ids = out.get(TRAJ_IDS, None)
    if ids is None:
        return out.batch_size.numel(), 0
    real = ids[ids >= 0]
    return real.numel(), int(torch.unique(real).numel())


#: The collectors collecting in the background, shut down at interpreter exit.
_COLLECTING: weakref.WeakSet[CollectorBase] = weakref.WeakSet()
_exit_hook_registered = False


def _shut_down_at_exit(collector: CollectorBase) -> None:
    """Shut ``collector`` down at interpreter exit unless it is shut down before.

    A thread still running while the interpreter finalizes can abort the process (C++
    ``std::terminate`` in torch's thread pool: "terminate called without an active exception").
    The hook is registered at the first ``start()``, so it runs before the exit handlers
    registered earlier (``atexit`` runs the last registered first).
    """
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_shut_down_all)
        _exit_hook_registered = True
    _COLLECTING.add(collector)


def _shut_down_all() -> None:
    collectors = list(_COLLECTING)
    for collector in collectors:  # stop them all first: they finish their batches in parallel
        if collector._runner is not None:
            collector._runner.request_stop()
    for collector in collectors:
        try:
            collector.shutdown(EXIT_TIMEOUT)
        except Exception:  # report, and go on shutting the others down
            print(
                f"splice: shutting down a background {type(collector).__name__} at "
                "interpreter exit failed:",
                file=sys.stderr,
            )
            traceback.print_exc()


class _Resumer:
    """Returned by :meth:`CollectorBase.pause`: resumes on ``__exit__``."""

    def __init__(self, collector: CollectorBase) -> None:
        self._collector = collector

    def __enter__(self) -> _Resumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._collector.resume()
