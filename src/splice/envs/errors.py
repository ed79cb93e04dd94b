"""The errors an environment adapter raises: an env breaks its own declared contract
(:class:`EnvError`), or a worker process of a vector env dies (:class:`EnvWorkerError`)."""

from __future__ import annotations

__all__ = ["EnvError", "EnvWorkerError"]


class EnvError(ValueError):
    """An environment returned something that does not match its declared spaces (or a
    requested info entry is missing or malformed): the message names the key."""


class EnvWorkerError(RuntimeError):
    """A worker process of a vector env died; the env was closed and its other workers ended.

    Attributes:
        worker: the index of the (first) dead worker.
        pid: its process id.
        exitcode: its exit code (negative: the signal that ended it).
    """

    def __init__(self, message: str, *, worker: int, pid: int | None, exitcode: int | None):
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.exitcode = exitcode
