"""Every benchmark runs end to end in its CI-sized mode (``--quick``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_quick(module: str) -> list[str]:
    """The stdout lines of ``python -m benchmarks.<module> --quick`` (which must succeed)."""
    out = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.splitlines()


def test_bench_collector_quick() -> None:
    table = run_quick("bench_collector")
    assert any(line.startswith("| 1 env ") and "random" in line for line in table)
    assert any("1024 envs" in line and "n/a" in line for line in table)  # TorchRL cannot run it


def test_bench_trajectories_quick() -> None:
    lines = run_quick("bench_trajectories")
    for section in ("## split_trajectories", "## Peak extra memory", "## cat_trajectories"):
        assert any(line.startswith(section) for line in lines), section
    assert (
        sum("| flat [5000] obs4 mean20" in line for line in lines) == 5
    )  # split x2, memory x2, cat
    assert any(line.startswith("| mean 200, cat") for line in lines)


def test_bench_replay_quick() -> None:
    lines = run_quick("bench_replay")
    assert any("TorchRL SliceSampler(cache_values=True)" in line for line in lines)
    assert any("raw gather, precomputed slices" in line for line in lines)
    assert sum(line.startswith("| splice") for line in lines) >= 8


def test_bench_envs_quick() -> None:
    lines = run_quick("bench_envs")
    ratio = re.compile(r"\| \d+\.\d\dx +\|$")
    assert any(line.startswith("| Pendulum-v1 ") and ratio.search(line) for line in lines)
    assert sum(bool(ratio.search(line)) for line in lines) >= 16 + 10  # every family, 1 and N
    assert any("| plain nn.Module " in line for line in lines)
    assert any("TensorDictModule (by hand)" in line for line in lines)
    assert any("random, action_mask" in line for line in lines)
