"""``RayReplayBuffer``: a :class:`~splice.ReplayBuffer` served by a Ray actor.

The buffer (storage, trajectory index, sampler) lives in one Ray actor; the object you hold
is a handle that sends it calls. The actor runs its calls one at a time, so it is the one
writer of the index: batches extended by several collectors (remote or local) and samples
drawn by the learner are serialized there, and every guarantee of :class:`~splice.ReplayBuffer`
(slices never cross a trajectory or mix writers, ``len()``/``write_count`` exact, samples in
O(batch)) holds unchanged, since it is the same code.

``ray`` is imported when a buffer is created, not when this module is: ``import splice``
never imports Ray.

What crosses the network: ``extend(data)`` sends the data from the caller to the actor;
``extend_refs(refs)`` (what the multi-worker collectors with ``backend="ray"`` call) sends
object references only, and the actor reads each batch from the object store of the node
where a worker made it; ``sample()`` sends the sample back to the caller. Tensors travel as
numpy arrays (:func:`splice._remote.pack`), which Ray moves without pickling.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDictBase

from splice._remote import (
    ACTORS,
    end_actors,
    exit_actor,
    node_is_local,
    pack,
    require_ray,
    unpack,
)
from splice.replay.buffer import ReplayBuffer
from splice.replay.samplers import Sampler
from splice.replay.storage import Storage

__all__ = ["DEFAULT_BUFFER_OPTIONS", "RayReplayBuffer"]

#: Ray actor options of the buffer's actor unless ``actor_options`` say otherwise: it holds
#: no CPU (it works only when called), so it never competes with collector workers for a
#: place.
DEFAULT_BUFFER_OPTIONS: dict[str, Any] = {"num_cpus": 0}
_REFUSED = {
    "max_restarts": "a restarted actor would come back empty",
    "max_task_retries": "a retried extend would write its batch twice",
}


class BufferActor:
    """The body of the buffer's actor: a :class:`~splice.ReplayBuffer` and its methods, with
    data in :func:`~splice._remote.pack` form both ways."""

    def __init__(self) -> None:
        self.rb: ReplayBuffer | None = None

    def _rb(self) -> ReplayBuffer:
        if self.rb is None:
            raise RuntimeError("the replay buffer was not built")
        return self.rb

    def build(self, kwargs_bytes: bytes) -> tuple[int, str]:
        kwargs = cloudpickle.loads(kwargs_bytes)
        for name, kind in (("storage", Storage), ("sampler", Sampler)):
            value = kwargs.get(name)
            if value is not None and not isinstance(value, kind) and callable(value):
                kwargs[name] = value()  # a factory: built here, on the actor's node
        self.rb = ReplayBuffer(**kwargs)
        return os.getpid(), require_ray().get_runtime_context().get_node_id()

    def extend(self, data: Any) -> Any:
        return pack(self._rb().extend(unpack(data)))

    def extend_refs(self, refs: list[Any]) -> None:
        parts = [unpack(part) for part in require_ray().get(list(refs))]
        if len(parts) == 1:
            batch = parts[0]
        else:  # a sync collector's parts: [B_k, T] (or [T]) joined along the env rows
            batch = torch.cat([p if p.ndim == 2 else p.unsqueeze(0) for p in parts], 0)
        self._rb().extend(batch)

    def add(self, data: Any) -> int:
        return self._rb().add(unpack(data))

    def sample(self, batch_size: int | None, return_info: bool, as_sequences: bool | None) -> Any:
        rb = self._rb()
        if return_info:
            return pack(rb.sample(batch_size, return_info=True, as_sequences=as_sequences))
        return pack(rb.sample(batch_size, as_sequences=as_sequences))

    def sizes(self) -> tuple[int, int]:
        rb = self._rb()  # the actor runs one call at a time: both numbers of one moment
        return len(rb), rb.write_count

    def batch_size(self) -> int | None:
        return self._rb().batch_size

    def update_priority(self, index: Any, priority: Any) -> None:
        self._rb().update_priority(unpack(index), unpack(priority))

    def empty(self) -> None:
        self._rb().empty()

    def state_dict(self) -> Any:
        return pack(self._rb().state_dict())

    def load_state_dict(self, state: Any) -> None:
        self._rb().load_state_dict(unpack(state))

    def dumps(self, path: str) -> None:
        self._rb().dumps(path)

    def loads(self, path: str) -> None:
        self._rb().loads(path)

    def exit(self) -> None:
        """End this actor's process (an intended exit: see :func:`splice._remote.end_actors`)."""
        exit_actor()


_remote_class: Any = None
_class_lock = threading.Lock()


def _actor_class() -> Any:
    """``ray.remote(BufferActor)``, made once (and only when a buffer is created)."""
    global _remote_class
    with _class_lock:
        if _remote_class is None:
            _remote_class = require_ray().remote(BufferActor)
        return _remote_class


class RayReplayBuffer:
    """A :class:`~splice.ReplayBuffer` served by a Ray actor, that collectors on any node
    extend and the learner samples.

    The arguments are :class:`~splice.ReplayBuffer`'s; the buffer is built in the actor. A
    storage or sampler may also be given as a zero-argument factory (e.g.
    ``functools.partial(LazyMemmapStorage, 10**6, scratch_dir="/data/rb")``), called in the
    actor: use one for a storage that keeps files, so that they are made on the actor's
    node. Everything else travels to the actor pickled (cloudpickle).

    The handle is picklable: a copy sent to another process or Ray task (e.g. a remote
    collector) extends and samples the same buffer; only the handle that created the actor
    ends it (:meth:`shutdown`, or interpreter exit). Methods wait for the actor's answer;
    errors raised in the actor are raised here with their original type (and the actor's
    traceback in the message). ``dumps``/``loads`` paths are on the actor's node.

    A multi-worker collector with ``backend="ray"`` given this buffer as ``replay_buffer``
    writes each batch with :meth:`extend_refs`: the batch goes from the worker's node to the
    actor, never through the collector's process (``collector.remote_writes`` is True).

    Args:
        storage: as :class:`~splice.ReplayBuffer`, or a factory of one.
        sampler: as :class:`~splice.ReplayBuffer`, or a factory of one.
        batch_size: as :class:`~splice.ReplayBuffer`.
        generator: as :class:`~splice.ReplayBuffer`.
        actor_options: Ray actor options of the buffer's actor (default ``{"num_cpus": 0}``,
            e.g. add ``"resources"`` or a ``"scheduling_strategy"`` to choose its node).

    Raises:
        ValueError, TypeError: as :class:`~splice.ReplayBuffer`'s, raised by the actor; or
            actor options Ray or the buffer refuses (``max_restarts``, ``max_task_retries``).
        ImportError: ray is not installed (``pip install 'splice-rl[ray]'``).

    Examples:
        Two Ray workers collect CartPole into a buffer actor while this process samples:

        >>> import gymnasium as gym
        >>> import ray
        >>> from splice import (LazyTensorStorage, MultiSyncCollector, RayReplayBuffer,
        ...                     SliceSampler)
        >>> _ = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
        ...              _node_ip_address="127.0.0.1", ignore_reinit_error=True)
        >>> rb = RayReplayBuffer(storage=LazyTensorStorage(10_000),
        ...                      sampler=SliceSampler(slice_len=8, seed=0), batch_size=64)
        >>> collector = MultiSyncCollector(
        ...     lambda: gym.make("CartPole-v1"), num_workers=2, frames_per_batch=250,
        ...     total_frames=2_000, replay_buffer=rb, backend="ray",
        ...     backend_options={"num_cpus": 0.5}, seed=0)
        >>> collector.remote_writes  # batches go worker -> buffer actor, not through here
        True
        >>> collector.start()
        >>> collector.wait(timeout=120)
        >>> collector.shutdown()
        >>> len(rb), rb.write_count
        (2000, 2000)
        >>> sample = rb.sample()
        >>> sample.batch_size, bool((sample["collector", "traj_ids"].view(8, 8).diff(1) == 0).all())
        (torch.Size([64]), True)
        >>> rb.shutdown()  # ends the buffer's actor (the collector ended its own)
    """

    def __init__(
        self,
        *,
        storage: Storage | Callable[[], Storage] | None = None,
        sampler: Sampler | Callable[[], Sampler] | None = None,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        ray = require_ray()
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"actor_options must be a dict, got {type(actor_options).__name__}")
        for key, why in _REFUSED.items():
            if actor_options and key in actor_options:
                raise ValueError(f"RayReplayBuffer does not take the actor option {key!r}: {why}")
        options = {**DEFAULT_BUFFER_OPTIONS, **(actor_options or {})}
        remote = _actor_class().options(**options)  # Ray checks the options here
        kwargs: dict[str, Any] = {"storage": storage, "sampler": sampler, "batch_size": batch_size}
        if generator is not None:
            kwargs["generator"] = generator
        kwargs_bytes = cloudpickle.dumps(kwargs)
        if not ray.is_initialized():
            ray.init()
        self._actor = remote.remote()
        self._owner = True
        self._closed = False
        try:
            pid, node = ray.get(self._actor.build.remote(kwargs_bytes))
        except BaseException:
            ray.kill(self._actor, no_restart=True)
            raise
        self._pid: int | None = pid if node_is_local(node) else None
        ACTORS.add(self)

    @classmethod
    def _attach(cls, actor: Any) -> RayReplayBuffer:
        """A handle on an existing buffer actor that does not own it (unpickling)."""
        handle = cls.__new__(cls)
        handle._actor = actor
        handle._owner = False
        handle._closed = False
        handle._pid = None
        return handle

    def __reduce__(self) -> tuple[Any, ...]:
        return (RayReplayBuffer._attach, (self._actor,))

    def _get(self, ref: Any) -> Any:
        return require_ray().get(ref)

    def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise RuntimeError("the RayReplayBuffer is shut down")
        return self._get(getattr(self._actor, method).remote(*args))

    def __repr__(self) -> str:
        state = "shut down" if self._closed else f"len={len(self)}"
        return f"RayReplayBuffer(actor={self._actor}, {state})"

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        """Steps currently stored."""
        return int(self._call("sizes")[0])

    @property
    def write_count(self) -> int:
        """Steps written since creation (or the last :meth:`empty`)."""
        return int(self._call("sizes")[1])

    @property
    def batch_size(self) -> int | None:
        """The default number of steps per :meth:`sample`."""
        size: int | None = self._call("batch_size")
        return size

    # ------------------------------------------------------------------ writing
    def extend(self, data: TensorDictBase | torch.Tensor | Mapping[str, Any]) -> torch.Tensor:
        """:meth:`ReplayBuffer.extend <splice.ReplayBuffer.extend>` in the actor (the data
        is sent to it); returns the storage rows."""
        rows: torch.Tensor = unpack(self._call("extend", pack(data)))
        return rows

    def extend_refs(self, refs: list[Any]) -> None:
        """Write the collector batches held in Ray's object store under ``refs`` (each
        ``[B_k, T]``, or ``[T]`` for a single env, in :func:`splice._remote.pack` form),
        joined along their env rows, with one ``extend``. The actor reads them from the
        nodes that hold them: the data does not pass through this process. Used by the
        multi-worker collectors with ``backend="ray"`` (see
        :attr:`~splice.MultiSyncCollector.remote_writes`)."""
        self._call("extend_refs", list(refs))

    def add(self, data: TensorDictBase | torch.Tensor | Mapping[str, Any]) -> int:
        """:meth:`ReplayBuffer.add <splice.ReplayBuffer.add>` in the actor."""
        return int(self._call("add", pack(data)))

    def empty(self) -> None:
        """:meth:`ReplayBuffer.empty <splice.ReplayBuffer.empty>` in the actor."""
        self._call("empty")

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        batch_size: int | None = None,
        *,
        return_info: bool = False,
        as_sequences: bool | None = None,
    ) -> Any:
        """:meth:`ReplayBuffer.sample <splice.ReplayBuffer.sample>` in the actor; the sample
        is sent back (fresh, writable tensors)."""
        return unpack(self._call("sample", batch_size, return_info, as_sequences))

    def update_priority(self, index: Any, priority: Any) -> None:
        """:meth:`ReplayBuffer.update_priority <splice.ReplayBuffer.update_priority>` in the
        actor."""
        self._call("update_priority", pack(index), pack(priority))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """:meth:`ReplayBuffer.state_dict <splice.ReplayBuffer.state_dict>`, sent here."""
        state: dict[str, Any] = unpack(self._call("state_dict"))
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """:meth:`ReplayBuffer.load_state_dict <splice.ReplayBuffer.load_state_dict>` in the
        actor (the state is sent to it)."""
        self._call("load_state_dict", pack(dict(state_dict)))

    def dumps(self, path: str | Path) -> None:
        """:meth:`ReplayBuffer.dumps <splice.ReplayBuffer.dumps>` on the actor's node."""
        self._call("dumps", str(path))

    def loads(self, path: str | Path) -> None:
        """:meth:`ReplayBuffer.loads <splice.ReplayBuffer.loads>` on the actor's node."""
        self._call("loads", str(path))

    # ------------------------------------------------------------------ lifetime
    def shutdown(self, timeout: float = 10.0) -> None:
        """End the buffer's actor (its data is gone); idempotent. On this node, waits up to
        ``timeout`` seconds for its process to end.

        Raises:
            RuntimeError: this handle is a copy (only the creator ends the actor).
        """
        if not self._owner:
            raise RuntimeError(
                "this RayReplayBuffer handle is a copy; only the handle that created the "
                "buffer's actor shuts it down"
            )
        self.end_actors(time.monotonic() + timeout)

    def end_actors(self, deadline: float) -> None:
        """Kill the actor now and wait (until ``deadline``) for its process to end, if it is
        on this node: :meth:`shutdown`, and what happens at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        ACTORS.discard(self)
        end_actors([self._actor], [] if self._pid is None else [self._pid], deadline)

    def __enter__(self) -> RayReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owner:
            self.shutdown()
