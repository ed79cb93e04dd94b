"""Run every benchmark in turn: ``python -m benchmarks [--quick]``.

The recurrent-PPO comparison with sb3-contrib (``benchmarks.bench_ppo_vs_sb3``) is a set of
training runs of several minutes each, run on its own (see its docstring).
"""

from __future__ import annotations

import sys

from benchmarks import (
    bench_agents,
    bench_collector,
    bench_dedup,
    bench_envs,
    bench_parallel,
    bench_replay,
    bench_targets,
    bench_trajectories,
)

for name, module in [
    ("trajectories", bench_trajectories),
    ("collector", bench_collector),
    ("replay", bench_replay),
    ("dedup", bench_dedup),
    ("targets", bench_targets),
    ("envs", bench_envs),
    ("parallel", bench_parallel),
    ("agents", bench_agents),
]:
    print(f"\n# {name}\n", flush=True)
    sys.argv = [f"benchmarks.bench_{name}", *sys.argv[1:]]
    module.main()
