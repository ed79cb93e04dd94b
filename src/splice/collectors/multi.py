"""Collection by several workers: ``MultiSyncCollector`` and ``MultiAsyncCollector``.

Both are :class:`~splice.collectors._base.CollectorBase` subclasses over a worker pool
(:mod:`splice.collectors._pool`): every worker runs its own env and policy copy in a
:class:`~splice.collectors.RolloutLoop` (a process of its own with the ``"process"``
backend, a Ray actor with ``"ray"``), and the collector in the caller's process holds every
rule: the frame budget, whole episodes, the replay buffer, background collection, weights and
failures. The design and its reasons are in ``docs/design.md`` ("Multi-worker collection").
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from splice._args import non_negative_int
from splice._rng import seed_from_torch
from splice.collectors._base import CollectorBase, _frames_and_trajectories
from splice.collectors._pool import WorkerBatch, WorkerPool, check_backend, make_pool
from splice.collectors._progress import require_tqdm
from splice.collectors._settings import CollectorSettings, TrajFormat, positive_int
from splice.collectors._worker import WorkerError, WorkerInfo, WorkerSpec, policy_weights
from splice.collectors.background import StopCollection
from splice.collectors.ids import TrajectoryIds
from splice.envs.infos import InfoKeysLike

__all__ = ["MultiAsyncCollector", "MultiSyncCollector"]

#: Default seconds :meth:`~_MultiCollector.shutdown` takes at most to end every worker.
SHUTDOWN_TIMEOUT = 10.0
EnvFactory = Callable[[], Any] | str


def _env_factories(create_env_fn: Any, num_workers: int | None) -> list[EnvFactory]:
    """One env factory (or env id) per worker, checked."""
    if num_workers is not None:
        positive_int("num_workers", num_workers)
    if isinstance(create_env_fn, list | tuple):
        factories = list(create_env_fn)
        if not factories:
            raise ValueError("create_env_fn is an empty list; give one env factory per worker")
        if num_workers is not None and num_workers != len(factories):
            raise ValueError(
                f"num_workers={num_workers} but create_env_fn lists {len(factories)} env "
                "factories; give one of them, or make them agree"
            )
    else:
        if num_workers is None:
            raise ValueError(
                "with a single env factory, num_workers is required (or pass a list of "
                "factories, one per worker)"
            )
        factories = [create_env_fn] * num_workers
    for i, factory in enumerate(factories):
        if isinstance(factory, gym.Env | VectorEnv):
            raise TypeError(
                f"create_env_fn[{i}] is an env object ({type(factory).__name__}); each worker "
                "builds its own env: pass a zero-argument factory (e.g. lambda: "
                "gym.make(...)) or an env id string"
            )
        if not (callable(factory) or isinstance(factory, str)):
            raise TypeError(
                f"create_env_fn[{i}] must be a zero-argument env factory or an env id string, "
                f"got {type(factory).__name__}"
            )
    return factories


def _id_spaces(worker_ids: Sequence[int] | None, n: int) -> list[int]:
    """The id space of each worker, claimed in this process (so that no later collector of
    this process takes it)."""
    if worker_ids is None:
        return [TrajectoryIds().worker_id for _ in range(n)]
    spaces = list(worker_ids)
    if len(spaces) != n or len(set(spaces)) != n:
        raise ValueError(
            f"worker_ids must list {n} distinct id spaces (one per worker), got {worker_ids!r}"
        )
    return [TrajectoryIds(w).worker_id for w in spaces]


class _WorkerSeeds:
    """Deterministic per-worker seeds: worker ``k`` (and each replacement after it) draws the
    next child of ``numpy.random.SeedSequence(seed)``; without a seed, envs are not seeded
    and each worker's torch RNG is seeded from torch's global RNG (so ``torch.manual_seed``
    still reproduces the policies' sampling)."""

    def __init__(self, seed: int | None) -> None:
        self._sequence = (
            None if seed is None else np.random.SeedSequence(non_negative_int("seed", seed))
        )

    def next(self) -> tuple[int | None, int]:
        """``(env seed, torch seed)`` for the next worker."""
        if self._sequence is None:
            return None, seed_from_torch()
        child = self._sequence.spawn(1)[0]
        env_seed, torch_seed = (int(x) for x in child.generate_state(2, np.uint32))
        return env_seed, torch_seed


@dataclass(frozen=True)
class _RemoteBatch:
    """A batch whose parts stayed where the workers made it (see ``remote_writes``)."""

    parts: list[WorkerBatch]
    frames: int

    def numel(self) -> int:
        return self.frames


class _MultiCollector(CollectorBase):
    """What :class:`MultiSyncCollector` and :class:`MultiAsyncCollector` share."""

    _policy_in_collection_thread = False  # workers run copies; weights go out at once
    _sync: bool

    def __init__(
        self,
        create_env_fn: EnvFactory | Sequence[EnvFactory],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        num_workers: int | None = None,
        policy_factory: Callable[[], Any] | None = None,
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
        worker_ids: Sequence[int] | None = None,
        progress: bool = False,
        track_episodes: bool = False,
        backend: str = "process",
        backend_options: dict[str, Any] | None = None,
        restart_workers: bool = False,
        mp_start_method: str = "forkserver",
        num_sub_threads: int = 1,
        start_timeout: float = 300.0,
        info_keys: InfoKeysLike | None = None,
        exclude_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        # Every check first: nothing is started if an argument is wrong.
        settings = CollectorSettings.check(
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
            progress=progress,
            track_episodes=track_episodes,
            device=device,
            storing_device=storing_device,
        )
        factories = _env_factories(create_env_fn, num_workers)
        if policy is not None and policy_factory is not None:
            raise ValueError("pass either policy or policy_factory, not both")
        if policy_factory is not None and not callable(policy_factory):
            raise TypeError(
                f"policy_factory must be a zero-argument callable returning a policy, got "
                f"{type(policy_factory).__name__}"
            )
        check_backend(backend)
        if backend_options is not None and not isinstance(backend_options, dict):
            raise TypeError(f"backend_options must be a dict, got {type(backend_options).__name__}")
        if progress:
            require_tqdm()
        if not isinstance(restart_workers, bool):
            raise TypeError(f"restart_workers must be a bool, got {type(restart_workers).__name__}")
        positive_int("num_sub_threads", num_sub_threads)
        seeds = _WorkerSeeds(seed)
        spaces = _id_spaces(worker_ids, len(factories))
        # The caller's policy: the weights every worker starts from and receives on update.
        self.policy_factory = policy_factory
        parent_policy = policy if policy_factory is None else policy_factory()
        weights = policy_weights(parent_policy)
        # The workers' batches are moved to storing_device here (_copy_out), not in the workers.
        worker_loop = replace(settings.loop, storing_device=None)
        specs = []
        for i, (factory, space) in enumerate(zip(factories, spaces, strict=True)):
            env_seed, torch_seed = seeds.next()
            specs.append(
                WorkerSpec(
                    index=i,
                    env=factory,
                    num_envs=num_envs,
                    env_kwargs=env_kwargs,
                    policy=policy,
                    policy_factory=policy_factory,
                    worker_id=space,
                    seed=env_seed,
                    torch_seed=torch_seed,
                    loop=worker_loop,
                    num_threads=num_sub_threads,
                )
            )
        self.backend = backend
        self.restart_workers = restart_workers
        self.start_timeout = start_timeout
        self.storing_device = settings.loop.storing_device
        #: How many workers failed and were replaced (``restart_workers=True``) ...
        self.restarted_workers = 0
        #: ... and their failures, in order.
        self.worker_failures: list[WorkerError] = []
        self._seeds = seeds
        self._specs = specs
        self._ids_states: list[dict[str, Any]] = [{"worker_id": s, "next": 0} for s in spaces]
        self._in_flight: set[int] = set()  # workers granted a batch not taken yet
        self._reported_frames = [0] * len(specs)
        self._granted = 0  # frames granted so far: delivered + in flight
        self._granting = True
        #: When :meth:`shutdown` must have ended every worker (``time.monotonic()``); the
        #: pool's close counts its phases against it.
        self._close_deadline: float | None = None
        started = time.perf_counter()
        options = {"start_method": mp_start_method, **(backend_options or {})}
        self._pool: WorkerPool = make_pool(backend, specs, weights, options)
        #: Whether batches go from the workers to ``replay_buffer.extend_refs`` without
        #: passing through this process (the Ray backend with a buffer served by a Ray
        #: actor, e.g. :class:`~splice.RayReplayBuffer`, and plain batches: no
        #: ``split_trajs``, no ``trajs_per_batch``). See docs/design.md.
        self.remote_writes = (
            replay_buffer is not None
            and callable(getattr(replay_buffer, "extend_refs", None))
            and not split_trajs
            and trajs_per_batch is None
            and self._pool.keep_batches_remote()
        )
        self._last_remote: _RemoteBatch | None = None
        try:
            self.worker_info: list[WorkerInfo] = self._pool.start(start_timeout)
            #: Seconds it took to start every worker and build their envs.
            self.startup_seconds = time.perf_counter() - started
            steps, batch_frames = self._layout(self.worker_info, frames_per_batch)
            self._pool.configure(steps)
        except BaseException:
            self._pool.close(SHUTDOWN_TIMEOUT)
            raise
        self._steps = steps
        self.num_workers = len(specs)
        try:
            super().__init__(
                settings,
                policy=parent_policy,
                replay_buffer=replay_buffer,
                frames_per_batch=batch_frames,
            )
        except BaseException:
            self._pool.close(SHUTDOWN_TIMEOUT)
            raise

    # ------------------------------------------------------------------- layout
    def _layout(self, infos: list[WorkerInfo], frames_per_batch: int) -> tuple[list[int], int]:
        """Each worker's ``T`` and the frames of one yielded batch."""
        raise NotImplementedError

    @property
    def worker_num_envs(self) -> list[int]:
        """``B`` of each worker."""
        return [info.num_envs for info in self.worker_info]

    # ----------------------------------------------------------------- workers
    def _replace(self, error: WorkerError) -> None:
        """A worker failed: raise, or (``restart_workers``) start a new one in its place."""
        if not self.restart_workers or self._closed:
            raise error
        i = error.worker
        if i in self._in_flight:  # its batch in flight is lost: the credit comes back
            self._in_flight.discard(i)
            self._granted -= self._worker_frames(i)
        env_seed, torch_seed = self._seeds.next()
        space = TrajectoryIds().worker_id  # a fresh id space: no id of the old one recurs
        spec = replace(self._specs[i], worker_id=space, seed=env_seed, torch_seed=torch_seed)
        info = self._pool.replace(i, spec, self.start_timeout)
        old = self.worker_info[i]
        if (info.num_envs, info.batched) != (old.num_envs, old.batched):
            raise ValueError(
                f"the replacement of worker {i} has {info.num_envs} envs (batched: "
                f"{info.batched}); the failed one had {old.num_envs} ({old.batched})"
            ) from error
        self._specs[i] = spec
        self.worker_info[i] = info
        self._ids_states[i] = {"worker_id": space, "next": 0}
        self._reported_frames[i] = 0
        self.restarted_workers += 1
        self.worker_failures.append(error)
        summary = str(error).splitlines()[0]
        warnings.warn(
            f"{summary}; replaced by a new worker (restart_workers=True). Its episodes in "
            "flight end with the cut mark of its last batch.",
            RuntimeWarning,
            stacklevel=4,
        )

    def _worker_frames(self, worker: int) -> int:
        info = self.worker_info[worker]
        return info.num_envs * self._steps[worker]

    def _request(self, worker: int, random_actions: bool) -> None:
        while True:
            try:
                self._pool.request(worker, random_actions=random_actions)
                break
            except WorkerError as error:
                self._replace(error)
        self._in_flight.add(worker)
        self._granted += self._worker_frames(worker)

    def _wait(self, workers: list[int]) -> list[int]:
        """The ready ones among ``workers``; a failed worker is replaced (or its error raised)
        and waited for again if it was given a new request; ``[]`` if none is left."""
        while True:
            try:
                return self._pool.wait(workers)
            except WorkerError as error:
                self._replace(error)
                self._after_replace(error.worker)
                workers = [i for i in workers if i in self._in_flight]
                if not workers:
                    return []

    def _after_replace(self, worker: int) -> None:
        """Re-issue what the failed worker owed (subclasses)."""

    def _take(self, worker: int) -> WorkerBatch:
        part = self._pool.take(worker)
        self._in_flight.discard(worker)
        self._ids_states[worker] = dict(part.ids_state)
        self._reported_frames[worker] = part.frames
        return part

    @property
    def worker_frames(self) -> list[int]:
        """The frames each worker has collected, as the worker itself counts them: after
        :meth:`shutdown`, its final count (batches collected but never handed over included);
        before, its count at its last batch handed over. A replaced worker's count starts
        at 0."""
        return [
            reported if final is None else final
            for final, reported in zip(self._pool.final_frames, self._reported_frames, strict=True)
        ]

    def _copy_out(self, batch: TensorDict) -> TensorDict:
        if self.storing_device is not None and self.storing_device.type != "cpu":
            return batch.to(self.storing_device)
        return batch

    def _keep_remote(self, workers: list[int], parts: list[WorkerBatch]) -> _RemoteBatch | None:
        """With ``remote_writes``: remember the parts' handles for :meth:`_produce`, and
        return them as the batch when nobody in this process reads it (background
        collection); ``None`` when the batch must be fetched."""
        self._last_remote = None
        if not self.remote_writes or any(part.remote is None for part in parts):
            return None
        frames = sum(self._worker_frames(i) for i in workers)
        self._last_remote = _RemoteBatch(parts, frames)
        return self._last_remote if self.running else None

    def _produce(self) -> list[TensorDictBase]:
        if not self.remote_writes:
            return super()._produce()
        # Plain batches only (no split, no assembler): the batch is the output.
        batch = self._collect_batch()
        remote, self._last_remote = self._last_remote, None
        if remote is None:  # the parts came to this process: written from here
            return [self._deliver(batch)]
        try:
            self.replay_buffer.extend_refs([part.remote for part in remote.parts])
        except BaseException:
            self._count_dropped(remote)
            raise
        return [] if batch is remote else [batch]

    def _count_dropped(self, remote: _RemoteBatch) -> None:
        """A remote write failed: its frames (and, if they can still be read, their
        trajectories) are dropped."""
        self.dropped_frames += remote.frames
        try:
            parts = [self._pool.fetch(part) for part in remote.parts]
        except Exception:
            return  # the data is gone too: the trajectories cannot be counted
        for part in parts:
            self.dropped_trajs += _frames_and_trajectories(part)[1]

    def _discard_in_flight(self) -> None:
        """Wait for the batches in flight and drop them (a restart of the run)."""
        while self._in_flight:
            for i in self._wait(sorted(self._in_flight)):
                self._take(i)
        self._granted = self._frames

    # ------------------------------------------------------------- base hooks
    @property
    def num_envs(self) -> int:
        raise NotImplementedError

    def _restart(self) -> None:
        self._discard_in_flight()
        for i in range(self.num_workers):
            self._pool.restart(i)

    def _close(self) -> None:
        # What is left of shutdown()'s time once the collection thread has ended (at least
        # 1 s, to ask, terminate and kill): the whole shutdown stays within its timeout.
        deadline = self._close_deadline
        left = SHUTDOWN_TIMEOUT if deadline is None else deadline - time.monotonic()
        forced = self._pool.close(max(left, 1.0))
        if forced:
            warnings.warn(
                f"workers {forced} were still collecting when the collector shut down and "
                "were terminated; their batches in flight are lost",
                RuntimeWarning,
                stacklevel=3,
            )

    def _sync_weights(self) -> None:
        weights = policy_weights(self.policy)
        if weights is not None:
            self._pool.set_weights(weights)

    def _ids_state(self) -> list[dict[str, Any]]:
        return [dict(state) for state in self._ids_states]

    def _load_ids_state(self, state: Any) -> None:
        if not isinstance(state, list | tuple) or len(state) != self.num_workers:
            raise ValueError(
                f"the saved ids hold {len(state) if isinstance(state, list | tuple) else '?'} "
                f"worker states; this collector has {self.num_workers} workers"
            )
        self._discard_in_flight()
        for i, worker_state in enumerate(state):
            TrajectoryIds.from_state_dict(worker_state)  # claim the space in this process
            self._pool.load_ids_state(i, dict(worker_state))
            self._ids_states[i] = dict(worker_state)

    def _finish_in_flight(self) -> None:
        self._granting = False
        try:
            while self._in_flight:
                self._produce()
        except StopCollection:
            pass  # shutdown() gave up on a stuck worker: its batch is lost (and reported)

    # --------------------------------------------------------------- shutdown
    def shutdown(self, timeout: float | None = None) -> None:
        """Stop collecting and end every worker process within ``timeout`` seconds
        (default 10).

        In background mode the batches the workers are collecting are finished and stored
        first; a worker that does not finish in time (e.g. blocked in its env) is terminated
        and its batch in flight is lost (with a ``RuntimeWarning``). Workers are asked to stop,
        then terminated, then killed.

        Raises:
            RuntimeError: the background thread failed (its exception is the cause).
        """
        limit = SHUTDOWN_TIMEOUT if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        runner = self._runner
        failure: BaseException | None = None
        if runner is not None and runner.alive:
            runner.request_stop()
            try:
                runner.join(0.5 * limit)
            except TimeoutError:
                self._pool.interrupt()  # a worker is stuck: stop waiting for it
            except RuntimeError as error:
                failure = error
        self._close_deadline = deadline
        super().shutdown(max(deadline - time.monotonic(), 1.0))
        if failure is not None:
            raise failure


class MultiSyncCollector(_MultiCollector):
    """Collect with several workers in lockstep: each batch holds one part from every worker.

    Each iteration every worker collects ``T`` steps of its ``B_k`` envs and the parts are
    concatenated along the env rows, in worker order: a ``[sum_k B_k, T]`` batch (a single
    ``gymnasium.Env`` counts as one row), with
    ``T = ceil(frames_per_batch / sum_k B_k)`` for every worker, so ``frames_per_batch`` is
    rounded up to ``sum_k B_k * T``. With TorchRL's default of one env per worker that is
    TorchRL's ``ceil(frames_per_batch / num_workers)`` frames per worker. Workers start a batch
    only when the collector asks for it (no batch runs ahead). Weights given to
    :meth:`update_policy_weights_` are sent when the next batch starts, so every part of a
    batch is collected with the same weights: in iteration mode the batch right after the
    update uses them; in background mode, the batch after the one under way.

    Everything else (``total_frames`` and ``len()``, ``trajs_per_batch``, ``split_trajs``,
    ``replay_buffer``, ``start()``/``pause()``/``resume()``/``wait()``/``shutdown()``,
    ``state_dict()``) behaves as in :class:`~splice.Collector`, batch for batch. Trajectory ids
    stay unique across workers (each has its own id space) and an episode keeps its id across
    its worker's batches. With ``seed``, a run's data is reproducible: worker ``k`` is seeded
    from ``numpy.random.SeedSequence(seed)``'s ``k``-th child (env resets, random actions and
    the torch RNG of its process).

    ``total_frames``, ``num_envs``, ``env_kwargs``, ``max_frames_per_traj``,
    ``init_random_frames``, ``reset_at_each_iter``, ``split_trajs``, ``set_truncated``,
    ``trajs_per_batch``, ``traj_format``, ``drop_incomplete``, ``replay_buffer``, ``device``,
    ``storing_device``, ``progress``, ``track_episodes``, ``info_keys`` and ``exclude_keys``
    are :class:`~splice.Collector`'s (``num_envs``/``env_kwargs`` apply to each worker's env
    id; ``device`` is where each worker runs its policy).

    Args:
        create_env_fn: a list of zero-argument env factories (or env id strings), one per
            worker; or one of them and ``num_workers``. Factories may be lambdas or closures
            (they are pickled with cloudpickle).
        policy: a TensorDict policy (see :mod:`splice.policies`) or ``None`` for random
            actions; each worker runs a copy. An ``nn.Module``'s weights are kept in sync by
            :meth:`update_policy_weights_`.
        num_workers: the number of workers when ``create_env_fn`` is a single factory.
        policy_factory: instead of ``policy``: called once in every worker (and once here, to
            hold the weights that :meth:`update_policy_weights_` sends).
        frames_per_batch: frames per batch, rounded up as above.
        seed: makes the run reproducible (see above).
        worker_ids: the id spaces of the workers (distinct ints, see
            :mod:`splice.collectors.ids`); by default the next unused spaces of this process.
            Give distinct ones to collectors in different processes or machines.
        backend: ``"process"`` (one process per worker), ``"ray"`` (one Ray actor per
            worker, on any node of a Ray cluster: needs ``pip install 'splice-rl[ray]'``; see
            :doc:`/scaling_out`) or ``"inline"`` (every worker in this process, one after
            another: for debugging).
        backend_options: options for the backend (as TorchRL's ``backend_options``); the
            process backend takes none besides ``mp_start_method``; the Ray backend takes
            Ray actor options for every worker (default ``{"num_cpus": 1}``; ``num_gpus``,
            ``resources``, ``runtime_env``, ``scheduling_strategy``, ...).
        restart_workers: when a worker fails, replace it and go on (counted in
            :attr:`restarted_workers`, with a ``RuntimeWarning``) instead of raising
            :class:`~splice.WorkerError`.
        mp_start_method: ``"forkserver"`` (default) or ``"spawn"``.
        num_sub_threads: torch threads in each worker process.
        start_timeout: seconds to wait for the workers to build their envs.

    Raises:
        ValueError: invalid arguments (the message names the argument); nothing is started.
        TypeError: an env object instead of a factory, or a policy that cannot be pickled.
        WorkerError: a worker failed to build its env or policy.

    Scripts that create a multi-worker collector must guard their entry point with
    ``if __name__ == "__main__":`` (workers start with ``forkserver`` or ``spawn``, which
    import the main module).

    Examples:
        >>> import gymnasium as gym
        >>> from splice import MultiSyncCollector
        >>> collector = MultiSyncCollector(
        ...     lambda: gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"),
        ...     num_workers=2, frames_per_batch=200, total_frames=400, seed=0,
        ... )
        >>> batches = list(collector)
        >>> len(batches), batches[0].batch_size  # 2 workers x 2 envs, T = 50
        (2, torch.Size([4, 50]))
        >>> ids = batches[0]["collector", "traj_ids"]
        >>> from splice.collectors.ids import worker_of
        >>> bool((worker_of(ids[:2]) != worker_of(ids[2:]).unique()[0]).all())  # own spaces
        True
        >>> collector.shutdown()
    """

    _sync = True
    _weights_for_next_batch: TensorDictBase | None = None
    _round_random = False
    _round_missing: set[int] = set()  # noqa: RUF012 (replaced per instance)

    def _layout(self, infos: list[WorkerInfo], frames_per_batch: int) -> tuple[list[int], int]:
        rows = sum(info.num_envs for info in infos)
        steps = math.ceil(frames_per_batch / rows)
        return [steps] * len(infos), rows * steps

    @property
    def num_envs(self) -> int:
        """``sum_k B_k``: the env rows of every batch."""
        return sum(self.worker_num_envs)

    def _collect_one(self, random_actions: bool) -> tuple[Any, np.ndarray]:
        workers = list(range(self.num_workers))
        self._send_weights()
        self._round_random = random_actions
        self._round_missing = set(workers)
        for i in workers:
            if i not in self._in_flight:
                self._request(i, random_actions)
        parts: dict[int, WorkerBatch] = {}
        while self._round_missing:
            for i in self._wait(sorted(self._round_missing)):
                parts[i] = self._take(i)
                self._round_missing.discard(i)
        returns = np.concatenate([parts[i].returns for i in workers])
        remote = self._keep_remote(workers, [parts[i] for i in workers])
        if remote is not None:
            return remote, returns
        rows = [self._pool.fetch(parts[i]) for i in workers]
        rows = [
            row if self.worker_info[i].batched else row.unsqueeze(0) for i, row in enumerate(rows)
        ]
        batch = torch.cat(rows, 0)  # the copy out of the workers' memory
        return self._copy_out(batch), returns

    def _after_replace(self, worker: int) -> None:
        if worker in self._round_missing and worker not in self._in_flight:
            self._request(worker, self._round_random)  # its part of this batch, again

    def _sync_weights(self) -> None:
        # A snapshot, sent when the next batch starts: every part of a batch is collected
        # with the same weights, even when they are updated while a batch is under way
        # (background collection).
        weights = policy_weights(self.policy)
        if weights is not None:
            snapshot = weights.clone()
            with self._weights_lock:
                self._weights_for_next_batch = snapshot

    def _send_weights(self) -> None:
        with self._weights_lock:
            snapshot, self._weights_for_next_batch = self._weights_for_next_batch, None
        if snapshot is not None:
            self._pool.set_weights(snapshot)


class MultiAsyncCollector(_MultiCollector):
    """Collect with several workers independently: each batch is the first one ready.

    Each worker collects ``[B, T]`` batches (``T = ceil(frames_per_batch / B)``; every worker
    must have the same ``B``) and the iterator yields them in the order they are finished,
    from any worker. A worker is granted its next batch as soon as its last one is taken, so
    collection overlaps the caller's work. Grants are *credits* against the frame budget: a
    worker only starts a batch while ``frames granted < total_frames``, so the workers never
    run past the budget and every batch they collect is yielded; the batch count is that of
    :class:`~splice.Collector`, ``ceil(total_frames / frames_per_batch)``.

    Weights: :meth:`update_policy_weights_` reaches every worker before the next batch it
    starts; a batch already under way finishes with the weights it started with, so up to
    one batch per worker yielded after an update was collected with older weights.

    In iteration mode, the batches granted ahead (at most one per worker) are not collected
    for anybody if the caller stops iterating before the budget is spent and shuts down; in
    background mode (:meth:`start`) they are finished and written to the buffer.

    The arguments are :class:`MultiSyncCollector`'s; ``init_random_frames`` counts granted
    frames (a batch is random if it was granted before that many frames were).

    Examples:
        >>> import gymnasium as gym
        >>> from splice import MultiAsyncCollector
        >>> with MultiAsyncCollector(
        ...     [lambda: gym.make("CartPole-v1")] * 2, frames_per_batch=100, total_frames=300,
        ... ) as collector:
        ...     shapes = [batch.batch_size for batch in collector]
        >>> shapes  # 3 batches of 100 frames, each from one worker's single env
        [torch.Size([100]), torch.Size([100]), torch.Size([100])]
    """

    _sync = False

    def _layout(self, infos: list[WorkerInfo], frames_per_batch: int) -> tuple[list[int], int]:
        shapes = {(info.num_envs, info.batched) for info in infos}
        if len(shapes) > 1:
            kinds = [
                f"{info.num_envs} (vector env)" if info.batched else "1 (single gymnasium.Env)"
                for info in infos
            ]
            raise ValueError(
                "MultiAsyncCollector needs every worker to have the same envs (each batch is "
                f"one worker's): the workers have {', '.join(kinds)} envs"
            )
        b = infos[0].num_envs
        steps = math.ceil(frames_per_batch / b)
        return [steps] * len(infos), b * steps

    @property
    def num_envs(self) -> int:
        """``B``: the env rows of every batch (each batch comes from one worker)."""
        return self.worker_num_envs[0]

    def _grant(self) -> None:
        """Give every idle worker a batch while the budget has credits left."""
        if not self._granting:
            return
        for i in range(self.num_workers):
            if i in self._in_flight:
                continue
            if self.total_frames != -1 and self._granted >= self.total_frames:
                return
            self._request(i, self._granted < self.init_random_frames)

    def _after_replace(self, worker: int) -> None:
        self._grant()

    def _collect_one(self, random_actions: bool) -> tuple[Any, np.ndarray]:
        self._grant()
        ready: list[int] = []
        while not ready:
            if not self._in_flight:  # a replaced worker's lost batch was the last one owed
                raise StopCollection
            ready = self._wait(sorted(self._in_flight))
        i = ready[0]
        part = self._take(i)
        batch = self._keep_remote([i], [part])
        if batch is None:  # copied out before the worker gets its next grant
            fetched = self._pool.fetch(part)
            batch = self._copy_out(fetched if self._pool.fresh_batches else fetched.clone())
        self._grant()
        return batch, part.returns
