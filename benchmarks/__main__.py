"""Run every benchmark in turn: ``python -m benchmarks [--quick]``."""

from __future__ import annotations

import sys

from benchmarks import bench_collector, bench_envs, bench_replay, bench_trajectories

for name, module in [
    ("trajectories", bench_trajectories),
    ("collector", bench_collector),
    ("replay", bench_replay),
    ("envs", bench_envs),
]:
    print(f"\n# {name}\n", flush=True)
    sys.argv = [f"benchmarks.bench_{name}", *sys.argv[1:]]
    module.main()
