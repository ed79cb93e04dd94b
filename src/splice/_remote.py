"""What splice's Ray modules share: importing Ray, the wire format of tensors, ending actors.

Only :mod:`splice.collectors._ray` (the ``"ray"`` backend of the multi-worker collectors) and
:mod:`splice.replay.ray_buffer` (:class:`~splice.RayReplayBuffer`) use this module, and
``ray`` itself is imported by :func:`require_ray` only: ``import splice`` and the other
backends never import it.

**Wire format.** Ray pickles a torch tensor by copying its bytes into the pickle stream, but
passes numpy arrays out of band (pickle protocol 5): no copy when an object is written, and a
zero-copy read from the object store on the same node. So everything splice sends through
Ray (batches, samples, weights) goes as :func:`pack`: each tensor as a numpy array, a
TensorDict as its batch size and packed entries; :func:`unpack` rebuilds it. Measured on a
1,000-frame CartPole batch (57 kB): a TensorDict costs ~2.5 ms per actor call more than an
empty call, its packed form ~0.6 ms. :func:`unpack` copies each array once: the arrays Ray
returns are read-only views of its buffers, which torch cannot mark read-only, so a writable
copy is the safe thing to hand out (a few microseconds for a CartPole batch).

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.arange(6.0).view(3, 2), ("next", "done"): torch.ones(3, 1,
    ...                  dtype=torch.bool)}, [3])
    >>> wire = pack(td)
    >>> type(wire[2]["obs"][1]).__name__  # (tag, array): Ray moves the array out of band
    'ndarray'
    >>> back = unpack(wire)
    >>> bool((back["obs"] == td["obs"]).all()), back["next", "done"].dtype, back.batch_size
    (True, torch.bool, torch.Size([3]))
    >>> unpack(pack({"x": torch.zeros(2), "n": 3}))["n"]
    3
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

__all__ = [
    "ACTORS",
    "ActorOwner",
    "ActorRegistry",
    "node_is_local",
    "pack",
    "require_ray",
    "unpack",
    "wait_until_gone",
]

_TD, _TENSOR = "splice.td", "splice.tensor"


def require_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "the Ray backend needs ray, which is not installed: pip install 'splice-rl[ray]'"
        ) from None
    return ray


def _numpy_dtype(dtype: torch.dtype) -> bool:
    try:
        torch.empty(0, dtype=dtype).numpy()
    except TypeError:  # e.g. bfloat16: numpy has no such dtype
        return False
    return True


_NUMPY_DTYPES: dict[torch.dtype, bool] = {}


def pack(value: Any) -> Any:
    """``value`` with every CPU tensor (also inside TensorDicts, dicts, lists and tuples) as a
    numpy array that shares its memory; anything else is left as it is (Ray pickles it)."""
    if isinstance(value, torch.Tensor):  # first: the most common, and the cheapest check
        tensor = value.detach()
        if tensor.is_cpu:  # the common case in one call; a dtype numpy lacks (TypeError)
            try:  # or a lazy conjugation/negation (RuntimeError) takes the way below
                return (_TENSOR, tensor.numpy())
            except (TypeError, RuntimeError):
                pass
        else:
            tensor = tensor.cpu()
        usable = _NUMPY_DTYPES.get(tensor.dtype)
        if usable is None:
            usable = _NUMPY_DTYPES[tensor.dtype] = _numpy_dtype(tensor.dtype)
        if not usable:
            return tensor
        return (_TENSOR, tensor.resolve_conj().resolve_neg().numpy())
    if isinstance(value, TensorDictBase):
        entries = {key: pack(item) for key, item in value.items()}
        device = None if value.device is None else str(value.device)
        return (_TD, tuple(value.batch_size), entries, device)
    if isinstance(value, dict):
        return {key: pack(item) for key, item in value.items()}
    if isinstance(value, list | tuple) and type(value) in (list, tuple):
        return type(value)(pack(item) for item in value)
    return value


def unpack(value: Any, copy: bool = True) -> Any:
    """The inverse of :func:`pack`.

    Args:
        value: what :func:`pack` returned (possibly after a trip through Ray or pickle).
        copy: copy every array (see the module docstring). ``False`` copies only the
            read-only ones (Ray's views of its buffers) and uses writable arrays as they
            are: only for arrays nobody else holds, e.g. just unpickled from bytes.

    A TensorDict is rebuilt from entries that already have its batch dims, so its
    per-entry checks are skipped (``TensorDict._new_unsafe``; a CPU TensorDict only).
    """
    if isinstance(value, tuple) and len(value) == 4 and value[0] == _TD:
        _, batch_size, entries, device = value
        source = {key: unpack(item, copy) for key, item in entries.items()}
        if device is None or device == "cpu":
            return TensorDict._new_unsafe(source, batch_size=torch.Size(batch_size), device=device)
        return TensorDict(source, batch_size=batch_size, device=device)
    if isinstance(value, tuple) and len(value) == 2 and value[0] == _TENSOR:
        array = value[1]
        if copy or not array.flags.writeable:
            array = np.array(array, copy=True)
        return torch.from_numpy(array)
    if isinstance(value, dict):
        return {key: unpack(item, copy) for key, item in value.items()}
    if isinstance(value, list | tuple) and type(value) in (list, tuple):
        return type(value)(unpack(item, copy) for item in value)
    return value


def node_is_local(node_id: str) -> bool:
    """Whether the Ray node ``node_id`` is this process's node (its processes are visible in
    this machine's ``/proc``)."""
    ray = require_ray()
    return bool(ray.get_runtime_context().get_node_id() == node_id)


class ActorOwner(Protocol):
    """An object that started Ray actors: ends them all by ``deadline`` (``time.monotonic``)."""

    def end_actors(self, deadline: float) -> None: ...


class ActorRegistry:
    """The objects that started Ray actors, whose actors are ended at interpreter exit.

    Args:
        timeout: seconds the exit hook gives all owners together.

    The ``atexit`` hook is registered when the first owner is added, which happens after
    ``ray.init`` (a pool or buffer starts Ray if needed before it registers): ``atexit`` runs
    the last registered hook first, so the actors are ended while the connection to Ray is
    still up, before Ray's own exit hook disconnects. Owners are held weakly.

    Examples:
        >>> class Owner:
        ...     ended = False
        ...     def end_actors(self, deadline):
        ...         self.ended = True
        >>> registry, owner = ActorRegistry(timeout=1.0), Owner()
        >>> registry.add(owner)
        >>> registry.close_all()
        >>> owner.ended
        True
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._owners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._registered = False

    def add(self, owner: ActorOwner) -> None:
        """End ``owner``'s actors at exit, unless it is discarded before."""
        with self._lock:
            if not self._registered:
                atexit.register(self.close_all)
                self._registered = True
            self._owners.add(owner)

    def discard(self, owner: ActorOwner) -> None:
        with self._lock:
            self._owners.discard(owner)

    def close_all(self) -> None:
        """End every registered owner's actors, within :attr:`timeout` in all."""
        deadline = time.monotonic() + self.timeout
        with self._lock:
            owners = list(self._owners)
            self._owners.clear()
        for owner in owners:
            with contextlib.suppress(Exception):
                owner.end_actors(deadline)


#: The one registry of splice's Ray actors (worker pools and replay buffers): 10 s at exit,
#: the bound issue 12 sets for ending workers.
ACTORS = ActorRegistry(timeout=10.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


#: Seconds an actor gets to exit on its own (an intended exit, which Ray does not report)
#: before it is killed: a killed actor makes Ray print "A worker died or was killed ..." in
#: the driver.
EXIT_GRACE = 1.0
#: Seconds ``ray.kill`` gets to end an actor's process of this node before it is sent
#: SIGKILL: ``ray.kill`` does not cut short an exit under way (an idle actor asked to exit
#: took 6-8 s more to end after ``ray.kill``, under load 16: a Python teardown with torch).
KILL_GRACE = 1.0


def end_actors(
    handles: list[Any], local_pids: list[int], deadline: float, kill_now: Sequence[Any] = ()
) -> None:
    """End actors whose class has an ``exit`` method (:func:`exit_actor`): ``ray.kill`` those
    of ``kill_now`` (busy with a call they will not finish: an exit request would wait behind
    it), ask each of ``handles`` to exit, wait up to :data:`EXIT_GRACE` seconds (and no later
    than ``deadline``) for the processes of this node (``local_pids``: of both lists), then
    ``ray.kill`` what is left, SIGKILL the processes of this node still running
    :data:`KILL_GRACE` seconds later, and wait for them until ``deadline``."""
    ray = require_ray()
    if not ray.is_initialized():
        return
    for handle in kill_now:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(handle, no_restart=True)
    for handle in handles:
        with contextlib.suppress(Exception):  # already gone
            handle.exit.remote()
    wait_until_gone(local_pids, min(deadline, time.monotonic() + EXIT_GRACE))
    for handle in handles:
        with contextlib.suppress(Exception):  # already gone, or Ray is shut down
            ray.kill(handle, no_restart=True)
    for pid in wait_until_gone(local_pids, min(deadline, time.monotonic() + KILL_GRACE)):
        with contextlib.suppress(OSError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    wait_until_gone(local_pids, deadline)


def exit_actor() -> None:
    """End the calling actor's process cleanly (the ``exit`` method of splice's actors)."""
    require_ray().actor.exit_actor()


def wait_until_gone(pids: list[int], deadline: float) -> list[int]:
    """Wait (until ``deadline``, a ``time.monotonic()`` value) for the processes ``pids`` of
    this machine to end; returns those still running."""
    left = [pid for pid in pids if _alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [pid for pid in left if _alive(pid)]
    return left
