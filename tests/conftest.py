"""Fixtures shared by every test module: a seeded torch RNG, a minimal replay buffer, a check
that a test left no process running, and a local Ray instance for the tests that need one.

Test data generators (collector-like batches, a counting env) live in :mod:`splice.testing`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from splice.testing import descendant_processes, is_ray_process, is_ray_service

#: The local Ray instance of the tests: 2 CPUs (this machine's), no dashboard, every address
#: on the loopback interface, no usage reporting, worker output not copied to the tests'.
RAY_INIT: dict[str, Any] = {
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "_node_ip_address": "127.0.0.1",
}


class ListBuffer:
    """The smallest replay buffer: keeps what ``extend`` receives (thread-safe)."""

    def __init__(self) -> None:
        self.items: list[TensorDictBase] = []
        self._lock = threading.Lock()

    def extend(self, data: TensorDictBase) -> None:
        with self._lock:
            self.items.append(data)

    def __len__(self) -> int:
        with self._lock:
            return sum(int(d.numel()) for d in self.items)


@pytest.fixture
def list_buffer() -> ListBuffer:
    """A fresh :class:`ListBuffer`: records every batch a collector writes."""
    return ListBuffer()


@pytest.fixture(autouse=True)
def _torch_seed() -> None:
    torch.manual_seed(0)


# ------------------------------------------------------------------------ processes
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


@pytest.fixture
def no_leftover_processes():
    """Fail a test that leaves a child process running (workers, vector env subprocesses,
    Ray actors); autouse for the collector tests, used by the env worker tests."""
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


# ------------------------------------------------------------------------------------ Ray
def ray_processes(*, services: bool) -> dict[int, bytes]:
    """The Ray processes below this one: actors only, or (``services=True``) Ray's own too."""
    return {
        pid: cmdline
        for pid, (_, cmdline) in descendant_processes().items()
        if is_ray_process(cmdline) and (services or not is_ray_service(cmdline))
    }


def wait_for_no_ray_processes(*, services: bool, timeout: float) -> dict[int, bytes]:
    """Wait up to ``timeout`` s for every Ray process below this one to end; kill and return
    those left."""
    deadline = time.monotonic() + timeout
    left = ray_processes(services=services)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = ray_processes(services=services)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def shut_ray_down() -> dict[int, bytes]:
    """Shut down the Ray instance of this process (if any); the Ray processes left after
    10 s (killed)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    return wait_for_no_ray_processes(services=True, timeout=10.0)


@pytest.fixture(scope="session")
def _ray_session():
    """Shuts the tests' Ray instance down at the end of the session and checks that no Ray
    process (GCS, raylet, agents, workers, actors) is left."""
    yield
    left = shut_ray_down()
    assert not left, f"Ray processes left after the session: {left}"


def _running_ray() -> Any:
    """The ``ray`` module, with the tests' local Ray instance running (started on first use,
    ~5-10 s on this machine, and kept for the session)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if not ray.is_initialized():
        ray.init(**RAY_INIT)
    return ray


def _no_new_ray_actors(before: set[int], timeout: float) -> dict[int, bytes]:
    """Wait up to ``timeout`` s for every Ray actor process not in ``before`` to end; kill
    and return those left."""
    deadline = time.monotonic() + timeout
    left = {p: c for p, c in ray_processes(services=False).items() if p not in before}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p: c for p, c in ray_processes(services=False).items() if p not in before}
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture
def ray_instance(_ray_session):
    """The ``ray`` module, with the tests' local Ray instance running; after the test, no
    actor it started may be left running (their processes are checked; actors of a
    module-scoped fixture (:func:`ray_module`) that were running before the test are not the
    test's)."""
    ray = _running_ray()
    before = set(ray_processes(services=False))
    yield ray
    left = _no_new_ray_actors(before, timeout=5.0)
    assert not left, f"the test left Ray actors running: {left}"


@pytest.fixture(scope="module")
def ray_module(_ray_session):
    """:func:`ray_instance` for module-scoped fixtures whose collectors or buffers several
    tests of a module share (an actor start costs seconds): after the module, no actor
    started during it may be left running."""
    ray = _running_ray()
    before = set(ray_processes(services=False))
    yield ray
    left = _no_new_ray_actors(before, timeout=5.0)
    assert not left, f"the module left Ray actors running: {left}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Doctests and docs builds may start Ray too: nothing of it may outlive the session."""
    left = shut_ray_down()
    if left:
        print(f"\nRay processes left after the test session (killed): {left}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
