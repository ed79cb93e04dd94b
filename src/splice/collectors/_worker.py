"""The worker core: what one worker of a multi-worker collector does, whatever runs it.

A :class:`WorkerSpec` is a picklable description of a worker (env factory, policy or policy
factory, id space, seed, the loop's options); :class:`WorkerCore` builds the env adapter, the
policy and a :class:`~splice.collectors.RolloutLoop` from it and collects batches on request.
The core knows nothing about processes, pipes or shared memory: a worker process
(:mod:`splice.collectors._process`), a Ray actor, or this very process (the ``"inline"``
backend) each run one core and only move its batches and weights around.

Examples:
    >>> from splice.testing import counting_vec
    >>> spec = WorkerSpec(index=0, env=lambda: counting_vec([3, 4]), worker_id=40, seed=0)
    >>> core = WorkerCore(spec)
    >>> core.info.num_envs, core.info.batched
    (2, True)
    >>> core.configure(steps=5)
    >>> batch, returns = core.collect(random_actions=False)
    >>> batch.batch_size, core.frames
    (torch.Size([2, 5]), 10)
    >>> core.ids_state()
    {'worker_id': 40, 'next': 4}
    >>> core.close()
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from splice.collectors._settings import LoopOptions
from splice.collectors.ids import TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.envs import EnvLike, make_adapter

__all__ = [
    "WorkerCore",
    "WorkerError",
    "WorkerInfo",
    "WorkerSpec",
    "init_worker_process",
    "pickle_spec",
    "policy_weights",
]


class WorkerError(RuntimeError):
    """A worker of a multi-worker collector failed: its env or policy raised, or its process
    died. :attr:`worker` is the worker's index and :attr:`traceback` the worker's own
    traceback text (or how the process ended); both are in the message.

    Examples:
        >>> error = WorkerError(1, "Traceback ...\\nValueError: boom")
        >>> error.worker, str(error).splitlines()[0]
        (1, 'worker 1 failed: ValueError: boom')
    """

    def __init__(self, worker: int, traceback: str) -> None:
        self.worker = worker
        self.traceback = traceback
        lines = [line for line in traceback.strip().splitlines() if line.strip()]
        summary = lines[-1].strip() if lines else "unknown error"
        super().__init__(
            f"worker {worker} failed: {summary}\n\nWorker {worker} traceback:\n{traceback}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (WorkerError, (self.worker, self.traceback))


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build itself; pickled (with cloudpickle, so lambdas and
    closures work) and sent to the worker.

    Args:
        index: the worker's position in the collector (0, 1, ...), used in error messages.
        env: a zero-argument env factory or an env id string (see
            :func:`splice.envs.make_adapter`).
        num_envs: with an env id: ``None`` for one env, an int for ``gymnasium.make_vec``.
        env_kwargs: keyword arguments for ``gymnasium.make``/``make_vec`` (env id only).
        policy: the policy (a copy travels to the worker), or ``None``.
        policy_factory: called in the worker to make the policy (instead of ``policy``).
        worker_id: the trajectory id space of the worker (see :mod:`splice.collectors.ids`).
        seed: seeds the worker's first env reset and its random actions, or ``None``.
        torch_seed: seeds torch's global RNG in the worker's process (its policy's sampling).
        loop: the options of the worker's :class:`~splice.collectors.RolloutLoop`
            (``loop.device`` is also where the worker moves an ``nn.Module`` policy).
        num_threads: torch intra-op threads in the worker's process.
    """

    index: int
    env: EnvLike
    num_envs: int | None = None
    env_kwargs: dict[str, Any] | None = None
    policy: Any = None
    policy_factory: Callable[[], Any] | None = None
    worker_id: int = 0
    seed: int | None = None
    torch_seed: int | None = None
    loop: LoopOptions = field(default_factory=LoopOptions)
    num_threads: int = 1


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports once its env is built.

    Args:
        num_envs: ``B``, the env rows of its batches.
        batched: False for a single ``gymnasium.Env`` (its batches are ``[T]``).
        pid: the worker's process id (``None`` when it runs in the caller's process).
    """

    num_envs: int
    batched: bool
    pid: int | None = None


def policy_weights(policy: Any) -> TensorDictBase | None:
    """The parameters and buffers of an ``nn.Module`` policy as a TensorDict of detached views
    (``None`` for any other policy): what :meth:`WorkerCore.load_weights` receives.

    Examples:
        >>> import torch
        >>> policy_weights(torch.nn.Linear(2, 1))["weight"].shape
        torch.Size([1, 2])
        >>> policy_weights(lambda td: td) is None
        True
    """
    if not isinstance(policy, torch.nn.Module):
        return None
    return TensorDict.from_module(policy).data


def init_worker_process(spec: WorkerSpec) -> None:
    """Process-wide settings of a worker that has a process of its own (a worker process, a
    Ray actor): torch's intra-op threads and torch's global RNG. Not for the ``"inline"``
    backend, which would change the caller's."""
    torch.set_num_threads(spec.num_threads)
    if spec.torch_seed is not None:
        torch.manual_seed(spec.torch_seed)


def format_exception(error: BaseException) -> str:
    """The full traceback text of ``error`` (what a worker reports)."""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


class WorkerCore:
    """One worker: an env adapter, a policy and a :class:`~splice.collectors.RolloutLoop`.

    Args:
        spec: the worker's description.

    The loop is built by :meth:`configure` (the batch length ``T`` depends on every worker's
    env count, known only once all have reported :attr:`info`).

    Raises:
        TypeError, ValueError: the env or the policy cannot be built (the env is closed).
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.adapter = make_adapter(spec.env, num_envs=spec.num_envs, env_kwargs=spec.env_kwargs)
        try:
            policy = spec.policy_factory() if spec.policy_factory is not None else spec.policy
            if policy is not None and not callable(policy):
                raise TypeError(
                    f"the policy of worker {spec.index} is a {type(policy).__name__}, not a "
                    "callable td -> td"
                )
            device = spec.loop.device
            if isinstance(policy, torch.nn.Module) and device is not None:
                policy = policy.to(device)
            self.policy = policy
            self._weights = policy_weights(policy)
            self.ids = TrajectoryIds(spec.worker_id)
        except BaseException:
            self.adapter.close()
            raise
        self.info = WorkerInfo(self.adapter.num_envs, self.adapter.batched, os.getpid())
        self.loop: RolloutLoop | None = None
        #: Frames collected so far.
        self.frames = 0

    def configure(self, steps: int) -> None:
        """Build the rollout loop for batches of ``steps`` time steps."""
        self.loop = RolloutLoop(
            self.adapter,
            self.policy,
            steps=steps,
            ids=self.ids,
            options=self.spec.loop,
            seed=self.spec.seed,
        )

    def collect(self, random_actions: bool) -> tuple[TensorDict, np.ndarray]:
        """The next batch (fresh tensors, ``[B, T]`` or ``[T]``) and the returns of the
        episodes that ended in it (empty unless ``track_episodes``)."""
        if self.loop is None:
            raise RuntimeError("configure(steps) must be called before collect()")
        batch = self.loop.collect(random_actions=random_actions)
        self.frames += batch.numel()
        return batch, self.loop.episodes.returns

    def load_weights(self, weights: TensorDictBase | Mapping[str, Any]) -> None:
        """Copy ``weights`` (a TensorDict like :func:`policy_weights`) into the policy.

        Raises:
            TypeError: the policy is not an ``nn.Module``.
        """
        if self._weights is None:
            raise TypeError(
                f"worker {self.spec.index}'s policy is not an nn.Module: it has no weights"
            )
        self._weights.update_(weights)

    def restart(self) -> None:
        """Forget the episodes in flight: the next batch resets every env (new ids)."""
        if self.loop is not None:
            self.loop.restart()

    def ids_state(self) -> dict[str, Any]:
        """The id counter (:meth:`TrajectoryIds.state_dict`)."""
        return self.ids.state_dict()

    def load_ids_state(self, state: dict[str, Any]) -> None:
        """Continue a saved id counter (and its space)."""
        self.ids.load_state_dict(state)

    def close(self) -> None:
        """Close the env."""
        self.adapter.close()


def pickle_spec(spec: WorkerSpec) -> bytes:
    """``spec`` pickled with cloudpickle (lambdas and closures work), for a worker of another
    process.

    Raises:
        TypeError: the spec cannot be pickled; the message names the policy, the policy
            factory or the env factory.
    """
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
            f"worker ({type(error).__name__}: {error})"
        ) from error
