"""Any env, any policy: collector frames/s vs a bare gymnasium loop, and policy forms.

Two tables, every contender timed round-robin in one process (``interleaved``):

1. **Env families** (the env zoo: Pendulum, Hopper, raw MiniGrid with its text mission, Pong
   with AtariPreprocessing + FrameStackObservation, popgym, Taxi with ``info_keys=
   ["action_mask"]``, FrozenLake, Blackjack), random actions, 1 env and ``N`` envs
   (``SyncVectorEnv``, NEXT_STEP autoreset): ``splice.Collector`` vs a bare loop on the same
   env and env count (``env.step(action_space.sample())``, resetting a single env at episode
   ends; dead reset steps are not counted as frames by either).
   Target: splice/bare >= 0.85.
2. **Policy forms and info cost**: a 2x64 MLP mapping Pendulum's observation to the action,
   passed to the collector as the plain ``nn.Module`` (:func:`splice.policies.as_policy`) vs
   the same module wrapped by hand in a ``TensorDictModule`` and in a ``td -> td`` function
   (target: plain within 10% of the hand-wrapped module); and Taxi collected with and without
   ``info_keys=["action_mask"]``.

Like with like: both sides run the same env (same wrappers, e.g. Blackjack's
``RecordEpisodeStatistics``; same ``SyncVectorEnv`` and autoreset mode), seeded alike, with
the same random actions; the bare loop stores nothing, splice stores every step (and the
``info_keys`` entries) and copies out batches of ``frames_per_batch``.

Run: ``python -m benchmarks.bench_envs [--quick] [--cpu-time]``. ``--cpu-time`` times in CPU
time of the process (``time.process_time``; both sides are single-threaded), which leaves out
the time other processes take from a busy machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.vector import SyncVectorEnv
from tensordict.nn import TensorDictModule

import splice
from benchmarks._harness import frames_per_second, parser, table
from benchmarks.bench_collector import batches
from splice.testing import ENV_ZOO, EnvFamily

MAX_STEPS = 200  # every family's episodes are cut here (gymnasium's TimeLimit)
#: Frames per timed call relative to the others: slow envs get fewer.
SCALE = {"hopper": 0.5, "minigrid": 0.5, "atari": 0.1}
LABEL = {
    "minigrid": "MiniGrid-MemoryS7 (raw, text)",
    "atari": "Pong (Atari wrappers, 4x84x84)",
    "taxi": "Taxi-v4 + action_mask",
    "blackjack": "Blackjack + episode statistics",
}


def make_env(family: EnvFamily, n: int) -> Any:
    """One env (``n == 0``) or ``n`` envs in a ``SyncVectorEnv`` (gymnasium's default NEXT_STEP
    autoreset, what a bare loop relies on)."""
    if n == 0:
        return family.make(MAX_STEPS)
    family.make().close()  # ImportError before any env is built
    return SyncVectorEnv([lambda: family.make(MAX_STEPS)] * n)


def bare(env: Any, single: bool) -> Callable[[int], int]:
    """``env.step(action_space.sample())`` in a loop; returns ``run(frames) -> frames``,
    counting real transitions only (NEXT_STEP's dead reset steps are not frames)."""
    env.reset(seed=0)
    env.action_space.seed(0)
    n = 1 if single else env.num_envs
    sample, step = env.action_space.sample, env.step
    state = {"ended": np.zeros(n, np.bool_)}

    def run(frames: int) -> int:
        done, ended = 0, state["ended"]
        while done < frames:
            _, _, term, trunc, _ = step(sample())
            if single:
                done += 1
                if term or trunc:
                    env.reset()
            else:
                done += n - int(np.count_nonzero(ended))  # a dead step after every end
                ended = term | trunc
        state["ended"] = ended
        return done

    return run


def collectors(
    contenders: dict[str, tuple[Any, Any, dict[str, Any]]],
    frames: int,
    rounds: int,
    clock: Callable[[], float],
) -> dict[str, float]:
    """Frames/s of a ``splice.Collector`` per contender ``name -> (env, policy, kwargs)``."""
    runs, made = {}, []
    for name, (env, policy, kwargs) in contenders.items():
        c = splice.Collector(env, policy, seed=0, **kwargs)
        runs[name] = (batches(iter(c), lambda b: b.numel()), frames)
        made.append(c)
    try:
        return frames_per_second(runs, rounds=rounds, clock=clock)
    finally:
        for c in made:
            c.shutdown()


def env_families(
    num_envs: int, frames: int, fpb: int, rounds: int, clock: Callable[[], float]
) -> list[list[str]]:
    rows = []
    for family in ENV_ZOO:
        label = LABEL.get(family.name, family.env_id)
        try:
            family.make().close()
        except ImportError as e:  # an optional env package (extra 'envs') is missing
            rows.append([label, "-", "n/a", "n/a", f"not installed ({e.name})"])
            continue
        scale = SCALE.get(family.name, 1.0)
        size, todo = max(1, round(fpb * scale)), max(1, round(frames * scale))
        for n in (0, num_envs):
            bare_env = make_env(family, n)
            kwargs = {"frames_per_batch": size, "info_keys": family.info_keys}
            c = splice.Collector(make_env(family, n), seed=0, **kwargs)
            fps = frames_per_second(
                {
                    "bare": (bare(bare_env, n == 0), todo),
                    "splice": (batches(iter(c), lambda b: b.numel()), todo),
                },
                rounds=rounds,
                clock=clock,
            )
            c.shutdown()
            bare_env.close()
            rows.append(
                [
                    label,
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


def policy_forms(
    num_envs: int, frames: int, fpb: int, rounds: int, clock: Callable[[], float]
) -> list[list[str]]:
    pendulum = EnvFamily("pendulum", "Pendulum-v1")
    taxi = EnvFamily("taxi", "Taxi-v4")
    rows = []
    for n in (0, num_envs):
        net = mlp(3, 1)

        def by_hand(td: Any, net: torch.nn.Module = net) -> Any:
            td["action"] = net(td["observation"])
            return td

        policies = {
            "plain nn.Module": net,
            "TensorDictModule (by hand)": TensorDictModule(net, ["observation"], ["action"]),
            "td -> td function (by hand)": by_hand,
        }
        kw = {"frames_per_batch": fpb}
        fps = collectors(
            {k: (make_env(pendulum, n), p, kw) for k, p in policies.items()},
            frames,
            rounds,
            clock,
        )
        for name, value in fps.items():
            config = f"Pendulum, {max(n, 1)} env(s), 2x64 MLP"
            ratio = fps["plain nn.Module"] / value
            rows.append([config, name, f"{value:,.0f}", f"{ratio:.2f}x"])
    for n in (0, num_envs):
        fps = collectors(
            {
                "random, no info_keys": (make_env(taxi, n), None, {"frames_per_batch": fpb}),
                "random, action_mask": (
                    make_env(taxi, n),
                    None,
                    {"frames_per_batch": fpb, "info_keys": ["action_mask"]},
                ),
            },
            frames,
            rounds,
            clock,
        )
        base = fps["random, no info_keys"]
        for name, value in fps.items():
            rows.append(
                [f"Taxi, {max(n, 1)} env(s)", name, f"{value:,.0f}", f"{value / base:.2f}x"]
            )
    return rows


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--cpu-time", action="store_true", help="time in CPU time, not wall time")
    args = p.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(1)
    quick = args.quick
    num_envs = 2 if quick else 8
    fpb = 100 if quick else 1000
    frames = fpb * (1 if quick else 5)
    rounds = 1 if quick else 15  # the cheapest envs need them: 7 rounds moved +-0.07x
    start = time.perf_counter()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    family_rows = env_families(num_envs, frames, fpb, rounds, clock)
    print(f"  done: env families ({time.perf_counter() - start:.0f} s)", flush=True)
    policy_rows = policy_forms(num_envs, frames, fpb, rounds, clock)
    print(f"  done: policy forms ({time.perf_counter() - start:.0f} s)", flush=True)
    print()
    unit = "frames per CPU second" if args.cpu_time else "frames/s"
    print(f"## Env families: collector vs a bare gymnasium loop (random actions, {unit})")
    print(table(["env", "envs", "bare fps", "splice fps", "splice/bare"], family_rows))
    print()
    print("## Policy forms and info_keys (frames/s; ratio: plain module / row, or row / base)")
    print(table(["config", "policy", "splice fps", "ratio"], policy_rows))
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
