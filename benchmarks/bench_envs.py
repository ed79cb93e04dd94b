"""Any env, any policy: collector frames/s vs a bare gymnasium loop, and policy forms.

Two tables, every contender timed round-robin in one process (``interleaved``):

1. **Env families** (the env zoo: Pendulum, Hopper, raw MiniGrid with its text mission, Pong
   with AtariPreprocessing + FrameStackObservation, popgym, Taxi with ``info_keys=
   ["action_mask"]``, FrozenLake, Blackjack), random actions, 1 env and ``N`` envs
   (``SyncVectorEnv``): ``splice.Collector`` vs a bare loop on the same env and env count
   (``env.step(action_space.sample())``, resetting a single env at episode ends; for vector
   envs the bare frames include NEXT_STEP's dead reset steps, which splice does not count).
   Target: splice/bare >= 0.85.
2. **Policy forms and info cost**: a 2x64 MLP mapping Pendulum's observation to the action,
   passed to the collector as the plain ``nn.Module`` (:func:`splice.policies.as_policy`) vs
   the same module wrapped by hand in a ``TensorDictModule`` and in a ``td -> td`` function
   (target: plain within 10% of the hand-wrapped module); and Taxi collected with and without
   ``info_keys=["action_mask"]``.

Run: ``python -m benchmarks.bench_envs [--quick]``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch
from gymnasium.vector import SyncVectorEnv
from tensordict.nn import TensorDictModule

import splice
from benchmarks._harness import interleaved, parser, table
from benchmarks.bench_collector import batches

MAX_STEPS = 200  # every family's episodes are cut here (gymnasium's TimeLimit)


@dataclass(frozen=True)
class Family:
    name: str
    env_id: str
    package: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    wrap: Callable[[gym.Env], gym.Env] | None = None
    info_keys: list[str] | None = None
    #: frames per timed call, relative to the others (slow envs: fewer)
    scale: float = 1.0

    def make(self) -> gym.Env:
        if self.package == "ale_py":
            import ale_py

            gym.register_envs(ale_py)
        elif self.package is not None:
            __import__(self.package)
        env = gym.make(self.env_id, max_episode_steps=MAX_STEPS, **self.kwargs)
        return self.wrap(env) if self.wrap is not None else env

    def make_env(self, n: int) -> Any:
        return self.make() if n == 0 else SyncVectorEnv([self.make] * n)


def atari(env: gym.Env) -> gym.Env:
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, noop_max=0)
    return gym.wrappers.FrameStackObservation(env, 4)


FAMILIES = [
    Family("Pendulum-v1", "Pendulum-v1"),
    Family("Hopper-v5", "Hopper-v5", "mujoco", scale=0.5),
    Family("MiniGrid-MemoryS7 (raw, text)", "MiniGrid-MemoryS7-v0", "minigrid", scale=0.5),
    Family(
        "Pong (Atari wrappers, 4x84x84)",
        "ALE/Pong-v5",
        "ale_py",
        {"frameskip": 1},
        atari,
        scale=0.1,
    ),
    Family("popgym RepeatPreviousEasy", "popgym-RepeatPreviousEasy-v0", "popgym"),
    Family("Taxi-v4 + action_mask", "Taxi-v4", info_keys=["action_mask"]),
    Family("FrozenLake-v1", "FrozenLake-v1"),
    Family("Blackjack-v1", "Blackjack-v1"),
]


def bare(env: Any, single: bool) -> Callable[[int], int]:
    """``env.step(action_space.sample())`` in a loop; returns ``run(frames) -> frames``."""
    env.reset(seed=0)
    env.action_space.seed(0)
    n = 1 if single else env.num_envs
    sample, step = env.action_space.sample, env.step

    def run(frames: int) -> int:
        steps = max(1, frames // n)
        for _ in range(steps):
            _, _, term, trunc, _ = step(sample())
            if single and (term or trunc):
                env.reset()
        return steps * n

    return run


def collector(env: Any, policy: Any = None, **kw: Any) -> tuple[Callable[[int], int], Any]:
    c = splice.Collector(env, policy, seed=0, **kw)
    return batches(iter(c), lambda b: b.numel()), c


def timed(runs: dict[str, tuple[Callable[[int], int], int]], rounds: int) -> dict[str, float]:
    """Frames/s of every contender (median of round-robin rounds)."""
    done: dict[str, int] = {}

    def contender(name: str, run: Callable[[int], int], n: int) -> Callable[[], None]:
        def call() -> None:
            done[name] = run(n)

        return call

    timings = interleaved({k: contender(k, r, n) for k, (r, n) in runs.items()}, rounds=rounds)
    return {k: done[k] / t.median for k, t in timings.items()}


def env_families(num_envs: int, frames: int, fpb: int, rounds: int) -> list[list[str]]:
    rows = []
    for family in FAMILIES:
        try:
            family.make().close()
        except ImportError as e:  # an optional env package (extra 'envs') is missing
            rows.append([family.name, "-", "n/a", "n/a", f"not installed ({e.name})"])
            continue
        for n in (0, num_envs):
            bare_env = family.make_env(n)
            size = max(1, round(fpb * family.scale))
            run, c = collector(
                family.make_env(n), frames_per_batch=size, info_keys=family.info_keys
            )
            todo = max(size, round(frames * family.scale))
            fps = timed({"bare": (bare(bare_env, n == 0), todo), "splice": (run, todo)}, rounds)
            c.shutdown()
            bare_env.close()
            rows.append(
                [
                    family.name,
                    str(max(n, 1)),
                    f"{fps['bare']:,.0f}",
                    f"{fps['splice']:,.0f}",
                    f"{fps['splice'] / fps['bare']:.2f}x",
                ]
            )
    return rows


def mlp(obs_dim: int, out: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(obs_dim, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, out),
    )


def policy_forms(num_envs: int, frames: int, fpb: int, rounds: int) -> list[list[str]]:
    rows = []
    for n in (0, num_envs):
        net = mlp(3, 1)

        def by_hand(td: Any, net: torch.nn.Module = net) -> Any:
            td["action"] = net(td["observation"])
            return td

        contenders = {
            "plain nn.Module": net,
            "TensorDictModule (by hand)": TensorDictModule(net, ["observation"], ["action"]),
            "td -> td function (by hand)": by_hand,
        }
        runs, closers = {}, []
        for name, policy in contenders.items():
            run, c = collector(Family("", "Pendulum-v1").make_env(n), policy, frames_per_batch=fpb)
            runs[name] = (run, frames)
            closers.append(c)
        fps = timed(runs, rounds)
        for c in closers:
            c.shutdown()
        plain = fps["plain nn.Module"]
        for name in contenders:
            rows.append(
                [
                    f"Pendulum, {max(n, 1)} env(s), 2x64 MLP",
                    name,
                    f"{fps[name]:,.0f}",
                    f"{plain / fps[name]:.2f}x",
                ]
            )
    for n in (0, num_envs):
        taxi = Family("", "Taxi-v4")
        runs, closers = {}, []
        for name, keys in (
            ("random, no info_keys", None),
            ("random, action_mask", ["action_mask"]),
        ):
            run, c = collector(taxi.make_env(n), frames_per_batch=fpb, info_keys=keys)
            runs[name] = (run, frames)
            closers.append(c)
        fps = timed(runs, rounds)
        for c in closers:
            c.shutdown()
        base = fps["random, no info_keys"]
        for name in runs:
            rows.append(
                [f"Taxi, {max(n, 1)} env(s)", name, f"{fps[name]:,.0f}", f"{fps[name] / base:.2f}x"]
            )
    return rows


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    torch.set_num_threads(1)
    quick = args.quick
    num_envs = 2 if quick else 8
    fpb = 100 if quick else 1000
    frames = fpb * (1 if quick else 5)
    rounds = 1 if quick else 7
    start = time.perf_counter()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    family_rows = env_families(num_envs, frames, fpb, rounds)
    print(f"  done: env families ({time.perf_counter() - start:.0f} s)", flush=True)
    policy_rows = policy_forms(num_envs, frames, fpb, rounds)
    print(f"  done: policy forms ({time.perf_counter() - start:.0f} s)", flush=True)
    print()
    print("## Env families: collector vs a bare gymnasium loop (random actions, frames/s)")
    print(table(["env", "envs", "bare fps", "splice fps", "splice/bare"], family_rows))
    print()
    print("## Policy forms and info_keys (frames/s; ratio: plain module / row, or row / base)")
    print(table(["config", "policy", "splice fps", "ratio"], policy_rows))
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
