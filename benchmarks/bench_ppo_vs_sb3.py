"""Recurrent PPO on velocity-masked CartPole: splice's example agent vs sb3-contrib RecurrentPPO.

Run (one agent and seed per process, so a run can be repeated alone on a quiet machine)::

    python -m benchmarks.bench_ppo_vs_sb3 --agent sb3 --seed 0 --out docs/_data/ppo_vs_sb3
    python -m benchmarks.bench_ppo_vs_sb3 --agent splice --seed 0 --out docs/_data/ppo_vs_sb3
    python -m benchmarks.bench_ppo_vs_sb3 --report docs/_data/ppo_vs_sb3   # the table
    python -m benchmarks.bench_ppo_vs_sb3 --quick   # CI smoke: both agents, tiny budgets

* **Task**: CartPole-v1 with the two velocities removed (``splice.examples.masked_cartpole``),
  500-step time limit. sb3 steps 8 single envs in its ``DummyVecEnv`` (what the RL Zoo does);
  splice collects from gymnasium's vectorised CartPole.
* **sb3-contrib**: ``RecurrentPPO`` with the RL Zoo's tuned ``CartPoleNoVel-v1``
  hyperparameters (``hyperparams/ppo_lstm.yml``): ``VecNormalize`` (observations and rewards,
  gamma 0.98), 8 envs, ``n_steps`` 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8,
  learning rate and clip range decaying linearly from 1e-3 and 0.2, no entropy bonus, LSTM of
  64 with a separate critic LSTM, ReLU heads of 64, no orthogonal init, 100k frames.
* **splice**: ``splice.examples.ppo`` with its default configuration (5-minute limit).
* **Same evaluation for both**: every 5,000 frames, 20 greedy episodes side by side
  (``splice.examples.masked_cartpole.greedy_returns``, seeds ``10_000 + k``); at the end, 20
  episodes on seeds ``999_000 + seed`` with the last weights and with the best periodic
  checkpoint. The evaluation's own time is excluded from the clock.
* **Reported**: training seconds (wall, evaluation excluded) to the first periodic evaluation
  with a greedy mean >= 475, frames/s of collection and of training (frames collected divided
  by the time spent collecting, resp. updating), the final greedy means, and the machine's
  1-minute load average (``os.getloadavg``) sampled at every evaluation.

Both agents run with ``torch.set_num_threads(1)`` (fastest for these small networks on the
2-core machine, for both).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._harness import parser, table
from splice.examples.masked_cartpole import MaskVelocity, greedy_returns

SOLVED = 475.0
EVAL_EPISODES = 20
AGENTS = ("sb3", "splice")


def periodic_seed(k: int) -> int:
    """Seed of the ``k``-th periodic evaluation (same for both agents)."""
    return 10_000 + k


def final_seed(seed: int) -> int:
    """Seed of the final evaluation of run ``seed`` (never used before)."""
    return 999_000 + seed


def load_1min() -> float:
    return os.getloadavg()[0]


# --------------------------------------------------------------------------- sb3-contrib


def sb3_hyperparameters(quick: bool) -> dict[str, Any]:
    """The RL Zoo's CartPoleNoVel-v1 entry (``quick``: a tiny budget and 2 epochs)."""
    return {
        "n_envs": 8,
        "n_timesteps": 2_048 if quick else 100_000,
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 2 if quick else 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_0.001",
        "clip_range": "lin_0.2",
        "normalize": True,
        "policy_kwargs": {
            "ortho_init": False,
            "activation_fn": "ReLU",
            "lstm_hidden_size": 64,
            "enable_critic_lstm": True,
            "net_arch": {"pi": [64], "vf": [64]},
        },
    }


def run_sb3(seed: int, *, quick: bool, eval_every: int) -> dict[str, Any]:
    """Train sb3-contrib's RecurrentPPO with the Zoo's hyperparameters; evaluate as splice."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    hp = sb3_hyperparameters(quick)
    torch.set_num_threads(1)

    def linear(start: float) -> Any:  # the Zoo's "lin_<start>": start * progress_remaining
        return lambda progress_remaining: progress_remaining * start

    venv = make_vec_env("CartPole-v1", n_envs=hp["n_envs"], seed=seed, wrapper_class=MaskVelocity)
    venv = VecNormalize(venv, gamma=hp["gamma"])
    kwargs = dict(hp["policy_kwargs"], activation_fn=torch.nn.ReLU)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        venv,
        n_steps=hp["n_steps"],
        batch_size=hp["batch_size"],
        gae_lambda=hp["gae_lambda"],
        gamma=hp["gamma"],
        n_epochs=hp["n_epochs"],
        ent_coef=hp["ent_coef"],
        learning_rate=linear(0.001),
        clip_range=linear(0.2),
        policy_kwargs=kwargs,
        seed=seed,
        verbose=0,
        device="cpu",
    )

    def greedy(policy_state: dict[str, Any] | None, obs_rms: Any, episodes: int, k: int):
        if policy_state is not None:
            model.policy.load_state_dict(policy_state)
        state: Any = None
        start = np.ones(episodes, dtype=bool)

        def act(obs: np.ndarray) -> np.ndarray:
            nonlocal state, start
            normed = np.clip(
                (obs - obs_rms.mean) / np.sqrt(obs_rms.var + venv.epsilon),
                -venv.clip_obs,
                venv.clip_obs,
            ).astype(np.float32)
            action, state = model.predict(
                normed, state=state, episode_start=start, deterministic=True
            )
            start = np.zeros(episodes, dtype=bool)
            return action

        return greedy_returns(act, episodes, seed=k)

    clock = {"eval": 0.0, "eval_cpu": 0.0, "collect": 0.0, "train": 0.0}
    curve: list[dict[str, float]] = []
    best: dict[str, Any] = {"mean": -np.inf, "policy": None, "obs_rms": None}

    class Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.next_eval += eval_every
                t0, c0 = time.perf_counter(), time.process_time()
                seconds = t0 - start_wall - clock["eval"]
                cpu = c0 - start_cpu - clock["eval_cpu"]
                returns = greedy(None, venv.obs_rms, EVAL_EPISODES, periodic_seed(len(curve)))
                mean = float(returns.mean())
                if mean >= best["mean"]:
                    best.update(
                        mean=mean,
                        policy=copy.deepcopy(model.policy.state_dict()),
                        obs_rms=copy.deepcopy(venv.obs_rms),
                    )
                clock["eval"] += time.perf_counter() - t0
                clock["eval_cpu"] += time.process_time() - c0
                curve.append(point(self.num_timesteps, mean, seconds, cpu))
            return True

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            eval_before = clock["eval"]
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            clock[name] += time.perf_counter() - t0 - (clock["eval"] - eval_before)
            return out

        return wrapper

    # Time sb3's two phases without changing them: learn() looks both methods up on the model.
    model.collect_rollouts = timed("collect", model.collect_rollouts)  # type: ignore[method-assign]
    model.train = timed("train", model.train)  # type: ignore[method-assign]
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=hp["n_timesteps"], callback=Evaluate())
    train_seconds = time.perf_counter() - start_wall - clock["eval"]
    train_cpu = time.process_time() - start_cpu - clock["eval_cpu"]
    frames = int(model.num_timesteps)
    last = greedy(None, venv.obs_rms, EVAL_EPISODES, final_seed(seed))
    kept = last
    if best["policy"] is not None:
        kept = greedy(best["policy"], best["obs_rms"], EVAL_EPISODES, final_seed(seed))
    venv.close()
    return summarise(
        "sb3",
        seed,
        hp,
        curve,
        frames=frames,
        train_seconds=train_seconds,
        train_cpu_seconds=train_cpu,
        collect_seconds=clock["collect"],
        update_seconds=clock["train"],
        last_returns=last,
        kept_returns=kept,
    )


# --------------------------------------------------------------------------- splice


def run_splice(seed: int, *, quick: bool, eval_every: int) -> dict[str, Any]:
    """Train splice's example recurrent PPO with its default settings."""
    from dataclasses import asdict

    from splice.examples.ppo import PPOConfig, train

    config = PPOConfig(seed=seed, eval_every=eval_every, eval_every_episodes=EVAL_EPISODES)
    if quick:
        config = PPOConfig(
            seed=seed, total_frames=4_096, eval_every=eval_every, eval_episodes=EVAL_EPISODES
        )
    result = train(config)
    curve = [
        {
            "frames": p["frames"],
            "train_seconds": p["train_seconds"],
            "train_cpu_seconds": p["train_cpu_seconds"],
            "eval_return": p["eval_return"],
            "load_1min": p["load_1min"],
        }
        for p in result.curve
    ]
    return summarise(
        "splice",
        seed,
        asdict(config),
        curve,
        frames=result.frames,
        train_seconds=result.train_seconds - result.eval_seconds,
        train_cpu_seconds=result.train_cpu_seconds,
        collect_seconds=result.collect_seconds,
        update_seconds=result.update_seconds,
        last_returns=np.asarray(result.last_returns),
        kept_returns=np.asarray(result.final_returns),
    )


# --------------------------------------------------------------------------- reporting


def point(frames: int, mean: float, seconds: float, cpu: float) -> dict[str, float]:
    """A learning-curve point: training wall and CPU seconds so far (evaluations excluded)."""
    return {
        "frames": float(frames),
        "train_seconds": seconds,
        "train_cpu_seconds": cpu,
        "eval_return": mean,
        "load_1min": load_1min(),
    }


def summarise(
    agent: str,
    seed: int,
    config: dict[str, Any],
    curve: list[dict[str, float]],
    *,
    frames: int,
    train_seconds: float,
    train_cpu_seconds: float,
    collect_seconds: float,
    update_seconds: float,
    last_returns: np.ndarray,
    kept_returns: np.ndarray,
) -> dict[str, Any]:
    solved = next((p for p in curve if p["eval_return"] >= SOLVED), None)
    loads = [p["load_1min"] for p in curve]
    return {
        "agent": agent,
        "seed": seed,
        "config": config,
        "curve": curve,
        "frames": frames,
        "train_seconds": train_seconds,
        "train_cpu_seconds": train_cpu_seconds,
        "seconds_to_solved": solved["train_seconds"] if solved else None,
        "cpu_seconds_to_solved": solved["train_cpu_seconds"] if solved else None,
        "frames_to_solved": solved["frames"] if solved else None,
        "collect_fps": frames / collect_seconds if collect_seconds else None,
        "train_fps": frames / update_seconds if update_seconds else None,
        "final_mean_last": float(np.mean(last_returns)),
        "final_mean_kept": float(np.mean(kept_returns)),
        "last_returns": [float(r) for r in last_returns],
        "kept_returns": [float(r) for r in kept_returns],
        "load_1min_mean": statistics.fmean(loads) if loads else None,
        "load_1min_max": max(loads) if loads else None,
        "torch_threads": torch.get_num_threads(),
    }


def report(runs: list[dict[str, Any]]) -> str:
    """Per-seed rows and a median row per agent, plus the sb3/splice ratios of the medians."""

    def fmt(x: float | None, spec: str = ".0f") -> str:
        return "not reached" if x is None else format(x, spec)

    def median_or_none(values: list[float | None]) -> float | None:
        # A run that never reached the threshold counts as infinitely slow.
        med = statistics.median(float("inf") if v is None else v for v in values)
        return None if med == float("inf") else med

    rows = []
    medians: dict[str, dict[str, float | None]] = {}
    for agent in AGENTS:
        mine = sorted((r for r in runs if r["agent"] == agent), key=lambda r: r["seed"])
        if not mine:
            continue
        for r in mine:
            rows.append(
                [
                    agent,
                    r["seed"],
                    fmt(r["seconds_to_solved"]),
                    fmt(r["cpu_seconds_to_solved"], ".1f"),
                    fmt(r["frames_to_solved"]),
                    f"{r['train_seconds']:.0f}",
                    f"{r['collect_fps']:,.0f}",
                    f"{r['train_fps']:,.0f}",
                    f"{r['final_mean_last']:.1f}",
                    f"{r['final_mean_kept']:.1f}",
                    f"{r['load_1min_mean']:.1f} / {r['load_1min_max']:.1f}",
                ]
            )
        medians[agent] = {
            "wall": median_or_none([r["seconds_to_solved"] for r in mine]),
            "cpu": median_or_none([r["cpu_seconds_to_solved"] for r in mine]),
        }
        rows.append(
            [
                f"**{agent} median**",
                "",
                fmt(medians[agent]["wall"]),
                fmt(medians[agent]["cpu"], ".1f"),
                "",
                f"{statistics.median(r['train_seconds'] for r in mine):.0f}",
                f"{statistics.median(r['collect_fps'] for r in mine):,.0f}",
                f"{statistics.median(r['train_fps'] for r in mine):,.0f}",
                f"{statistics.median(r['final_mean_last'] for r in mine):.1f}",
                f"{statistics.median(r['final_mean_kept'] for r in mine):.1f}",
                "",
            ]
        )
    headers = [
        "agent",
        "seed",
        f"s to greedy >= {SOLVED:.0f}",
        "CPU s then",
        "frames then",
        "training s",
        "collect frames/s",
        "train frames/s",
        "final mean (last)",
        "final mean (kept)",
        "load mean / max",
    ]
    out = table(headers, rows)
    if "sb3" in medians and "splice" in medians:
        for clock in ("wall", "cpu"):
            sb3, ours = medians["sb3"][clock], medians["splice"][clock]
            if ours is None:
                continue
            speedup = "inf (sb3 did not reach it)" if sb3 is None else f"{sb3 / ours:.1f}x"
            out += f"\nmedian {clock} time to greedy >= {SOLVED:.0f}: sb3 / splice = {speedup}"
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--agent", choices=[*AGENTS, "both"], default="both")
    p.add_argument("--seed", type=int, nargs="+", default=None, help="seeds (default 0 1 2)")
    p.add_argument("--out", type=Path, default=None, help="write <agent>_s<seed>.json here")
    p.add_argument("--report", type=Path, default=None, help="print the table of a folder")
    p.add_argument("--eval-every", type=int, default=5_000, help="frames between evaluations")
    args = p.parse_args()
    if args.report is not None:
        runs = [json.loads(f.read_text()) for f in sorted(args.report.glob("*_s*.json"))]
        print(report(runs))
        return
    seeds = args.seed if args.seed is not None else ([0] if args.quick else [0, 1, 2])
    eval_every = 1_024 if args.quick else args.eval_every
    agents = AGENTS if args.agent == "both" else (args.agent,)
    runs = []
    for seed in seeds:
        for agent in agents:
            run = {"sb3": run_sb3, "splice": run_splice}[agent]
            result = run(seed, quick=args.quick, eval_every=eval_every)
            result["command"] = " ".join(["python -m benchmarks.bench_ppo_vs_sb3", *sys.argv[1:]])
            runs.append(result)
            print(
                f"{agent} seed {seed}: {result['seconds_to_solved']} s to greedy >= "
                f"{SOLVED:.0f}, final mean {result['final_mean_last']:.1f} (last) "
                f"{result['final_mean_kept']:.1f} (kept), {result['train_seconds']:.0f} s",
                flush=True,
            )
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                path = args.out / f"{agent}_s{seed}.json"
                path.write_text(json.dumps(result, indent=1))
    print(report(runs))


if __name__ == "__main__":
    main()
