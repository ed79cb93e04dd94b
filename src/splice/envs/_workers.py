"""The worker processes of a gymnasium ``AsyncVectorEnv``: a worker that dies is reported by name,
and the env is closed with every other worker ended.

When a worker process dies (killed, out of memory, a crash in native code), gymnasium raises a
bare ``EOFError``, ``BrokenPipeError`` or ``ConnectionResetError`` from its pipe, leaves the env
open (``closed`` False) with the other workers running, and a later ``close()`` raises the same
pipe error.
:class:`WorkerWatch` wraps such an env (:func:`~splice.envs.make_adapter` does it): on a pipe
error it looks for the dead worker, ends the others, closes the env and raises
:class:`EnvWorkerError` naming the worker, its pid and how it ended (the pipe error is the
cause). ``close()`` finds a worker that died between two calls the same way; once the death is
reported, ``close()`` has nothing left to do.

An error raised by the env inside a worker is not a death: gymnasium reports it itself (the
worker ends after sending it) and it propagates unchanged.
"""

from __future__ import annotations

import signal
import time
import warnings
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from gymnasium.vector import AsyncVectorEnv, VectorEnv, VectorWrapper

from splice.envs.errors import EnvWorkerError

__all__ = ["WorkerWatch"]

#: Pipe errors that mean "the process at the other end is gone".
_PIPE_ERRORS = (EOFError, BrokenPipeError, ConnectionResetError)
#: How long to wait for a worker whose pipe broke to be reported dead by the OS (a process
#: closes its files a moment before it becomes a zombie).
_DEATH_GRACE = 2.0
#: How long each worker gets to end after ``terminate()`` before it is killed.
_END_TIMEOUT = 5.0

T = TypeVar("T")


class WorkerWatch(VectorWrapper):
    """Wraps an ``AsyncVectorEnv`` (or a vector wrapper around one): turns a worker's death
    into :class:`EnvWorkerError` and closes the env, ending every other worker.

    Args:
        env: the vector env; ``env.unwrapped`` must be an ``AsyncVectorEnv``.

    Examples:
        >>> import gymnasium as gym
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async")
        >>> watched = WorkerWatch(env)
        >>> _ = watched.reset(seed=0)
        >>> watched.close()
        >>> env.closed, [p.is_alive() for p in env.processes]
        (True, [False, False])
    """

    def __init__(self, env: VectorEnv[Any, Any, Any]) -> None:
        super().__init__(env)
        if not isinstance(env.unwrapped, AsyncVectorEnv):
            raise TypeError(
                f"WorkerWatch watches an AsyncVectorEnv, got {type(env.unwrapped).__name__}"
            )
        self._vec: AsyncVectorEnv = env.unwrapped

    def step(self, actions: Any) -> Any:
        return self._watch("step()", self.env.step, actions)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        return self._watch("reset()", lambda: self.env.reset(seed=seed, options=options))

    def close(self, **kwargs: Any) -> None:
        """Close the env. A worker found dead is reported (once) after the others are ended.

        Raises:
            EnvWorkerError: a worker died since the last call.
        """
        if self._vec.closed:
            return
        dead = self._dead_workers()
        if dead:
            raise self._fail(dead, "close()")
        self.env.close(**kwargs)

    # ------------------------------------------------------------------ internals
    def _watch(self, what: str, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except _PIPE_ERRORS as error:
            dead = self._wait_for_dead_worker()
            if not dead:
                raise
            raise self._fail(dead, what) from error

    def _dead_workers(self) -> list[tuple[int, BaseProcess]]:
        """Workers that ended without reporting an error (gymnasium drops the pipe of a worker
        whose error it reported)."""
        return [
            (i, process)
            for i, (process, pipe) in enumerate(
                zip(self._vec.processes, self._vec.parent_pipes, strict=True)
            )
            if pipe is not None and not process.is_alive()
        ]

    def _wait_for_dead_worker(self) -> list[tuple[int, BaseProcess]]:
        end = time.monotonic() + _DEATH_GRACE
        while True:
            dead = self._dead_workers()
            if dead or time.monotonic() > end:
                return dead
            time.sleep(0.01)

    def _fail(self, dead: list[tuple[int, BaseProcess]], what: str) -> EnvWorkerError:
        """End the other workers, close the env, and describe the death."""
        self._end_workers()
        index, process = dead[0]
        others = f" (and worker(s) {[i for i, _ in dead[1:]]})" if len(dead) > 1 else ""
        return EnvWorkerError(
            f"{type(self._vec).__name__} worker {index} (pid {process.pid}) "
            f"{_how_it_ended(process.exitcode)}{others}, found during {what}; the env is closed "
            f"and its other {len(self._vec.processes) - len(dead)} worker(s) were ended",
            worker=index,
            pid=process.pid,
            exitcode=process.exitcode,
        )

    def _end_workers(self) -> None:
        vec = self._vec
        for process in vec.processes:
            if process.is_alive():
                process.terminate()
        for process in vec.processes:
            process.join(_END_TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()
        try:  # gymnasium's own close, forced; it may trip on the dead pipes
            with warnings.catch_warnings():  # "close while waiting for a pending call": known
                warnings.simplefilter("ignore")
                vec.close(terminate=True)
        except _PIPE_ERRORS:
            for pipe in vec.parent_pipes:
                if pipe is not None:
                    pipe.close()
            vec.closed = True


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "died"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
