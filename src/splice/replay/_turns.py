"""``SamplesFirst``: a writer gives way to the samples in flight before each of its stretches
of Python work.

Why: a replay buffer's write and its samples are mostly short numpy and torch calls under the
GIL. A sample releases the GIL inside each of its kernels; a writer thread that is ready to
run takes it then and keeps it until its own next release, which a thread waiting for the GIL
often loses to the holder (the holder re-takes it before the waiter wakes up). On an idle
2-core machine a writer extending as fast as it can made a sample 2-5.5x slower than alone.
A writer that *waits* (on a condition: no GIL held, no GIL wanted) while a sample is in
flight leaves the sample the whole interpreter; the write then runs in the gaps between
samples, which a training loop's model updates (GIL-free torch kernels) provide.

The wait is bounded: the writer waits only for the samples already in flight when it
arrives (counted by tickets), never for the ones started after, so a thread sampling in a
tight loop slows the writer (one stretch per sample) but cannot stop it.

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
    """Tickets of the samples started and finished; writers wait for the ones in flight.

    Args:
        timeout: the longest a writer waits at one call of :meth:`give_way`, in seconds (a
            safety bound: a sample of a few hundred steps takes well under a millisecond).
    """

    def __init__(self, timeout: float = 0.05) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._started = 0
        self._finished = 0
        self.timeout = timeout

    @property
    def in_flight(self) -> int:
        """Samples started and not yet finished."""
        return self._started - self._finished

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Count a sample in flight for the duration of the block."""
        with self._cond:
            self._started += 1
        try:
            yield
        finally:
            with self._cond:
                self._finished += 1
                self._cond.notify_all()

    def give_way(self) -> None:
        """Wait until the samples in flight now have finished (at most ``timeout``)."""
        if self._started == self._finished:  # the common case, read without the lock
            return
        with self._cond:
            target = self._started
            self._cond.wait_for(lambda: self._finished >= target, self.timeout)
