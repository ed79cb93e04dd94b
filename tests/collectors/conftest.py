"""Collector test fixtures: no test may leave a process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

# Long-lived helpers that multiprocessing starts once per session (not workers): the fork
# server (its children ARE workers and are checked) and the resource tracker.
_HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")


def _children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def live_descendants() -> set[int]:
    """Every process below this one, except multiprocessing's helpers themselves (but
    including the processes forked by the fork server, which share its command line).
    Zombies do not count."""
    children = _children_of()
    found: set[int] = set()
    todo = [(os.getpid(), False)]  # (pid, is a helper)
    while todo:
        parent, parent_is_helper = todo.pop()
        for child in children.get(parent, []):
            helper = not parent_is_helper and any(h in _cmdline(child) for h in _HELPERS)
            todo.append((child, helper))
            if helper:
                continue
            try:
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                found.add(child)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail a test that leaves a child process running (workers, vector env subprocesses)."""
    before = live_descendants()
    yield
    deadline = time.monotonic() + 5.0
    left = live_descendants() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = live_descendants() - before
    if left:
        described = {pid: _cmdline(pid).replace(b"\0", b" ")[:120] for pid in left}
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the test left {len(left)} process(es) running: {described}")
