"""The ``"process"`` backend: one worker process per worker, batches through shared memory.

**Transport.** Control messages travel over one duplex pipe per worker and are small
(``("collect", random_actions)``, ``("batch", returns, ids_state, frames, slot)``, ...). Batches
never go through a pipe: after its first batch a worker moves a copy of it into shared
memory (torch shared-memory tensors: anonymous, freed when the last process drops them, so a
killed worker leaks nothing) and sends that *slot* once; from then on it copies each new batch
into the slot and sends only the small ``"batch"`` message. The slot is reused: the worker
writes it only while it holds a request, and the parent copies the batch out before it grants
the next one, so a batch handed to the caller is never overwritten.

**Weights.** The policy's parameters and buffers live in shared memory next to a version
counter (a sequence lock: the writer makes it odd while it copies, even when done). A worker
compares the version with the one it loaded before each batch, copies the weights into its
policy when it changed, and retries if a write overlapped its copy. Weights therefore change
between batches, never within one.

**Processes.** Workers start with the ``forkserver`` method by default (``spawn`` on request);
``fork`` is refused (unsafe once torch has started threads). The forkserver preloads splice,
torch, tensordict and gymnasium once, so a worker starts in tens of milliseconds after the
first. Workers are not daemonic (so their envs may start processes, e.g. ``AsyncVectorEnv``),
ignore SIGINT (the caller coordinates shutdown), and exit by themselves when the parent dies.
:meth:`ProcessPool.close` asks each worker to stop, then terminates, then kills, within its
timeout; an ``atexit`` hook, registered after multiprocessing's own, closes every pool still
open at interpreter exit before multiprocessing joins its children.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from typing import Any

import cloudpickle
import torch
import torch.multiprocessing
from tensordict import TensorDict, TensorDictBase

from splice.collectors._pool import WorkerBatch, WorkerPool, register_backend
from splice.collectors._worker import (
    WorkerCore,
    WorkerError,
    WorkerInfo,
    WorkerSpec,
    format_exception,
    init_worker_process,
)
from splice.collectors.background import StopCollection

__all__ = ["START_METHODS", "ProcessPool", "SharedWeights"]

#: The start methods a pool accepts (both safe with torch).
START_METHODS = ("forkserver", "spawn")
_POLL = 0.1  # seconds between checks for interrupt() while waiting for workers
_IDLE, _BUSY, _READY, _FAILED, _CLOSED = "idle", "busy", "ready", "failed", "closed"


# --------------------------------------------------------------------------- weights
class SharedWeights:
    """Policy weights in shared memory, with a version counter used as a sequence lock.

    Args:
        weights: the weights to share (copied).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> shared = SharedWeights(TensorDict({"w": torch.zeros(2)}, []))
        >>> shared.write(TensorDict({"w": torch.ones(2)}, []))
        >>> int(shared.version), shared.tensors["w"]
        (2, tensor([1., 1.]))
        >>> into = TensorDict({"w": torch.zeros(2)}, [])
        >>> read_weights(shared.tensors, shared.version, into.update_, seen=-1)
        2
        >>> into["w"]
        tensor([1., 1.])
    """

    def __init__(self, weights: TensorDictBase) -> None:
        self.tensors = weights.detach().clone().share_memory_()
        self.version = torch.zeros((), dtype=torch.int64).share_memory_()
        self._lock = threading.Lock()

    def write(self, weights: TensorDictBase) -> None:
        """Copy ``weights`` in (odd version while copying, even after)."""
        with self._lock:
            self.version.add_(1)
            try:
                self.tensors.update_(weights)
            finally:
                self.version.add_(1)


def read_weights(tensors: TensorDictBase, version: torch.Tensor, load: Any, seen: int) -> int:
    """Load the shared weights with ``load(tensors)`` if their version is not ``seen``;
    retry while a write is under way or overlapped the copy. Returns the version loaded."""
    while True:
        current = int(version)
        if current == seen:
            return seen
        if current % 2:  # a write is under way
            time.sleep(0.0002)
            continue
        load(tensors)
        if int(version) == current:
            return current


# ---------------------------------------------------------------------- worker side
def _watch_parent() -> None:
    """Exit when the parent process dies (even while the worker is busy in its env)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="splice-parent-watch", daemon=True).start()


def _batch_signature(batch: TensorDictBase) -> tuple[Any, ...]:
    return tuple(
        (key, tuple(value.shape), value.dtype)
        for key, value in batch.items(include_nested=True, leaves_only=True)
    )


def worker_main(
    conn: connection.Connection,
    spec_bytes: bytes,
    weights: TensorDictBase | None,
    version: torch.Tensor | None,
) -> None:
    """The body of a worker process: build the core from the spec, then serve requests until
    ``"close"`` or the parent goes away. Any exception is reported with its traceback and
    ends the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent()
    core: WorkerCore | None = None
    try:
        spec = cloudpickle.loads(spec_bytes)
        init_worker_process(spec)
        core = WorkerCore(spec)
        conn.send(("hello", core.info))
        _serve(conn, core, weights, version)
    except BaseException as error:
        with contextlib.suppress(Exception):
            conn.send(("error", format_exception(error)))
    finally:
        if core is not None:
            with contextlib.suppress(Exception):
                core.close()
        conn.close()


def _serve(
    conn: connection.Connection,
    core: WorkerCore,
    weights: TensorDictBase | None,
    version: torch.Tensor | None,
) -> None:
    slot: TensorDict | None = None
    slot_leaves: list[tuple[Any, torch.Tensor]] = []
    signature: tuple[Any, ...] = ()
    seen = -1
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return  # the parent is gone
        kind = message[0]
        if kind == "collect":
            if weights is not None and version is not None:
                seen = read_weights(weights, version, core.load_weights, seen)
            batch, returns = core.collect(message[1])
            new_slot = None
            if slot is None or _batch_signature(batch) != signature:
                # The first batch (or a new layout): it becomes the slot, sent once.
                signature = _batch_signature(batch)
                slot = batch.share_memory_()
                slot_leaves = list(slot.items(include_nested=True, leaves_only=True))
                new_slot = slot
            else:
                for key, target in slot_leaves:
                    target.copy_(batch.get(key))
            conn.send(("batch", returns, core.ids_state(), core.frames, new_slot))
        elif kind == "configure":
            core.configure(message[1])
            conn.send(("configured",))
        elif kind == "restart":
            core.restart()
        elif kind == "load_ids":
            core.load_ids_state(message[1])
        elif kind == "close":
            conn.send(("closed", core.frames))
            return
        else:
            raise RuntimeError(f"unknown message {kind!r}")


# ---------------------------------------------------------------------- parent side
@dataclass
class _Worker:
    index: int
    spec: WorkerSpec
    process: BaseProcess
    conn: connection.Connection
    state: str = _IDLE
    info: WorkerInfo | None = None
    configured: bool = False
    seq: int = 0
    slot: TensorDict | None = None
    result: WorkerBatch | None = None
    failure: WorkerError | None = None
    final_frames: int | None = None


_live_pools: weakref.WeakSet[ProcessPool] = weakref.WeakSet()
#: Seconds :func:`_close_at_exit` gives each pool.
EXIT_TIMEOUT = 10.0


def _close_at_exit() -> None:
    """Close every open pool within ``EXIT_TIMEOUT`` in all (not per pool): every worker is
    asked to stop first, then the pools are closed against one shared deadline."""
    start = time.monotonic()
    pools = list(_live_pools)
    for pool in pools:
        pool.interrupt()
        with contextlib.suppress(Exception):
            pool.ask_to_close()
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close(EXIT_TIMEOUT, since=start)


# Registered after multiprocessing's own exit hook (imported above), so it runs BEFORE it:
# multiprocessing joins non-daemonic children at exit, which would wait forever for workers
# that were never told to stop.
atexit.register(_close_at_exit)


class ProcessPool(WorkerPool):
    """Workers in their own processes (see the module docstring).

    Args:
        specs: one spec per worker (pickled with cloudpickle).
        weights: the policy's weights, shared with every worker, or ``None``.
        start_method: ``"forkserver"`` (default) or ``"spawn"``.

    Raises:
        ValueError: another start method.
        TypeError: a spec that cannot be pickled (the message names the policy or the env).

    Examples:
        >>> from splice.collectors._worker import WorkerSpec
        >>> from splice.testing import counting_vec
        >>> specs = [WorkerSpec(index=i, env=lambda: counting_vec([3]), worker_id=60 + i)
        ...          for i in range(2)]
        >>> pool = ProcessPool(specs, None)
        >>> [info.num_envs for info in pool.start(timeout=120)]
        [1, 1]
        >>> pool.configure([4, 4])
        >>> pool.request(0, random_actions=False)
        >>> pool.request(1, random_actions=False)
        >>> sorted(pool.wait([0, 1]) + pool.wait([1]))[-1]
        1
        >>> batch = pool.take(1).batch.clone()  # copy out before the next request
        >>> batch.batch_size, batch["collector", "traj_ids"][0, 0].item() >> 40
        (torch.Size([1, 4]), 61)
        >>> pool.close(timeout=10)
        []
    """

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        weights: TensorDictBase | None,
        *,
        start_method: str = "forkserver",
    ) -> None:
        super().__init__(specs, weights)
        if start_method not in START_METHODS:
            raise ValueError(
                f"mp_start_method must be one of {START_METHODS} (fork is unsafe with torch), "
                f"got {start_method!r}"
            )
        self._spec_bytes = [_pickle_spec(spec) for spec in self.specs]
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # Import once in the fork server; every worker forked from it has them loaded.
            self._ctx.set_forkserver_preload(["splice.collectors._process"])
        self._weights = None if weights is None else SharedWeights(weights)
        self._workers: list[_Worker] = []
        self._steps: list[int] = []
        self._unreported: list[int] = []
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self._closed = False
        self._asked_to_close = False
        self._busy_at_close: set[int] = set()

    # ------------------------------------------------------------- processes
    def _launch(self, index: int, spec_bytes: bytes) -> _Worker:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        weights = None if self._weights is None else self._weights.tensors
        version = None if self._weights is None else self._weights.version
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(child_end, spec_bytes, weights, version),
            name=f"splice-worker-{index}",
            daemon=False,
        )
        process.start()
        child_end.close()
        return _Worker(index, self.specs[index], process, parent_end)

    def start(self, timeout: float) -> list[WorkerInfo]:
        _live_pools.add(self)
        with self._lock:
            self._workers = [self._launch(i, b) for i, b in enumerate(self._spec_bytes)]
        try:
            self._await(lambda w: w.info is not None, self._workers, timeout, "start")
        except BaseException:
            self.close(timeout=10)
            raise
        return [w.info for w in self._workers if w.info is not None]

    def _await(self, done: Any, workers: list[_Worker], timeout: float, what: str) -> None:
        """Pump messages until ``done(w)`` for every worker; raise a failure at once."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                for w in workers:
                    if w.failure is not None:
                        if w.index in self._unreported:
                            self._unreported.remove(w.index)
                        raise w.failure
                pending = [w for w in workers if not done(w)]
                if not pending:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"workers {[w.index for w in pending]} did not {what} within {timeout} s"
                    )
                self._pump(pending, min(_POLL, left))

    def _pump(self, workers: list[_Worker], timeout: float) -> None:
        """Wait up to ``timeout`` for messages or deaths of ``workers``; handle them."""
        handles: dict[Any, _Worker] = {}
        for w in workers:
            if w.state not in (_FAILED, _CLOSED):
                handles[w.conn] = w
                handles[w.process.sentinel] = w
        if not handles:
            return
        for ready in connection.wait(list(handles), timeout):
            w = handles[ready]
            if w.state in (_FAILED, _CLOSED):
                continue
            if ready is w.conn:
                self._receive(w)
            else:
                self._died(w)

    def _receive(self, w: _Worker) -> None:
        try:
            while w.conn.poll():
                self._handle(w, w.conn.recv())
                if w.state in (_FAILED, _CLOSED):
                    return
        except (EOFError, OSError):
            self._died(w)

    def _handle(self, w: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "batch":
            _, returns, ids_state, frames, new_slot = message
            if new_slot is not None:
                w.slot = new_slot
            assert w.slot is not None
            w.result = WorkerBatch(w.slot, returns, ids_state, frames)
            if w.state == _BUSY:
                w.state = _READY
        elif kind == "hello":
            w.info = message[1]
        elif kind == "configured":
            w.configured = True
        elif kind == "closed":
            self.final_frames[w.index] = message[1]
            w.state = _CLOSED
        elif kind == "error":
            self._fail(w, message[1])

    def _fail(self, w: _Worker, text: str) -> None:
        w.failure = WorkerError(w.index, text)
        w.state = _FAILED
        w.result = None
        self._unreported.append(w.index)

    def _died(self, w: _Worker) -> None:
        """The process ended (or its pipe broke): report how, unless it said why itself."""
        if w.state in (_FAILED, _CLOSED):
            return
        try:  # an error message sent just before the exit is still in the pipe
            while w.conn.poll():
                self._handle(w, w.conn.recv())
                if w.state in (_FAILED, _CLOSED):
                    return
        except (EOFError, OSError):
            pass
        w.process.join(1.0)
        code = w.process.exitcode
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        self._fail(w, f"the worker process (pid {w.process.pid}) died unexpectedly: {how}")

    def _send(self, w: _Worker, message: tuple[Any, ...]) -> None:
        if self._closed:
            raise StopCollection  # a collection thread racing shutdown(): it just stops
        if w.state == _FAILED:
            assert w.failure is not None
            raise w.failure
        try:
            w.conn.send(message)
        except (BrokenPipeError, OSError):
            self._died(w)
            if w.index in self._unreported:
                self._unreported.remove(w.index)
            assert w.failure is not None
            raise w.failure from None

    # -------------------------------------------------------------- protocol
    def configure(self, steps: Sequence[int]) -> None:
        self._steps = list(steps)
        with self._lock:
            for w in self._workers:
                self._send(w, ("configure", self._steps[w.index]))
        self._await(lambda w: w.configured, self._workers, 120.0, "configure")

    def request(self, worker: int, *, random_actions: bool) -> None:
        with self._lock:
            w = self._workers[worker]
            if w.state not in (_IDLE, _FAILED):
                raise RuntimeError(f"worker {worker} is {w.state}; it cannot take a request")
            self._send(w, ("collect", bool(random_actions)))
            w.state = _BUSY
            w.seq = next(self._seq)

    def wait(self, workers: Collection[int], timeout: float | None = None) -> list[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = [self._workers[i] for i in workers]
        while True:
            with self._lock:
                if self.interrupted:
                    raise StopCollection
                if self._unreported:
                    failed = self._workers[self._unreported.pop(0)]
                    assert failed.failure is not None
                    raise failed.failure
                for w in wanted:
                    if w.failure is not None:  # reported before, and still needed
                        raise w.failure
                ready = sorted((w for w in wanted if w.state == _READY), key=lambda w: w.seq)
                if ready:
                    return [w.index for w in ready]
                if not any(w.state == _BUSY for w in wanted):
                    states = {w.index: w.state for w in wanted}
                    raise RuntimeError(f"no request outstanding among the workers {states}")
                left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
                if left <= 0:
                    raise TimeoutError(f"no batch ready within {timeout} s")
                self._pump(self._workers, left)

    def take(self, worker: int) -> WorkerBatch:
        with self._lock:
            w = self._workers[worker]
            if w.state != _READY or w.result is None:
                raise RuntimeError(f"worker {worker} has no batch ready (it is {w.state})")
            result, w.result = w.result, None
            w.state = _IDLE
            return result

    def busy(self) -> list[int]:
        with self._lock:
            active = [w for w in self._workers if w.state in (_BUSY, _READY)]
            return [w.index for w in sorted(active, key=lambda w: w.seq)]

    def set_weights(self, weights: TensorDictBase) -> None:
        if self._weights is None:
            raise TypeError("the pool was built without weights (the policy is not an nn.Module)")
        self._weights.write(weights)

    def restart(self, worker: int) -> None:
        with self._lock:
            self._send(self._workers[worker], ("restart",))

    def load_ids_state(self, worker: int, state: dict[str, Any]) -> None:
        with self._lock:
            self._send(self._workers[worker], ("load_ids", dict(state)))

    def replace(self, worker: int, spec: WorkerSpec, timeout: float) -> WorkerInfo:
        with self._lock:
            old = self._workers[worker]
            _end(old.process, 2.0)
            old.conn.close()
            if worker in self._unreported:
                self._unreported.remove(worker)
            self.specs[worker] = spec
            self.final_frames[worker] = None
            self._spec_bytes[worker] = _pickle_spec(spec)
            new = self._launch(worker, self._spec_bytes[worker])
            self._workers[worker] = new
        self._await(lambda w: w.info is not None, [new], timeout, "start")
        with self._lock:
            self._send(new, ("configure", self._steps[worker]))
        self._await(lambda w: w.configured, [new], timeout, "configure")
        assert new.info is not None
        return new.info

    def ask_to_close(self) -> None:
        """Send every live worker ``"close"`` (once); :meth:`close` then waits for them."""
        with self._lock:
            if self._asked_to_close:
                return
            self._asked_to_close = True
            self._busy_at_close = {w.index for w in self._workers if w.state == _BUSY}
            for w in self._workers:
                if w.state not in (_FAILED, _CLOSED) and w.process.exitcode is None:
                    with contextlib.suppress(BrokenPipeError, OSError):
                        w.conn.send(("close",))

    def close(self, timeout: float, *, since: float | None = None) -> list[int]:
        """See :meth:`WorkerPool.close`; the phases (60% of ``timeout`` to stop by
        themselves, then terminate, then kill at 90%) count from ``since`` (a
        ``time.monotonic()`` value; default now)."""
        if self._closed:
            return []
        self.interrupted = True  # a thread waiting in wait() leaves it
        start = time.monotonic() if since is None else since
        self.ask_to_close()
        with self._lock:
            self._closed = True
            _live_pools.discard(self)
            live = [w for w in self._workers if w.process.exitcode is None]
            busy_at_close = self._busy_at_close
            # 1. Let them finish their batch and say goodbye.
            while live and time.monotonic() < start + 0.6 * timeout:
                conns = {w.conn: w for w in live if w.state not in (_FAILED, _CLOSED)}
                left = start + 0.6 * timeout - time.monotonic()
                handles: list[Any] = [*conns, *(w.process.sentinel for w in live)]
                for ready in connection.wait(handles, max(0.0, min(_POLL, left))):
                    if ready in conns:
                        self._receive(conns[ready])  # drain: "batch", "closed"
                live = [w for w in live if w.process.exitcode is None]
            forced = sorted(w.index for w in live if w.index in busy_at_close)
            # 2. Terminate, 3. kill what is left.
            for w in live:
                w.process.terminate()
            _join_all(live, start + 0.9 * timeout)
            for w in live:
                if w.process.exitcode is None:
                    w.process.kill()
            _join_all(live, start + timeout)
            for w in self._workers:
                w.conn.close()
                w.slot = w.result = None
                if w.process.exitcode is not None:
                    w.process.close()
            self._weights = None
            return forced


def _join_all(workers: list[_Worker], deadline: float) -> None:
    for w in workers:
        w.process.join(max(0.0, deadline - time.monotonic()))


def _end(process: BaseProcess, timeout: float) -> None:
    """Terminate (then kill) a process that may still be running."""
    if process.exitcode is None:
        process.terminate()
        process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join(timeout)


def _pickle_spec(spec: WorkerSpec) -> bytes:
    try:
        return cloudpickle.dumps(spec)
    except Exception as error:
        for what, value in (("policy", spec.policy), ("policy_factory", spec.policy_factory)):
            try:
                cloudpickle.dumps(value)
            except Exception:
                raise TypeError(
                    f"the {what} cannot be pickled to send it to worker {spec.index} "
                    f"({type(error).__name__}: {error}); pass a policy_factory that builds it "
                    "in the worker instead"
                ) from error
        raise TypeError(
            f"the env factory of worker {spec.index} cannot be pickled to send it to the "
            f"worker process ({type(error).__name__}: {error})"
        ) from error


def _make(
    specs: Sequence[WorkerSpec], weights: TensorDictBase | None, options: dict[str, Any]
) -> ProcessPool:
    unknown = set(options) - {"start_method"}
    if unknown:
        raise ValueError(f"the process backend takes no option {sorted(unknown)}")
    return ProcessPool(specs, weights, start_method=options.get("start_method", "forkserver"))


register_backend("process", _make)
