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
