"""The worker-pool protocol: how a multi-worker collector talks to its workers.

A :class:`WorkerPool` runs one :class:`~splice.collectors._worker.WorkerCore` per worker
somewhere (processes, Ray actors, this process) and offers the few operations the
collectors need: grant worker ``i`` one batch (:meth:`~WorkerPool.request`), wait until the
batch of some or all granted workers is ready (:meth:`~WorkerPool.wait`), read it
(:meth:`~WorkerPool.take`), broadcast weights, restart episodes, load id counters, replace a
failed worker and close. The collectors (:mod:`splice.collectors.multi`) hold every rule about
budgets, credits, batch layouts and failures, so a backend only moves batches and weights.

A worker is in one of four states: *idle* (no request), *busy* (a request outstanding),
*ready* (its batch can be taken) and *failed*. ``request`` needs an idle worker; ``take``
needs a ready one and makes it idle again. The batch :meth:`~WorkerPool.take` returns may be
a view of memory the worker reuses: it stays valid until the next ``request`` to that worker,
and the collector copies it out before that.

Backends are registered by name in :data:`BACKENDS` (``"inline"`` here; ``"process"`` by its
module, imported on first use through :data:`LAZY_BACKENDS`; ``"ray"`` the same way, so that
``ray`` is imported only by a collector that asks for it); :func:`make_pool` builds one,
passing the collector's ``backend_options``.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from tensordict import TensorDict, TensorDictBase

from splice.collectors._worker import (
    WorkerCore,
    WorkerError,
    WorkerInfo,
    WorkerSpec,
    format_exception,
)
from splice.collectors.background import StopCollection

__all__ = [
    "BACKENDS",
    "LAZY_BACKENDS",
    "InlinePool",
    "PoolFactory",
    "WorkerBatch",
    "WorkerPool",
    "WorkerRecord",
    "check_backend",
    "make_pool",
    "ready_or_raise",
    "register_backend",
]

#: A worker's states in the backends that keep one record per worker (process, Ray).
IDLE, BUSY, READY, FAILED, CLOSED = "idle", "busy", "ready", "failed", "closed"


@dataclass(frozen=True)
class WorkerBatch:
    """A batch a worker finished.

    Args:
        batch: ``[B, T]`` (``[T]`` for a single env); may be a view of memory the worker
            reuses, valid until the next :meth:`WorkerPool.request` to that worker; ``None``
            when the batch stayed where the worker made it (see ``remote``).
        returns: the returns of the episodes that ended in it (empty unless tracked).
        ids_state: the worker's id counter after the batch (:meth:`TrajectoryIds.state_dict`).
        frames: the frames the worker has collected so far, this batch included.
        remote: after :meth:`WorkerPool.keep_batches_remote`, the backend's handle on the
            batch (the Ray backend: a ``ray.ObjectRef`` of its :func:`splice._remote.pack`
            form), which :meth:`WorkerPool.fetch` reads and a buffer's ``extend_refs``
            accepts; ``None`` otherwise.
    """

    batch: TensorDict | None
    returns: np.ndarray
    ids_state: dict[str, Any]
    frames: int
    remote: Any = None


class WorkerPool(ABC):
    """Workers that collect batches on request (see the module docstring for the protocol).

    Args:
        specs: one :class:`~splice.collectors._worker.WorkerSpec` per worker.
        weights: the policy's weights (:func:`~splice.collectors._worker.policy_weights`) if
            it is an ``nn.Module``: every worker loads them before its first batch.

    A backend implements every abstract method. Errors: any method that talks to a worker
    raises :class:`~splice.collectors._worker.WorkerError` (index and the worker's traceback)
    when that worker failed; :meth:`wait` raises it for ANY worker that failed and was not
    reported yet (each failure is raised once; later calls that need the worker raise it
    again), and raises :class:`~splice.collectors.background.StopCollection` after
    :meth:`interrupt`.
    """

    #: Whether the batches :meth:`fetch` returns are copies that no worker writes again
    #: (the Ray backend's): the collector then hands them out without copying them again.
    fresh_batches = False

    def __init__(self, specs: Sequence[WorkerSpec], weights: TensorDictBase | None) -> None:
        self.specs = list(specs)
        self.num_workers = len(self.specs)
        #: Set by :meth:`interrupt`.
        self.interrupted = False
        #: The frames each worker said it had collected when it closed cleanly (``None``
        #: until then, or if it did not): an account of collection independent of the
        #: batches taken.
        self.final_frames: list[int | None] = [None] * self.num_workers

    @abstractmethod
    def start(self, timeout: float) -> list[WorkerInfo]:
        """Start every worker and wait until each has built its env (in parallel).

        Raises:
            WorkerError: a worker failed to start (e.g. its env factory raised).
            TimeoutError: a worker did not report within ``timeout`` seconds.
        """

    @abstractmethod
    def configure(self, steps: Sequence[int]) -> None:
        """Give worker ``i`` its batch length ``steps[i]`` (before its first request)."""

    @abstractmethod
    def request(self, worker: int, *, random_actions: bool) -> None:
        """Grant an idle ``worker`` one batch. It loads the latest weights (if they changed)
        before it starts. Returns at once."""

    @abstractmethod
    def wait(self, workers: Collection[int], timeout: float | None = None) -> list[int]:
        """Block until at least one of ``workers`` (busy or ready) is ready; return the ready
        ones, in the order they were requested.

        Raises:
            WorkerError: a worker failed (see the class docstring).
            StopCollection: :meth:`interrupt` was called.
            TimeoutError: nothing ready within ``timeout`` seconds.
        """

    @abstractmethod
    def take(self, worker: int) -> WorkerBatch:
        """The ready batch of ``worker`` (which becomes idle)."""

    @abstractmethod
    def busy(self) -> list[int]:
        """The workers with a request outstanding (busy or ready), in request order."""

    @abstractmethod
    def set_weights(self, weights: TensorDictBase) -> None:
        """Make ``weights`` the ones every worker loads before its next batch (thread-safe:
        may be called while another thread waits)."""

    @abstractmethod
    def restart(self, worker: int) -> None:
        """An idle ``worker`` forgets its episodes in flight: its next batch starts new ones."""

    @abstractmethod
    def load_ids_state(self, worker: int, state: dict[str, Any]) -> None:
        """An idle ``worker`` continues the saved id counter ``state``."""

    @abstractmethod
    def replace(self, worker: int, spec: WorkerSpec, timeout: float) -> WorkerInfo:
        """End ``worker`` (if anything is left of it) and start a new one from ``spec`` in its
        place, configured with the same batch length; it is idle afterwards."""

    def interrupt(self) -> None:
        """Make every current and later :meth:`wait` raise ``StopCollection`` (thread-safe)."""
        self.interrupted = True

    def keep_batches_remote(self) -> bool:
        """Ask the workers to leave each batch where they make it (call before :meth:`start`):
        a backend with an object store (Ray) then returns batches from :meth:`take` as
        handles (``WorkerBatch.remote``, ``batch=None``) that a replay buffer can read
        without the data passing through this process. Returns whether the backend does;
        the default backend cannot (batches always come to this process)."""
        return False

    def fetch(self, part: WorkerBatch) -> TensorDict:
        """The data of a batch :meth:`take` returned (a fresh copy if it was remote)."""
        if part.batch is None:
            raise NotImplementedError(f"{type(self).__name__} does not keep batches remote")
        return part.batch

    @abstractmethod
    def close(self, timeout: float) -> list[int]:
        """End every worker within ``timeout`` seconds (asked to stop, then terminated, then
        killed); idempotent. Returns the workers that were still busy and had to be ended by
        force (their batch in flight is lost)."""


PoolFactory = Callable[[Sequence[WorkerSpec], TensorDictBase | None, dict[str, Any]], WorkerPool]

#: The pool backends by name: ``factory(specs, weights, options) -> WorkerPool``.
BACKENDS: dict[str, PoolFactory] = {}


def register_backend(name: str, factory: PoolFactory) -> None:
    """Make ``backend=name`` available to the multi-worker collectors."""
    BACKENDS[name] = factory


class WorkerRecord(Protocol):
    """What :func:`ready_or_raise` reads of a backend's record of one worker."""

    index: int
    state: str
    seq: int
    failure: WorkerError | None


def ready_or_raise(
    interrupted: bool,
    records: Sequence[WorkerRecord],
    wanted: Sequence[WorkerRecord],
    unreported: list[int],
) -> list[int]:
    """The rules of :meth:`WorkerPool.wait` for a backend with one record per worker, checked
    under its lock: the ``wanted`` workers whose batch is ready, in request order (empty:
    keep waiting).

    Raises:
        StopCollection: ``interrupted``.
        WorkerError: the first failure not reported yet (any worker; it is removed from
            ``unreported``), or the failure of a wanted worker, reported before.
        RuntimeError: no wanted worker has a request outstanding.
    """
    if interrupted:
        raise StopCollection
    if unreported:
        failed = records[unreported.pop(0)]
        assert failed.failure is not None
        raise failed.failure
    for record in wanted:
        if record.failure is not None:  # reported before, and still needed
            raise record.failure
    ready = sorted((r for r in wanted if r.state == READY), key=lambda r: r.seq)
    if not ready and not any(r.state == BUSY for r in wanted):
        states = {r.index: r.state for r in wanted}
        raise RuntimeError(f"no request outstanding among the workers {states}")
    return [r.index for r in ready]


def make_pool(
    backend: str,
    specs: Sequence[WorkerSpec],
    weights: TensorDictBase | None,
    options: dict[str, Any],
) -> WorkerPool:
    """The pool of ``backend`` for ``specs``.

    Raises:
        ValueError: an unknown backend (the message names the supported ones).
    """
    check_backend(backend)
    return BACKENDS[backend](specs, weights, options)


#: Backends whose module registers them when first asked for (so that e.g. ``ray`` is imported
#: only by the collectors that use it): name -> module.
LAZY_BACKENDS: dict[str, str] = {
    "process": "splice.collectors._process",
    "ray": "splice.collectors._ray",
}


def check_backend(backend: Any) -> None:
    """Raise a ``ValueError`` naming the supported backends if ``backend`` is not one (a lazy
    backend's module is imported here)."""
    if isinstance(backend, str) and backend not in BACKENDS and backend in LAZY_BACKENDS:
        importlib.import_module(LAZY_BACKENDS[backend])
    if not isinstance(backend, str) or backend not in BACKENDS:
        names = sorted({*BACKENDS, *LAZY_BACKENDS})
        raise ValueError(f"backend must be one of {names}, got {backend!r}")


class InlinePool(WorkerPool):
    """Every worker in this process, collecting when its batch is waited for (requests are
    served in order): the ``"inline"`` backend, for debugging a policy or an env with the
    multi-worker collectors (breakpoints work) and for testing their rules quickly.

    The workers run the policy object they are given (no copy), so weight updates of that
    object are live at once; :meth:`set_weights` also loads weights into each worker's policy
    before its next batch.

    Examples:
        >>> from splice.collectors._worker import WorkerSpec
        >>> from splice.testing import counting_vec
        >>> specs = [WorkerSpec(index=i, env=lambda: counting_vec([3]), worker_id=50 + i)
        ...          for i in range(2)]
        >>> pool = InlinePool(specs, None)
        >>> [info.num_envs for info in pool.start(timeout=10)]
        [1, 1]
        >>> pool.configure([4, 4])
        >>> pool.request(1, random_actions=False)
        >>> pool.wait([0, 1])
        [1]
        >>> pool.take(1).batch.batch_size
        torch.Size([1, 4])
        >>> pool.close(timeout=1)
        []
    """

    def __init__(self, specs: Sequence[WorkerSpec], weights: TensorDictBase | None) -> None:
        super().__init__(specs, weights)
        self._cores: list[WorkerCore | None] = [None] * self.num_workers
        self._steps: list[int] = [0] * self.num_workers
        self._pending: dict[int, bool] = {}  # worker -> random_actions, in request order
        self._ready: dict[int, WorkerBatch] = {}
        self._failed: dict[int, WorkerError] = {}
        self._unreported: list[int] = []
        self._weights: TensorDictBase | None = None if weights is None else weights.clone()
        self._loaded: list[int] = [-1] * self.num_workers
        self._version = 0
        self._closed = False

    def _core(self, worker: int) -> WorkerCore:
        if worker in self._failed:
            raise self._failed[worker]
        core = self._cores[worker]
        if core is None:
            raise RuntimeError(f"worker {worker} is not running")
        return core

    def start(self, timeout: float) -> list[WorkerInfo]:
        infos = []
        for i, spec in enumerate(self.specs):
            try:
                self._cores[i] = WorkerCore(spec)
            except Exception as error:
                self.close(timeout)
                raise WorkerError(i, format_exception(error)) from error
            infos.append(self._core(i).info)
        return infos

    def configure(self, steps: Sequence[int]) -> None:
        for i, core in enumerate(self._cores):
            if core is not None:
                core.configure(steps[i])
                self._steps[i] = steps[i]

    def request(self, worker: int, *, random_actions: bool) -> None:
        self._core(worker)
        if worker in self._pending or worker in self._ready:
            raise RuntimeError(f"worker {worker} already has a request outstanding")
        self._pending[worker] = random_actions

    def _run(self, worker: int) -> None:
        random_actions = self._pending.pop(worker)
        core = self._core(worker)
        try:
            if self._weights is not None and self._loaded[worker] != self._version:
                core.load_weights(self._weights)
                self._loaded[worker] = self._version
            batch, returns = core.collect(random_actions)
        except Exception as error:
            self._failed[worker] = WorkerError(worker, format_exception(error))
            self._unreported.append(worker)
            return
        self._ready[worker] = WorkerBatch(batch, returns, core.ids_state(), core.frames)

    def wait(self, workers: Collection[int], timeout: float | None = None) -> list[int]:
        wanted = set(workers)
        while True:
            if self._unreported:
                raise self._failed[self._unreported.pop(0)]
            if self.interrupted:
                raise StopCollection
            for i in wanted:
                if i in self._failed:  # reported before, and still needed
                    raise self._failed[i]
            ready = [i for i in self._ready if i in wanted]
            if ready:
                return ready
            todo = [i for i in self._pending if i in wanted]
            if not todo:
                raise RuntimeError(f"none of the workers {sorted(wanted)} has a request")
            self._run(todo[0])

    def take(self, worker: int) -> WorkerBatch:
        if worker not in self._ready:
            raise RuntimeError(f"worker {worker} has no batch ready")
        return self._ready.pop(worker)

    def busy(self) -> list[int]:
        return [*self._ready, *self._pending]

    def set_weights(self, weights: TensorDictBase) -> None:
        if self._weights is None:
            self._weights = weights.clone()
        else:
            self._weights.update_(weights)
        self._version += 1

    def restart(self, worker: int) -> None:
        self._core(worker).restart()

    def load_ids_state(self, worker: int, state: dict[str, Any]) -> None:
        self._core(worker).load_ids_state(state)

    def replace(self, worker: int, spec: WorkerSpec, timeout: float) -> WorkerInfo:
        old = self._cores[worker]
        self._cores[worker] = None
        if old is not None:
            old.close()
        self._failed.pop(worker, None)
        self._pending.pop(worker, None)
        self._ready.pop(worker, None)
        self.specs[worker] = spec
        core = WorkerCore(spec)
        core.configure(self._steps[worker])
        self._cores[worker] = core
        self._loaded[worker] = -1
        return core.info

    def close(self, timeout: float) -> list[int]:
        if self._closed:
            return []
        self._closed = True
        self.interrupted = True
        for i, core in enumerate(self._cores):
            if core is not None:
                self._cores[i] = None
                self.final_frames[i] = core.frames
                core.close()
        return []


register_backend("inline", lambda specs, weights, options: InlinePool(specs, weights))
