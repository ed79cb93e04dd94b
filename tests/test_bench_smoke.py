"""The collector benchmark runs end to end in its CI-sized mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_collector_quick():
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_collector", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    table = out.stdout.splitlines()
    assert any(line.startswith("| 1 env ") and "random" in line for line in table)
    assert any("1024 envs" in line and "n/a" in line for line in table)  # TorchRL cannot run it


def test_bench_trajectories_quick():
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_trajectories", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = out.stdout.splitlines()
    for section in ("## split_trajectories", "## Peak extra memory", "## cat_trajectories"):
        assert any(line.startswith(section) for line in lines), section
    assert (
        sum("| flat [5000] obs4 mean20" in line for line in lines) == 5
    )  # split x2, memory x2, cat
    assert any(line.startswith("| mean 200, cat") for line in lines)
