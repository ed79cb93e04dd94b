"""Collector test fixtures: no test may leave a process behind (``no_leftover_processes`` of
tests/conftest.py, for every test here); a script's workers watched while its interpreter
exits."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_test_leaves_a_process(no_leftover_processes):
    """Every collector test checks that it left no process running (tests/conftest.py)."""
    return


# ------------------------------------------------------------------------ interpreter exit
@dataclass
class ExitRun:
    """What :func:`exit_run` saw of a script that exits without shutting its collectors down."""

    #: The worker pids the script printed.
    pids: list[int]
    #: ``time.time()`` the script printed as its last act before the interpreter exits.
    exit_began: float
    #: ``time.time()`` at which every worker had ended, or None if some had not after the wait.
    workers_ended: float | None
    returncode: int
    stderr: str


def _ended(pid: int) -> bool:
    """The process is gone or a zombie (it has ended; its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def exit_run(tmp_path: Path) -> Callable[..., ExitRun]:
    """``run(source, env, wait=30.0) -> ExitRun``: runs ``source`` as a script that prints its
    workers' pids on one line and ``time.time()`` on the next, then exits without shutting
    anything down; the workers are watched WHILE its interpreter exits, so the time at which
    the last one ended is measured (not the time the interpreter, or a fork server, took to
    tear itself down afterwards). The script's whole run is bounded by the test's timeout."""

    def run(source: str, env: dict[str, str], wait: float = 30.0) -> ExitRun:
        script = tmp_path / "exit_without_shutdown.py"
        script.write_text(source)
        errors = tmp_path / "exit_run_stderr.txt"
        with errors.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(script)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
            )
        try:
            assert proc.stdout is not None
            pid_line, time_line = proc.stdout.readline(), proc.stdout.readline()
            if not time_line:
                proc.wait(timeout=60)
                raise AssertionError(f"the script ended early: {errors.read_text()[-3000:]}")
            pids = [int(p) for p in pid_line.split()]
            exit_began = float(time_line)
            deadline = time.monotonic() + wait
            while not all(_ended(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.02)
            workers_ended = time.time() if all(_ended(pid) for pid in pids) else None
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return ExitRun(pids, exit_began, workers_ended, proc.returncode, errors.read_text())

    return run
