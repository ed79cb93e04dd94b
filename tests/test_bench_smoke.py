"""Every benchmark runs end to end in its CI-sized mode (``--quick``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(module: str, *args: str, timeout: float = 120) -> list[str]:
    """The stdout lines of ``python -m benchmarks.<module> --quick`` (which must succeed)."""
    out = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--quick", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return out.stdout.splitlines()


def test_bench_collector_quick() -> None:
    table = run_quick("bench_collector")
    assert any(line.startswith("| 1 env ") and "random" in line for line in table)
    assert any("1024 envs" in line and "n/a" in line for line in table)  # TorchRL cannot run it


def test_bench_collector_quick_subset() -> None:
    """``--envs``/``--policies`` run only those rows; the 1024-env rows bring the staging-layout
    table."""
    lines = run_quick("bench_collector", "--envs", "1024", "--policies", "random")
    rows = [line for line in lines if line.startswith("| ") and "envs" in line and "random" in line]
    assert len(rows) == 1 and rows[0].startswith("| 1024 envs")
    assert not any(line.startswith("| 1 env ") or "mlp" in line for line in lines)
    assert any(line.startswith("| time-major [C, B] (splice)") for line in lines)
    assert any("a write cursor per row" in line for line in lines)


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
    assert any(line.startswith("| splice, SliceSampler, [8, 125] batches") for line in lines)
    assert any(line.startswith("| raw slice copy (numpy)") for line in lines)
    assert any("writer / alone" in line for line in lines)
    if not any("PrioritizedSampler is unavailable" in line for line in lines):
        assert any(line.startswith("| sample() ") for line in lines)
        assert any(line.startswith("| raw: splice's draw + bare gather") for line in lines)
        assert any(line.startswith("| sample(), log-normal priorities") for line in lines)


def test_bench_envs_quick() -> None:
    lines = run_quick("bench_envs")
    ratio = re.compile(r"\| \d+\.\d\dx +\|$")
    assert any(line.startswith("| Pendulum-v1 ") and ratio.search(line) for line in lines)
    assert sum(bool(ratio.search(line)) for line in lines) >= 16 + 10  # every family, 1 and N
    assert any("| plain nn.Module " in line for line in lines)
    assert any("TensorDictModule (by hand)" in line for line in lines)
    assert any("random, action_mask" in line for line in lines)


def test_bench_targets_quick() -> None:
    lines = run_quick("bench_targets")
    for name in ("GAE", "TD(λ)", "V-trace"):
        rows = [line for line in lines if line.startswith(f"| {name} [")]
        assert len(rows) == 6, name  # three episode-length cases, round-robin and back to back
    assert all("n/a" not in line for line in lines if line.startswith("| GAE"))  # TorchRL ran
    assert all("n/a" not in line for line in lines if line.startswith("| V-trace"))  # rlox too


def test_bench_ppo_vs_sb3_quick(tmp_path: Path) -> None:
    lines = run_quick("bench_ppo_vs_sb3", "--out", str(tmp_path))
    assert any(line.startswith("| sb3 ") for line in lines)
    assert any(line.startswith("| splice ") for line in lines)
    assert {p.name for p in tmp_path.iterdir()} == {"sb3_s0.json", "splice_s0.json"}


@pytest.mark.timeout(480)
def test_bench_parallel_quick() -> None:
    # Starts processes, TorchRL's too, and a Ray instance with 2 actors.
    lines = run_quick("bench_parallel", timeout=420)
    for section in (
        "## Worker start-up",
        "## Scaling",
        "## vs TorchRL",
        "## Overhead",
        "## Sample",
        "## Ray vs process backend",
    ):
        assert any(line.startswith(section) for line in lines), section
    assert sum(line.startswith("| MultiSyncCollector | ") and " ms " in line for line in lines) == 2
    assert any(line.startswith("| MultiSyncCollector ") and "x" in line for line in lines)
    assert sum(line.startswith("| 1 env / worker") for line in lines) == 2
    assert any(line.startswith("end: load average") for line in lines)


def test_bench_dedup_quick() -> None:
    lines = run_quick("bench_dedup", timeout=300)
    for row in ("| splice, stored once", "| splice, both stored", "| TorchRL LazyTensorStorage"):
        assert any(line.startswith(row) for line in lines), row
    assert any(line.startswith("| atari [4, 84, 84] uint8") for line in lines)
    assert any(line.startswith("| minigrid [7, 7, 3] uint8") for line in lines)


def test_bench_agents_quick() -> None:
    lines = run_quick("bench_agents", timeout=300)
    rows = [
        line
        for line in lines
        if line.startswith("| simple_spread") or line.startswith("| tictactoe")
    ]
    assert len(rows) == 8
    assert all(re.search(r"\d\.\d\dx", row) for row in rows)
