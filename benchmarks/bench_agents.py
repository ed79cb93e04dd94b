"""Multi-agent collection: a bare PettingZoo loop (the limit) vs splice's agent slots.

Same process, same env copies' work and the same policy object, timed round-robin
(``interleaved``) so that machine noise hits both alike. Tasks: MPE ``simple_spread_v3``
(parallel API, 3 agents, 25 steps per episode) and ``classic/tictactoe-v3`` (AEC API, two
players taking turns, an action mask), with 1 and 8 env copies; random actions and a 2x64
MLP shared by all agents (argmax of its logits, masked for tic-tac-toe).

* bare: the env copies stepped in turn in a plain loop, no bookkeeping. Parallel: one
  ``env.step({agent: action})`` per copy, a reset when no agent is left. AEC: per copy, dead
  agents stepped with ``None`` (no transition) and a reset when no agent is left, then one
  ``env.step(action)`` of the selected agent. Random actions: ``action_space(agent).sample()``
  (with the action mask for tic-tac-toe); MLP: ONE call per step on the observations of every
  acting agent of every copy (stacked into a reused TensorDict). Frames: agent transitions
  (one per acting agent per step).
* splice: ``Collector(PettingZooEnvs(make, n), policy)`` iterated endlessly; frames = agent
  steps in the yielded batches (each one a transition, as for the bare loop).
* policy on every slot (MLP only): the collector's engine (``RolloutLoop``) calling the
  policy on every agent slot at every step, the slots with no acting agent included, over
  the same engine calling it on the acting slots only (what splice does): the cost of the
  rows layout without the acting-slots gather.

Frames/s are wall-clock medians, and per second of this process's CPU time (``(CPU)``
ratios; torch on one thread).

Run: ``python -m benchmarks.bench_agents [--quick]``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pettingzoo
import torch
from mpe2 import simple_spread_v3
from tensordict import TensorDict

from benchmarks._harness import frames_per_second, load, parser, table
from splice import Collector
from splice.collectors.ids import TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.envs import make_adapter
from splice.envs.pettingzoo import PettingZooEnvs


@dataclass(frozen=True)
class Task:
    name: str
    make: Callable[[], Any]
    api: str  # "parallel" or "aec"
    obs_dim: int
    n_actions: int


TASKS = [
    Task("simple_spread (parallel)", lambda: simple_spread_v3.parallel_env(max_cycles=25),
         "parallel", 18, 5),
    Task("tictactoe (AEC)", lambda: pettingzoo.make("aec", "classic/tictactoe-v3"), "aec", 18,
         9),
]  # fmt: skip


KEYS = ("observation", "action_mask")  # tic-tac-toe's observation


class MLP(torch.nn.Module):
    """A 2x64 MLP shared by all agents: argmax of the logits (masked where the observation
    has an action mask)."""

    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
            torch.nn.Tanh(), torch.nn.Linear(64, n_actions),
        )  # fmt: skip

    @torch.no_grad()
    def forward(self, td: TensorDict) -> TensorDict:
        obs = td.get("observation")
        if isinstance(obs, TensorDict):  # tic-tac-toe: {"observation", "action_mask"}
            logits = self.net(obs["observation"].flatten(1).float())
            logits = logits.masked_fill(obs["action_mask"] == 0, -1e9)
        else:
            logits = self.net(obs.float())
        td["action"] = logits.argmax(-1)
        return td


class Bare:
    """The bare loop over ``n`` copies; ``run(frames)`` steps until that many transitions."""

    def __init__(self, task: Task, n: int, policy: MLP | None) -> None:
        self.task, self.policy = task, policy
        self.envs = [task.make() for _ in range(n)]
        for i, env in enumerate(self.envs):
            env.reset(seed=i)
        self.obs: list[dict[Any, Any]] = [{} for _ in self.envs]
        if task.api == "parallel":
            for i, env in enumerate(self.envs):
                self.obs[i], _ = env.reset(seed=i)
        self._td: TensorDict | None = None

    def _act(self, observations: list[Any]) -> list[int]:
        """The MLP on every acting agent's observation at once (one reused TensorDict)."""
        assert self.policy is not None
        if isinstance(observations[0], dict):
            obs = TensorDict(
                {k: torch.from_numpy(np.stack([o[k] for o in observations])) for k in KEYS},
                batch_size=[len(observations)],
            )
        else:
            obs = torch.from_numpy(np.stack(observations))
        td = TensorDict({"observation": obs}, batch_size=[len(observations)])
        return self.policy(td)["action"].tolist()

    def __call__(self, frames: int) -> int:
        done = 0
        while done < frames:
            done += self._parallel() if self.task.api == "parallel" else self._aec()
        return done

    def _parallel(self) -> int:
        done = 0
        if self.policy is not None:
            keys = [(i, a) for i, env in enumerate(self.envs) for a in env.agents]
            actions = iter(self._act([self.obs[i][a] for i, a in keys]))
        for i, env in enumerate(self.envs):
            if self.policy is None:
                act = {a: env.action_space(a).sample() for a in env.agents}
            else:
                act = {a: next(actions) for a in env.agents}
            self.obs[i], _, _, _, _ = env.step(act)
            done += len(act)
            if not env.agents:
                self.obs[i], _ = env.reset()
        return done

    def _aec(self) -> int:
        selected = []
        for env in self.envs:  # dead agents step None (no transition); a reset if none left
            while True:
                if not env.agents:
                    env.reset()
                obs, _, term, trunc, _ = env.last()
                if term or trunc:
                    env.step(None)
                    continue
                selected.append(obs)
                break
        if self.policy is None:
            actions = [
                env.action_space(env.agent_selection).sample(obs["action_mask"])
                for env, obs in zip(self.envs, selected, strict=True)
            ]
        else:
            actions = self._act(selected)
        for env, action in zip(self.envs, actions, strict=True):
            env.step(action)
        return len(self.envs)


def every_slot(adapter: Any) -> Any:
    """``adapter`` (an agent-slots adapter) running the policy on every slot, acting or not
    (the rows layout without the acting-slots gather; fine for a stateless policy)."""

    class EverySlot(type(adapter)):  # type: ignore[misc]
        def wrap_policy(self, policy: Any) -> Any:
            return policy

    adapter.__class__ = EverySlot
    return adapter


def splice_runner(task: Task, n: int, policy: Any) -> tuple[Callable[[int], int], Collector]:
    slots = n * (3 if task.api == "parallel" else 2)
    collector = Collector(PettingZooEnvs(task.make, n), policy, frames_per_batch=slots * 64, seed=0)
    iterator = iter(collector)

    def run(frames: int) -> int:
        done = 0
        while done < frames:
            done += next(iterator).numel()
        return done

    return run, collector


def loop_runner(
    task: Task, n: int, policy: Any, all_slots: bool
) -> tuple[Callable[[int], int], RolloutLoop]:
    """The collector's engine alone, with the policy on the acting slots or on every slot."""
    adapter = make_adapter(PettingZooEnvs(task.make, n))
    if all_slots:
        every_slot(adapter)
    loop = RolloutLoop(adapter, policy, steps=64, ids=TrajectoryIds(), seed=0)

    def run(frames: int) -> int:
        done = 0
        while done < frames:
            done += loop.collect().numel()
        return done

    return run, loop


def measure(task: Task, n: int, policy_name: str, frames: int, rounds: int) -> list[str]:
    policy = None if policy_name == "random" else MLP(task.obs_dim, task.n_actions)
    runs: dict[str, tuple[Callable[[int], int], int]] = {"bare": (Bare(task, n, policy), frames)}
    run, collector = splice_runner(task, n, policy)
    runs["splice"] = (run, frames)
    closers = [collector.shutdown]
    if policy is not None:
        for all_slots in (False, True):
            run, loop = loop_runner(task, n, policy, all_slots)
            runs["loop" + (" every slot" if all_slots else "")] = (run, frames)
            closers.append(loop.close)
    cpu_rates: dict[str, list[float]] = {name: [] for name in runs}

    def on_cpu(name: str, run: Callable[[int], int]) -> Callable[[int], int]:
        def timed(k: int) -> int:
            start = time.process_time()
            done = run(k)
            cpu_rates[name].append(done / max(time.process_time() - start, 1e-9))
            return done

        return timed

    fps = frames_per_second({k: (on_cpu(k, r), f) for k, (r, f) in runs.items()}, rounds=rounds)
    cpu = {name: statistics.median(r[1:] or r) for name, r in cpu_rates.items()}
    for close in closers:
        close()

    def rel(a: str, b: str, rates: dict[str, float]) -> str:
        return f"{rates[a] / rates[b]:.2f}x" if a in rates and b in rates else "n/a"

    return [
        task.name,
        str(n),
        policy_name,
        f"{fps['bare']:,.0f}",
        f"{fps['splice']:,.0f}",
        rel("splice", "bare", fps),
        rel("splice", "bare", cpu),
        rel("loop every slot", "loop", cpu),
    ]


def main() -> None:
    cli = parser(__doc__ or "")
    args = cli.parse_args()
    torch.set_num_threads(1)
    quick = args.quick
    print(f"start: {load()}", flush=True)
    rows = []
    for task in TASKS:
        for n in (1, 8):
            for policy_name in ("random", "mlp"):
                frames = (2_000 if quick else 20_000) * (1 if n == 1 else 2)
                rows.append(measure(task, n, policy_name, frames, rounds=1 if quick else 3))
                print(f"  done: {task.name}, {n} envs, {policy_name}", flush=True)
    print(f"end: {load()}")
    print()
    print("Agent transitions/s (median of round-robin runs)")
    headers = [
        "task",
        "env copies",
        "policy",
        "bare fps",
        "splice fps",
        "splice/bare",
        "splice/bare (CPU)",
        "policy on every slot / acting slots (CPU)",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
