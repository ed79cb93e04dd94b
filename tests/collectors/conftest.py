"""Collector test fixtures: no test may leave a process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from splice.testing import descendant_processes, is_ray_service

# Long-lived helpers that multiprocessing starts once per session (not workers): the fork
# server (its children ARE workers and are checked) and the resource tracker.
_HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")


def live_descendants() -> dict[int, bytes]:
    """Every process below this one (pid -> command line), except multiprocessing's helpers
    themselves (but including the processes forked by the fork server, which share its
    command line) and the services of a Ray instance a test module started (its GCS,
    raylet, agents and idle workers; actors' processes count). Zombies do not count."""
    tree = descendant_processes()

    def mp_helper(pid: int) -> bool:
        parent, cmdline = tree[pid]
        return any(h in cmdline for h in _HELPERS) and not (parent in tree and mp_helper(parent))

    return {
        pid: cmdline
        for pid, (_, cmdline) in tree.items()
        if not mp_helper(pid) and not is_ray_service(cmdline)
    }


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail a test that leaves a child process running (workers, vector env subprocesses,
    Ray actors)."""
    before = set(live_descendants())
    yield
    deadline = time.monotonic() + 5.0
    left = set(live_descendants()) - before
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = set(live_descendants()) - before
    if left:
        described = {pid: cmd[:120] for pid, cmd in live_descendants().items() if pid in left}
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the test left {len(left)} process(es) running: {described}")
