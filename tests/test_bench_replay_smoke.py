"""The replay benchmark runs end to end in its CI-sized mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_bench_replay_quick() -> None:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_replay", "--quick"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "TorchRL SliceSampler(cache_values=True)" in out
    assert "raw gather, precomputed slices" in out
    assert out.count("| splice") >= 8
