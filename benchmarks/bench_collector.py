"""Collector throughput: bare gymnasium loop (the limit) vs splice vs TorchRL 0.14.1.

Same process, same env and the same policy object for every contender, timed round-robin
(``interleaved``) so machine noise hits all alike. Configurations: CartPole-v1 with 1 env,
8 envs (``SyncVectorEnv``; TorchRL: ``SerialEnv(8)``) and 1024 envs (gymnasium's vector entry
point, which TorchRL cannot wrap); a random policy and a 2x64 MLP (argmax of logits, a
````nn.Module``, TensorDict in and out); splice with and without ``trajs_per_batch``.

* bare: ``env.step`` + the policy call, no bookkeeping (random: ``action_space.sample()``;
  MLP: the policy on one reused TensorDict). Two counts:

  - ``bare fps`` (the headline, and the ``splice/bare`` ratios): live frames, the unit splice
    counts. A vector env (gymnasium's NEXT_STEP autoreset) makes the step after an env's
    episode ended a *dead* reset step: the action is ignored and the env only returns its
    reset observation, no transition happens. So a vector step counts ``n`` minus the number
    of envs whose previous step ended (``terminated | truncated``), one ``np.logical_or`` per
    step into a per-run buffer counted once per run. A single env (1 env rows) resets itself
    in the loop and has no dead steps: every step is a frame.
  - ``bare steps/s x envs``: vector steps per second times the number of envs, dead steps
    included (what ``bare fps`` counted before; the same as ``bare fps`` for a single env).
    With CartPole at 1024 envs the dead steps are ~4.5% of the steps with random actions and
    ~10% with the untrained MLP (shorter episodes).
* splice: ``splice.Collector`` iterated endlessly; frames = frames in the yielded batches.
* TorchRL: ``torchrl.collectors.Collector`` with ``GymEnv`` / ``SerialEnv`` (categorical
  actions), ``RandomPolicy`` or the same MLP.

Frames/s are wall-clock medians; on a machine shared with other work they are also given per
second of this process's CPU time (``time.process_time``; every contender runs in this
process, torch on one thread), which preemption does not distort: the ``(CPU)`` ratios.

A second table (with the 1024-env rows) prices the staging layouts for 1024 envs: the per-step
writes of one vector step's values (CartPole's observation as gymnasium returns it, reward,
flags, action) into time-major staging ``[C, B]`` (what splice does), into an env-major block
``[B, C]`` at one column for every row, and into an env-major block with a write cursor per
row (what a block that *becomes* the ``[B, T]`` batch needs, since NEXT_STEP's dead steps
shift rows apart); and the per-batch copy-out of a ``[B, T]`` batch (``np.take`` per key, the
rows' first columns a few apart) from either layout.

Run: ``python -m benchmarks.bench_collector [--quick] [--envs 1 8 1024]``; ``--envs`` runs only
the configurations with those numbers of envs (e.g. ``--envs 1024`` for the vector entry
point's rows alone), ``--policies`` only those policies (``random``, ``mlp``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

import splice
from benchmarks._harness import frames_per_second, load, parser, table


class MLPPolicy(torch.nn.Module):
    """A 2x64 MLP (tanh) whose argmax is the action; TensorDict in, TensorDict out.

    Written as a plain module rather than ``TensorDictModule``/``TensorDictSequential``: those
    wrappers cost ~70-120 us per call on this machine, more than the MLP itself (~30 us), and
    would dominate every contender alike.
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 2),
        )

    def forward(self, td: TensorDict) -> TensorDict:
        td["action"] = self.net(td["observation"]).argmax(-1)
        return td


def mlp_policy() -> MLPPolicy:
    torch.manual_seed(0)
    return MLPPolicy()


@dataclass
class Config:
    name: str
    num_envs: int  # 0 = a single gymnasium.Env
    vector_entry_point: bool = False
    fpb: int = 1000
    trajs: int = 40

    def make_env(self) -> Any:
        if self.num_envs == 0:
            return gym.make("CartPole-v1")
        if self.vector_entry_point:
            return gym.make_vec(
                "CartPole-v1", num_envs=self.num_envs, vectorization_mode="vector_entry_point"
            )
        return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * self.num_envs)


# ------------------------------------------------------------------ contenders
class Bare:
    """A hand-written loop, ``run(frames) -> live frames done`` (see the module docstring).

    A vector env's frames are its live transitions: ``n`` per vector step, minus the envs
    whose previous step ended (NEXT_STEP autoreset makes their step a dead reset step: the
    action is ignored, no transition happens; splice does not count it either).
    :attr:`stepped` is the last run's ``vector steps x envs``, dead steps included.
    """

    def __init__(self, config: Config, policy: Any) -> None:
        self.env = env = config.make_env()
        self.policy = policy
        self.single = config.num_envs == 0
        self.obs, _ = env.reset(seed=0)
        env.action_space.seed(0)
        self.n = 1 if self.single else config.num_envs
        self.td = TensorDict(
            {"observation": torch.from_numpy(np.asarray(self.obs))},
            batch_size=[] if self.single else [self.n],
        )
        # did each env's last step end its episode (its next step is a dead reset step)
        self.ended = np.zeros(self.n, np.bool_)
        self.stepped = 0

    def __call__(self, frames: int) -> int:
        env, policy, td, single, n, obs = (
            self.env,
            self.policy,
            self.td,
            self.single,
            self.n,
            self.obs,
        )
        steps = max(1, frames // n)
        # ends[i + 1]: the envs whose i-th step of this run ended (ends[0]: before the run);
        # written with one numpy call per step, counted once per run
        ends = np.empty((steps + 1, n), np.bool_)
        ends[0] = self.ended
        with torch.no_grad():
            for i in range(steps):
                if policy is None:
                    action = env.action_space.sample()
                else:
                    td.set("observation", torch.from_numpy(obs))
                    action = policy(td)["action"]
                    action = action.item() if single else action.numpy()
                obs, _, term, trunc, _ = env.step(action)
                if single:
                    if term or trunc:
                        obs, _ = env.reset()
                else:
                    np.logical_or(term, trunc, out=ends[i + 1])
        self.obs = obs
        self.stepped = steps * n
        if single:  # it resets itself: no dead steps
            return self.stepped
        self.ended = ends[steps].copy()
        return self.stepped - int(np.count_nonzero(ends[:steps]))


def batches(iterator: Iterator[Any], frames_of: Callable[[Any], int]) -> Callable[[int], int]:
    def run(frames: int) -> int:
        done = 0
        while done < frames:
            done += frames_of(next(iterator))
        return done

    return run


def splice_runner(config: Config, policy: Any, trajs: bool) -> tuple[Callable[[int], int], Any]:
    kwargs: dict[str, Any] = (
        {"trajs_per_batch": config.trajs, "traj_format": "cat"} if trajs else {}
    )
    collector = splice.Collector(
        config.make_env(), policy, frames_per_batch=config.fpb, seed=0, **kwargs
    )
    return batches(iter(collector), lambda b: b.numel()), collector


def torchrl_runner(
    config: Config, policy: Any, trajs: bool
) -> tuple[Callable[[int], int], Any] | None:
    if config.vector_entry_point:
        return None  # TorchRL 0.14.1 cannot wrap gymnasium's vector entry point
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, SerialEnv
    from torchrl.envs.utils import RandomPolicy

    def make() -> Any:
        return GymEnv("CartPole-v1", categorical_action_encoding=True)

    env = make() if config.num_envs == 0 else SerialEnv(config.num_envs, make)
    pol = RandomPolicy(env.action_spec) if policy is None else policy
    kwargs: dict[str, Any] = (
        {"trajs_per_batch": config.trajs, "traj_format": "cat"} if trajs else {}
    )
    collector = Collector(env, pol, frames_per_batch=config.fpb, total_frames=-1, **kwargs)
    return batches(iter(collector), lambda b: b.numel()), collector


# ------------------------------------------------------------ staging layouts
def staging_layouts(quick: bool) -> None:
    """Print per-step write and per-batch copy-out costs of the staging layouts (docstring)."""
    b, steps = 1024, 50
    cols = steps + 12
    env = gym.make_vec("CartPole-v1", num_envs=b, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
    values = {
        # splice's entering observation is the previous step's, read back from staging
        # (C-ordered); the next observation is gymnasium's (Fortran-ordered: its transpose)
        "observation": np.ascontiguousarray(obs),
        "next observation": obs,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "is_init": terminated,
        "action": env.action_space.sample(),
    }
    env.close()
    time_major = {k: np.zeros((cols, b, *v.shape[1:]), v.dtype) for k, v in values.items()}
    env_major = {k: np.zeros((b, cols, *v.shape[1:]), v.dtype) for k, v in values.items()}
    rows = np.arange(b)
    first = np.random.default_rng(0).integers(0, 4, b)  # each row's first column of the batch
    cursor = first + 10

    def write_time_major() -> None:
        for key, value in values.items():
            time_major[key][10] = value

    def write_env_major() -> None:
        for key, value in values.items():
            env_major[key][:, 10] = value

    def write_cursors() -> None:
        for key, value in values.items():
            env_major[key][rows, cursor] = value

    t = np.arange(steps)
    flat_tm = ((first[:, None] + t) * b + rows[:, None]).reshape(-1)
    flat_em = (rows[:, None] * cols + first[:, None] + t).reshape(-1)
    outs = {k: np.empty((b * steps, *v.shape[1:]), v.dtype) for k, v in values.items()}

    def gather(arrays: dict[str, np.ndarray], flat: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            for key, a in arrays.items():
                rows_of = a.reshape(cols * b, *a.shape[2:])
                np.take(rows_of, flat, axis=0, out=outs[key], mode="clip")

        return run

    repeats = 3 if quick else 15
    calls = 20 if quick else 200

    def per_call(fn: Callable[[], None]) -> float:
        best = []
        for _ in range(repeats):
            start = time.process_time()
            for _ in range(calls):
                fn()
            best.append((time.process_time() - start) / calls)
        return statistics.median(best)

    vector_steps = 52.5  # 50 valid steps and NEXT_STEP's dead steps (CartPole, random actions)
    layouts = [
        (
            "time-major [C, B] (splice)",
            per_call(write_time_major),
            per_call(gather(time_major, flat_tm)),
        ),
        (
            "env-major [B, C], one column for all rows",
            per_call(write_env_major),
            per_call(gather(env_major, flat_em)),
        ),
        (
            "env-major [B, C], a write cursor per row (becomes the batch)",
            per_call(write_cursors),
            0.0,
        ),
    ]
    rows_out = [
        [
            name,
            f"{write * 1e6:.1f}",
            f"{write * vector_steps * 1e3:.2f}",
            f"{copy * 1e3:.2f}",
            f"{(write * vector_steps + copy) * 1e3:.2f}",
        ]
        for name, write, copy in layouts
    ]
    print()
    print(
        f"Staging layouts at {b} envs, T = {steps} ({len(values)} keys; CPU time, medians): "
        "per-step writes and the copy-out of one batch"
    )
    headers = [
        "layout",
        "writes per vector step (us)",
        f"writes per batch (ms, {vector_steps} steps)",
        "copy-out per batch (ms)",
        "total per batch (ms)",
    ]
    print(table(headers, rows_out))


# ---------------------------------------------------------------------- main
def measure(
    config: Config, policy_name: str, *, frames: int, torchrl_frames: int, rounds: int
) -> list[Any]:
    policy = None if policy_name == "random" else mlp_policy()
    runs: dict[str, tuple[Callable[[int], int], int]] = {}
    closers = []
    bare = Bare(config, policy)
    runs["bare"] = (bare, frames)
    for trajs in (False, True):
        run, col = splice_runner(config, policy, trajs)
        runs["splice" + (" tpb" if trajs else "")] = (run, frames)
        closers.append(col.shutdown)
        made = torchrl_runner(config, policy, trajs)
        if made is not None:
            runs["torchrl" + (" tpb" if trajs else "")] = (made[0], torchrl_frames)
            closers.append(made[1].shutdown)
    cpu_rates: dict[str, list[float]] = {name: [] for name in runs}
    last_done: dict[str, int] = {}

    def on_cpu(name: str, run: Callable[[int], int]) -> Callable[[int], int]:
        def timed(n: int) -> int:
            start = time.process_time()
            done = run(n)
            cpu_rates[name].append(done / max(time.process_time() - start, 1e-9))
            last_done[name] = done
            return done

        return timed

    fps = frames_per_second(
        {name: (on_cpu(name, run), n) for name, (run, n) in runs.items()}, rounds=rounds
    )
    # the bare loop's old unit, vector steps x envs (dead steps included): its last run did
    # bare.stepped of them where it counted fps["bare"]'s frames
    live = last_done["bare"]
    fps["bare steps"] = fps["bare"] * bare.stepped / live
    # the first call of each contender is the harness's warm-up
    cpu = {name: statistics.median(r[1:] or r) for name, r in cpu_rates.items()}
    for close in closers:
        close()

    def cell(key: str) -> str:
        return f"{fps[key]:,.0f}" if key in fps else "n/a"

    def rel(a: str, b: str, rates: dict[str, float] = fps) -> str:
        return f"{rates[a] / rates[b]:.2f}x" if a in rates and b in rates else "n/a"

    return [
        config.name,
        policy_name,
        cell("bare"),
        cell("bare steps"),
        cell("splice"),
        cell("splice tpb"),
        cell("torchrl"),
        cell("torchrl tpb"),
        rel("splice", "bare"),
        rel("splice", "torchrl"),
        rel("splice tpb", "torchrl tpb"),
        rel("splice tpb", "splice"),
        rel("splice", "bare", cpu),
        rel("splice tpb", "splice", cpu),
    ]


def main() -> None:
    cli = parser(__doc__ or "")
    cli.add_argument(
        "--envs",
        type=int,
        nargs="+",
        choices=(1, 8, 1024),
        default=(1, 8, 1024),
        help="run only the configurations with these numbers of envs",
    )
    cli.add_argument(
        "--policies",
        nargs="+",
        choices=("random", "mlp"),
        default=("random", "mlp"),
        help="run only these policies",
    )
    args = cli.parse_args()
    torch.set_num_threads(1)
    quick = args.quick
    configs = [
        Config("1 env", 0, fpb=200 if quick else 1000, trajs=8 if quick else 40),
        Config(
            "8 envs (SyncVectorEnv / SerialEnv)",
            8,
            fpb=200 if quick else 1000,
            trajs=8 if quick else 40,
        ),
        Config(
            "1024 envs (vector entry point)",
            1024,
            vector_entry_point=True,
            fpb=1024 * (5 if quick else 50),
            trajs=200 if quick else 2000,
        ),
    ]
    configs = [c for c in configs if max(c.num_envs, 1) in args.envs]
    rows = []
    print(f"start: {load()}", flush=True)
    start = time.perf_counter()
    for config in configs:
        for policy_name in args.policies:
            big = config.num_envs >= 1024
            frames = config.fpb * (1 if quick else (4 if big else 20))
            rows.append(
                measure(
                    config,
                    policy_name,
                    frames=frames,
                    torchrl_frames=config.fpb * (1 if quick else 2),
                    rounds=1 if quick else 7,
                )
            )
            print(
                f"  done: {config.name}, {policy_name} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    headers = [
        "config",
        "policy",
        "bare fps",
        "bare steps/s x envs",
        "splice fps",
        "splice tpb fps",
        "TorchRL fps",
        "TorchRL tpb fps",
        "splice/bare",
        "splice/TorchRL",
        "tpb: splice/TorchRL",
        "tpb cost (splice tpb/splice)",
        "splice/bare (CPU)",
        "tpb cost (CPU)",
    ]
    print(f"end: {load()}")
    print()
    print("CartPole-v1 frames/s (median of round-robin runs; tpb = trajs_per_batch, 'cat')")
    print(table(headers, rows))
    if 1024 in args.envs:
        staging_layouts(quick)


if __name__ == "__main__":
    main()
