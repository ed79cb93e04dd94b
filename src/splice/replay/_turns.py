"""``SamplesFirst``: a writer parks while samples are in flight, for a bounded time.

Why: a replay buffer's write and its samples are mostly short numpy and torch calls under the
GIL. A sample releases the GIL inside each of its kernels; a writer thread that is ready to
run takes it then and keeps it until its own next release, and the sampling thread, woken
too late, often loses the GIL again to the writer's next call. On an idle 2-core machine a
writer extending as fast as it can made a sample 2-5.5x slower than alone. A writer that
*waits* on a condition (no GIL held, none wanted) while a sample is in flight leaves the
sample the whole interpreter; the write then runs in the gaps between samples, which a
training loop's model updates (GIL-free torch kernels) provide.

The wait is bounded by ``patience`` per call, so a thread that samples without pause delays
each of the writer's stretches by at most that much but cannot stop it.

Examples:
    >>> turns = SamplesFirst()
    >>> turns.give_way()  # nothing in flight: returns at once
    >>> with turns.sampling():
    ...     turns.in_flight
    1
    >>> turns.in_flight
    0
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SamplesFirst"]


class SamplesFirst:
    """Counts the samples in flight; writers wait until none is, at most ``patience``.

    Args:
        patience: the longest a writer waits at one call of :meth:`give_way`, in seconds (a
            sample of a few hundred steps takes a fraction of a millisecond).
    """

    def __init__(self, patience: float = 1e-3) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = 0
        self.patience = patience

    @property
    def in_flight(self) -> int:
        """Samples started and not yet finished."""
        return self._in_flight

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Count a sample in flight for the duration of the block."""
        with self._cond:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                if not self._in_flight:
                    self._cond.notify_all()

    def give_way(self) -> None:
        """Wait until no sample is in flight (at most ``patience``)."""
        if not self._in_flight:  # the common case, read without the lock
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._in_flight, self.patience)
