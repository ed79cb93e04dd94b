"""Running a batch-producing loop in a background thread, with pause, stop and error relay.

:class:`BackgroundRunner` knows nothing about environments: it calls ``step()`` (collect one
batch and store it) until ``step`` returns False, a stop is requested, or ``step`` raises — the
exception is kept (:attr:`BackgroundRunner.failure`) and re-raised once in the caller by
:meth:`BackgroundRunner.join` and :meth:`BackgroundRunner.check`. Control requests are honoured
between two ``step`` calls, so a batch being collected is always finished and stored, never
discarded.

Examples:
    >>> from splice.collectors.background import BackgroundRunner
    >>> produced = []
    >>> def step():
    ...     produced.append(len(produced))
    ...     return len(produced) < 3  # False: nothing more to collect
    >>> runner = BackgroundRunner(step, name="demo")
    >>> runner.start()
    >>> runner.join(timeout=5)
    >>> produced
    [0, 1, 2]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["BackgroundRunner", "StopCollection"]


class StopCollection(Exception):
    """Raised by a ``step`` to end background collection early and cleanly (not an error):
    e.g. a multi-worker collector whose workers are being shut down while it waits for them."""


class BackgroundRunner:
    """A daemon thread calling ``step`` between control checks.

    Args:
        step: collects one batch; returns False when the work is finished.
        name: the thread's name.
        on_exit: called in the thread after the last ``step`` (also after a stop request or an
            error), e.g. to flush what is buffered.
        gate: called in the thread before each ``step``; while it returns False the thread
            waits (checking again every ``GATE_POLL`` seconds, pause and stop requests still
            honoured), e.g. a rate limiter keeping collection from running ahead of learning.

    Examples:
        >>> import time
        >>> runner = BackgroundRunner(lambda: time.sleep(0.001) or True)  # endless
        >>> runner.start()
        >>> runner.pause(timeout=5)
        >>> runner.paused, runner.alive
        (True, True)
        >>> runner.request_stop()
        >>> runner.join(timeout=5)
        >>> runner.alive
        False
    """

    GATE_POLL = 0.0005

    def __init__(
        self,
        step: Callable[[], bool],
        *,
        name: str = "splice-collector",
        on_exit: Callable[[], None] | None = None,
        gate: Callable[[], bool] | None = None,
    ) -> None:
        self._step = step
        self._on_exit = on_exit
        self._gate = gate
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._paused = threading.Event()
        self._error: BaseException | None = None
        self._reported = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ----------------------------------------------------------------- thread side
    def _main(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._resume.is_set():
                    self._paused.set()
                    self._resume.wait()
                    self._paused.clear()
                    continue
                if self._gate is not None and not self._gate():
                    time.sleep(self.GATE_POLL)
                    continue
                if not self._step():
                    break
        except StopCollection:
            pass
        except BaseException as error:  # relayed to the caller by join()/check()
            self._error = error
        finally:
            self._paused.set()  # nobody must wait for a pause of a dead thread
            if self._on_exit is not None:
                try:
                    self._on_exit()
                except BaseException as error:
                    if self._error is None:
                        self._error = error

    # ----------------------------------------------------------------- caller side
    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread is still running."""
        return self._thread.is_alive()

    @property
    def failure(self) -> BaseException | None:
        """The exception the thread died of (kept after :meth:`check` reported it), or None."""
        return self._error

    @property
    def paused(self) -> bool:
        """Whether a pause was requested (and not resumed)."""
        return not self._resume.is_set()

    def check(self) -> None:
        """Re-raise, in the caller, an exception the thread died of (once: later calls return,
        :attr:`failure` keeps it)."""
        if not self._reported:
            self.raise_failure("background collection failed")

    def raise_failure(self, message: str) -> None:
        """If the thread died of an exception, raise ``RuntimeError(message)`` from it (at every
        call); :meth:`check` and :meth:`join` then count it as reported."""
        if self._error is not None:
            self._reported = True
            raise RuntimeError(message) from self._error

    def pause(self, timeout: float | None = None) -> None:
        """Ask the thread to pause after the current batch; return once it has paused."""
        self.check()
        self._resume.clear()
        if self._thread.is_alive() and not self._paused.wait(timeout):
            raise TimeoutError(f"background collection did not pause within {timeout} s")
        self.check()

    def resume(self) -> None:
        """Let a paused thread go on."""
        self.check()
        self._resume.set()

    def request_stop(self) -> None:
        """Ask the thread to stop after the current batch (also wakes a paused thread)."""
        self._stop.set()
        self._resume.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end; re-raise its exception, if any.

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
            RuntimeError: the thread died of an exception (chained as its cause).
        """
        if self._thread.ident is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"background collection still running after {timeout} s")
        self.check()
