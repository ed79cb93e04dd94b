"""The ``"ray"`` backend: each worker a Ray actor, batches through Ray's object store.

``MultiSyncCollector(..., backend="ray")`` and ``MultiAsyncCollector(..., backend="ray")`` run
one :class:`~splice.collectors._worker.WorkerCore` per Ray actor (:class:`RayWorker`), on
whatever nodes Ray places them; this module is imported only when a collector asks for that
backend, and it is the only collectors module that imports ``ray``.

**Actors.** Each actor reserves ``num_cpus=1`` by default; ``backend_options`` are Ray's actor
options (``num_cpus``, ``num_gpus``, ``memory``, ``resources``, ``runtime_env``,
``scheduling_strategy``, ...), checked by Ray at construction. Options that would change the
pool's rules are refused: ``max_restarts``/``max_task_retries`` (a restarted actor would
silently lose its episodes and id counter: use the collector's ``restart_workers``),
``max_concurrency`` (requests must run one at a time, in order), ``lifetime``, ``name``,
``get_if_exists``. If Ray is not initialised, the pool calls ``ray.init()`` (a local
instance, as any Ray API would); to use a cluster, call ``ray.init(address=...)`` first.

**Messages and data.** A request is one actor call. When its terms change (random actions
or the policy; weights the worker was not sent yet) it is ``collect(random_actions, version,
weights)``; otherwise it is ``collect_next()``, with no argument at all: Ray serialises each
argument of a call on its own, which cost ~0.1 ms of the caller's CPU per call for the three
small ones (0.13 ms vs 0.04 ms to submit a call, measured). The reply carries the batch (in
:func:`splice._remote.pack` form), the returns of the episodes that ended, the id counter and
the frame count, pickled by the actor into one ``bytes`` object (numpy arrays in band), which
Ray sends as it is: Ray's own serialiser (cloudpickle, with a Python hook per object) cost
~0.2 ms more CPU per reply of a 500-frame CartPole batch, and a sync batch of 2 workers is 2
replies; the arrays unpickled from it are fresh, so :meth:`~RayPool.take` uses them without
another copy. The rest of Ray's cost per actor call (submitting it, the reply's trip, the
actor's task machinery and its threads) is 1.3-1.8 ms of CPU on this project's loaded 2-core
test machine, the floor of the backend's per-batch overhead (``benchmarks/bench_parallel.py``
measures it as "Ray's calls alone"; docs/benchmarks.rst has what else was tried). With
:meth:`~RayPool.keep_batches_remote` the actor instead puts the batch into its node's object
store (``ray.put``) and replies with the object reference only: a replay buffer served by a
Ray actor (:class:`~splice.RayReplayBuffer`) then reads it from there, and the batch never
passes through the collector's process; :meth:`~RayPool.fetch` copies such a batch out of
Ray's read-only memory once (:func:`~splice._remote.unpack`).

**Weights** are put into the object store once per :meth:`~RayPool.set_weights` (numpy form)
with a version number; the first request to a worker after that is a ``collect`` call
carrying the version and the reference. The actor loads them before its batch when the
version differs from the one it loaded: weights change between batches, never within one.

**Faults and shutdown.** An actor catches its own exceptions and replies with the traceback
text; a dead actor (killed, its node lost) makes its pending reply raise
``RayActorError``. Both become :class:`~splice.WorkerError` (index and traceback) in
:meth:`~RayPool.wait`, and the failed actor is ended (``ray.kill``). :meth:`~RayPool.close`
asks every actor to close (an actor finishes the batch under way first) and waits up to 60% of
the timeout for the answers (not for busy actors after :meth:`~RayPool.interrupt`: the
collector's ``shutdown()`` already waited for their batch, they are stuck); it kills at once
the actors that did not answer (an exit request would queue behind the call they are in),
asks the others to exit (an intended exit, which Ray does not report as a dead worker; killed
after :data:`splice._remote.EXIT_GRACE` if still there), and waits until the actors' processes
on this node are gone. At interpreter exit a hook ends
every pool's actors still alive (:data:`splice._remote.ACTORS`).
"""

from __future__ import annotations

import itertools
import pickle
import threading
import time
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
from tensordict import TensorDict, TensorDictBase

from splice._remote import (
    ACTORS,
    end_actors,
    exit_actor,
    node_is_local,
    pack,
    require_ray,
    unpack,
)
from splice.collectors._pool import (
    BUSY,
    CLOSED,
    FAILED,
    IDLE,
    READY,
    WorkerBatch,
    WorkerPool,
    ready_or_raise,
    register_backend,
)
from splice.collectors._worker import (
    WorkerCore,
    WorkerError,
    WorkerInfo,
    WorkerSpec,
    format_exception,
    init_worker_process,
    pickle_spec,
)
from splice.collectors.background import StopCollection

ray = require_ray()

__all__ = ["DEFAULT_ACTOR_OPTIONS", "RayPool", "RayWorker"]

#: Ray actor options of every worker unless ``backend_options`` say otherwise.
DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1}
#: Actor options that would break the pool's rules (see the module docstring).
REFUSED_OPTIONS = {
    "max_restarts": "use restart_workers=True: a restarted actor loses its episodes and ids",
    "max_task_retries": "a retried batch would be collected twice",
    "max_concurrency": "a worker serves its requests one at a time, in order",
    "allow_out_of_order_execution": "a worker serves its requests one at a time, in order",
    "lifetime": "the collector ends its actors",
    "name": "the collector names no actor",
    "get_if_exists": "the collector starts its own actors",
}
_POLL = 0.1  # seconds between checks for interrupt() while waiting for actors
_IDLE, _BUSY, _READY, _FAILED, _CLOSED = IDLE, BUSY, READY, FAILED, CLOSED


class RayWorker:
    """The body of a worker actor: a :class:`~splice.collectors._worker.WorkerCore` built from
    a pickled spec, serving the pool's calls one at a time. Every method returns
    ``("error", traceback)`` instead of raising, so the pool reports the worker's own
    traceback."""

    def __init__(self) -> None:
        self.core: WorkerCore | None = None
        self.version = -1  # the weights version loaded
        self.random_actions = False  # the kind of batch collect_next() collects
        self.keep = False  # whether batches stay in the object store (keep_batches_remote)

    def _core(self) -> WorkerCore:
        if self.core is None:
            raise RuntimeError("the worker has no core (build failed or closed)")
        return self.core

    def build(self, spec_bytes: bytes) -> tuple[Any, ...]:
        try:
            spec = cloudpickle.loads(spec_bytes)
            init_worker_process(spec)
            self.core = WorkerCore(spec)
            return ("hello", self.core.info, ray.get_runtime_context().get_node_id())
        except BaseException as error:
            return ("error", format_exception(error))

    def configure(self, steps: int, keep: bool) -> tuple[Any, ...]:
        try:
            self._core().configure(steps)
            self.keep = keep
            return ("done",)
        except BaseException as error:
            return ("error", format_exception(error))

    def collect(
        self, random_actions: bool, version: int, weights: list[Any] | None
    ) -> tuple[Any, ...] | bytes:
        """A batch, after taking the request's terms: random actions or the policy from now
        on, and (``weights``: a list of one reference) the weights of ``version``."""
        try:
            self.random_actions = random_actions
            if weights is not None and version != self.version:
                self._core().load_weights(unpack(ray.get(weights[0])))
                self.version = version
        except BaseException as error:
            return ("error", format_exception(error))
        return self.collect_next()

    def collect_next(self) -> tuple[Any, ...] | bytes:
        """A batch on the terms of the last :meth:`collect`: the call the pool makes when
        they did not change, with no argument for Ray to serialise."""
        try:
            core = self._core()
            batch, returns = core.collect(self.random_actions)
            data = pack(batch)
            if self.keep:  # a list: the reference stays one; Ray serialises it (it counts refs)
                return ("batch", [ray.put(data)], returns, core.ids_state(), core.frames)
            reply = ("batch", data, returns, core.ids_state(), core.frames)
            try:  # bytes, which Ray sends as they are (see the module docstring)
                return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError):
                return reply  # e.g. an info value only cloudpickle can pickle: Ray's way
        except BaseException as error:
            return ("error", format_exception(error))

    def restart(self) -> tuple[Any, ...]:
        try:
            self._core().restart()
            return ("done",)
        except BaseException as error:
            return ("error", format_exception(error))

    def load_ids_state(self, state: dict[str, Any]) -> tuple[Any, ...]:
        try:
            self._core().load_ids_state(state)
            return ("done",)
        except BaseException as error:
            return ("error", format_exception(error))

    def close(self) -> int:
        core, self.core = self._core(), None
        frames = core.frames
        core.close()
        return frames

    def exit(self) -> None:
        """End this actor's process (an intended exit: see :func:`splice._remote.end_actors`)."""
        exit_actor()


_RemoteWorker = ray.remote(RayWorker)


@dataclass
class _Actor:
    index: int
    handle: Any
    state: str = _IDLE
    pid: int | None = None
    local: bool = False
    info: WorkerInfo | None = None
    seq: int = 0
    pending: Any = None  # the ObjectRef of the outstanding collect
    reply: tuple[Any, ...] | None = None
    failure: WorkerError | None = None
    sent_version: int = 0  # the weights version this actor was last sent
    sent_random: bool | None = None  # the random_actions of its last collect (None: none yet)


def check_actor_options(options: dict[str, Any]) -> dict[str, Any]:
    """The actor options of the workers: the defaults updated with ``options`` (checked).

    Raises:
        ValueError: an option the pool refuses, or one Ray does not know.
        TypeError: an option of the wrong type (Ray's check).
    """
    for key, why in REFUSED_OPTIONS.items():
        if key in options:
            raise ValueError(f"the ray backend does not take the actor option {key!r}: {why}")
    merged = {**DEFAULT_ACTOR_OPTIONS, **options}
    _RemoteWorker.options(**merged)  # Ray checks names and types here
    return merged


class RayPool(WorkerPool):
    """Workers as Ray actors (see the module docstring).

    Args:
        specs: one spec per worker (pickled with cloudpickle).
        weights: the policy's weights, sent to every worker before its first batch, or
            ``None``.
        actor_options: Ray actor options for every worker (default ``{"num_cpus": 1}``).

    Raises:
        ValueError, TypeError: bad actor options.
        TypeError: a spec that cannot be pickled (the message names the policy or the env).

    The pool protocol is exercised by ``tests/collectors/test_pool.py`` (its ``"ray"``
    parameter), and the collectors on top of it by ``tests/collectors/test_ray.py``; the
    public example is :class:`~splice.RayReplayBuffer`'s.
    """

    fresh_batches = True  # unpack() copies each batch out of Ray's memory

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        weights: TensorDictBase | None,
        *,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(specs, weights)
        self.actor_options = check_actor_options(dict(actor_options or {}))
        self._spec_bytes = [pickle_spec(spec) for spec in self.specs]
        self._initial_weights = weights
        self._weights_ref: Any = None
        self._version = 0
        self._keep = False
        self._actors: list[_Actor] = []
        self._steps: list[int] = []
        self._unreported: list[int] = []
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self._closed = False

    # ------------------------------------------------------------------- actors
    def _launch(self, index: int) -> tuple[_Actor, Any]:
        handle = _RemoteWorker.options(**self.actor_options).remote()
        return _Actor(index, handle), handle.build.remote(self._spec_bytes[index])

    def _hello(self, actor: _Actor, reply: tuple[Any, ...]) -> None:
        _, info, node = reply
        actor.info = info
        actor.pid = info.pid
        actor.local = node_is_local(node)

    def start(self, timeout: float) -> list[WorkerInfo]:
        if not ray.is_initialized():
            ray.init()
        self._warn_if_too_big()
        ACTORS.add(self)
        if self._initial_weights is not None:
            self.set_weights(self._initial_weights)
            self._initial_weights = None
        with self._lock:
            launched = [self._launch(i) for i in range(self.num_workers)]
            self._actors = [actor for actor, _ in launched]
        try:
            self._gather({ref: actor for actor, ref in launched}, timeout, "start", self._hello)
        except BaseException:
            self.close(timeout=10)
            raise
        return [actor.info for actor in self._actors if actor.info is not None]

    def _warn_if_too_big(self) -> None:
        cpus = self.actor_options.get("num_cpus") or 0
        have = ray.cluster_resources().get("CPU", 0)
        if cpus * self.num_workers > have:
            warnings.warn(
                f"{self.num_workers} Ray workers ask for num_cpus={cpus} each, but the Ray "
                f"cluster has {have:g} CPUs: they cannot all be placed (unless it grows). Pass "
                "backend_options={'num_cpus': ...} or start Ray with more CPUs",
                RuntimeWarning,
                stacklevel=4,
            )

    def _gather(self, refs: dict[Any, _Actor], timeout: float, what: str, on_reply: Any) -> None:
        """Wait for the replies ``refs`` (one per actor); ``on_reply(actor, reply)`` for each;
        raise the first failure at once."""
        deadline = time.monotonic() + timeout
        pending = dict(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(actor.index for actor in pending.values())
                raise TimeoutError(
                    f"Ray workers {late} did not {what} within {timeout} s (can the cluster "
                    f"place {self.num_workers} actors with {self.actor_options}? "
                    f"ray.available_resources() = {ray.available_resources()})"
                )
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=min(left, 1.0))
            for ref in done:
                actor = pending.pop(ref)
                reply = self._reply(actor, ref)
                if reply is None:
                    assert actor.failure is not None
                    with self._lock:
                        if actor.index in self._unreported:
                            self._unreported.remove(actor.index)
                    raise actor.failure
                on_reply(actor, reply)

    def _reply(self, actor: _Actor, ref: Any) -> tuple[Any, ...] | None:
        """The reply of ``ref``, or ``None`` after recording the actor's failure."""
        try:
            reply = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            where = "" if actor.pid is None else f" (pid {actor.pid})"
            self._fail(actor, f"the worker actor{where} died unexpectedly: {error}")
            return None
        except ray.exceptions.RayError as error:
            self._fail(actor, str(error))
            return None
        if isinstance(reply, bytes):  # a batch (RayWorker.collect)
            reply = pickle.loads(reply)
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            self._fail(actor, reply[1])
            return None
        return reply

    def _fail(self, actor: _Actor, text: str) -> None:
        with self._lock:
            actor.failure = WorkerError(actor.index, text)
            actor.state = _FAILED
            actor.pending = actor.reply = None
            self._unreported.append(actor.index)
        ray.kill(actor.handle, no_restart=True)  # a failed worker is ended

    def _call(self, worker: int, method: str, *args: Any) -> None:
        """Run ``method`` on an idle worker and wait for it (failures raise)."""
        actor = self._actors[worker]
        if self._closed:
            raise StopCollection
        if actor.failure is not None:
            raise actor.failure
        ref = getattr(actor.handle, method).remote(*args)
        if self._reply(actor, ref) is None:
            with self._lock:
                self._unreported.remove(worker)
            assert actor.failure is not None
            raise actor.failure

    # ------------------------------------------------------------------ protocol
    def keep_batches_remote(self) -> bool:
        self._keep = True
        return True

    def fetch(self, part: WorkerBatch) -> TensorDict:
        if part.batch is not None:
            return part.batch
        batch: TensorDict = unpack(ray.get(part.remote))
        return batch

    def configure(self, steps: Sequence[int]) -> None:
        self._steps = list(steps)
        refs = {
            a.handle.configure.remote(self._steps[a.index], self._keep): a for a in self._actors
        }
        self._gather(refs, 120.0, "configure", lambda actor, reply: None)

    def request(self, worker: int, *, random_actions: bool) -> None:
        with self._lock:
            if self._closed:
                raise StopCollection  # a collection thread racing shutdown(): it just stops
            actor = self._actors[worker]
            if actor.failure is not None:
                raise actor.failure
            if actor.state != _IDLE:
                raise RuntimeError(f"worker {worker} is {actor.state}; it cannot take a request")
            version, ref = self._version, self._weights_ref
            random_actions = bool(random_actions)
            if ref is not None and actor.sent_version != version:
                actor.pending = actor.handle.collect.remote(random_actions, version, [ref])
            elif random_actions != actor.sent_random:
                actor.pending = actor.handle.collect.remote(random_actions, version, None)
            else:  # the same terms as its last batch: a call without arguments
                actor.pending = actor.handle.collect_next.remote()
            actor.sent_version, actor.sent_random = version, random_actions
            actor.state = _BUSY
            actor.seq = next(self._seq)

    def wait(self, workers: Collection[int], timeout: float | None = None) -> list[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = [self._actors[i] for i in workers]
        while True:
            with self._lock:
                ready = ready_or_raise(self.interrupted, self._actors, wanted, self._unreported)
                if ready:
                    return ready
                # Every busy actor, not only the wanted ones: a failure anywhere is reported.
                pending = {a.pending: a for a in self._actors if a.state == _BUSY}
            left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"no batch ready within {timeout} s")
            done, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            if done:
                done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in done:
                self._resolve(pending[ref], ref)

    def _resolve(self, actor: _Actor, ref: Any) -> None:
        if actor.pending is not ref or actor.state != _BUSY:
            return  # replaced or closed meanwhile
        reply = self._reply(actor, ref)
        if reply is not None:
            with self._lock:
                actor.reply = reply
                actor.state = _READY

    def take(self, worker: int) -> WorkerBatch:
        with self._lock:
            actor = self._actors[worker]
            if actor.state != _READY or actor.reply is None:
                raise RuntimeError(f"worker {worker} has no batch ready (it is {actor.state})")
            reply, actor.reply, actor.pending = actor.reply, None, None
            actor.state = _IDLE
        _, payload, returns, ids_state, frames = reply
        if self._keep:
            return WorkerBatch(None, returns, ids_state, frames, remote=payload[0])
        # Unpickled from the actor's bytes: the arrays are fresh, only Ray's are copied.
        return WorkerBatch(unpack(payload, copy=False), returns, ids_state, frames)

    def busy(self) -> list[int]:
        with self._lock:
            active = [a for a in self._actors if a.state in (_BUSY, _READY)]
            return [actor.index for actor in sorted(active, key=lambda a: a.seq)]

    def set_weights(self, weights: TensorDictBase) -> None:
        ref = ray.put(pack(weights))  # copies now: later changes of `weights` do not leak
        with self._lock:
            self._weights_ref = ref
            self._version += 1

    def restart(self, worker: int) -> None:
        self._call(worker, "restart")

    def load_ids_state(self, worker: int, state: dict[str, Any]) -> None:
        self._call(worker, "load_ids_state", dict(state))

    def replace(self, worker: int, spec: WorkerSpec, timeout: float) -> WorkerInfo:
        with self._lock:
            old = self._actors[worker]
            ray.kill(old.handle, no_restart=True)
            old.state, old.pending, old.reply = _CLOSED, None, None
            if worker in self._unreported:
                self._unreported.remove(worker)
            self.specs[worker] = spec
            self.final_frames[worker] = None
            self._spec_bytes[worker] = pickle_spec(spec)
            new, ref = self._launch(worker)
            self._actors[worker] = new
        self._gather({ref: new}, timeout, "start", self._hello)
        configured = new.handle.configure.remote(self._steps[worker], self._keep)
        self._gather({configured: new}, timeout, "configure", lambda actor, reply: None)
        assert new.info is not None
        return new.info

    def close(self, timeout: float) -> list[int]:
        if self._closed:
            return []
        start = time.monotonic()
        with self._lock:
            # interrupt() came first: shutdown() already waited for the batches under way,
            # and the busy actors are stuck; they are not waited for again.
            stuck = self.interrupted
            self.interrupted = True  # a thread waiting in wait() leaves it
            self._closed = True
            live = [a for a in self._actors if a.state not in (_FAILED, _CLOSED)]
            busy_at_close = {a.index for a in live if a.state == _BUSY}
            closing = {a.handle.close.remote(): a for a in live}
        ACTORS.discard(self)
        # 1. Let them finish their batch and say goodbye.
        answered: set[int] = set()
        soft = start + 0.6 * timeout
        while closing and time.monotonic() < soft:
            if stuck and all(actor.index in busy_at_close for actor in closing.values()):
                break
            done, _ = ray.wait(list(closing), num_returns=1, timeout=soft - time.monotonic())
            for ref in done:
                actor = closing.pop(ref)
                try:
                    self.final_frames[actor.index] = int(ray.get(ref))
                    answered.add(actor.index)
                except ray.exceptions.RayError:
                    pass  # it died meanwhile: nothing to count
        forced = sorted(i for i in busy_at_close if i not in answered)
        # 2. End every actor (its process): those that answered exit, those that did not are
        # busy with a call they will not finish in time, and are killed; 3. wait until those
        # of this node are gone.
        silent = {actor.index for actor in closing.values()}
        self.end_actors(start + timeout, unresponsive=silent)
        return forced

    def end_actors(self, deadline: float, unresponsive: Collection[int] = ()) -> None:
        """End every actor and wait (until ``deadline``) for those on this node to end:
        :meth:`close`'s last step, and what happens at interpreter exit. The actors of the
        workers ``unresponsive`` are killed at once (an exit request would wait behind the
        call they are stuck in); the others are asked to exit first
        (:func:`splice._remote.end_actors`)."""
        with self._lock:
            self._closed = True
            self.interrupted = True
            actors = list(self._actors)
            for actor in actors:
                actor.state = _CLOSED if actor.state != _FAILED else _FAILED
                actor.pending = actor.reply = None
            self._weights_ref = None
        ACTORS.discard(self)
        local = [a.pid for a in actors if a.local and a.pid is not None]
        kill = [a.handle for a in actors if a.index in unresponsive]
        ask = [a.handle for a in actors if a.index not in unresponsive]
        end_actors(ask, local, deadline, kill_now=kill)


def _make(
    specs: Sequence[WorkerSpec], weights: TensorDictBase | None, options: dict[str, Any]
) -> RayPool:
    options = dict(options)
    options.pop("start_method", None)  # the process backend's (mp_start_method)
    return RayPool(specs, weights, actor_options=options)


register_backend("ray", _make)
