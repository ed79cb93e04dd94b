"""The ``splice`` command: ``splice train`` trains an agent on velocity-masked CartPole.

``--algo r2d2`` (the default) runs the recurrent DQN of :mod:`splice.examples.r2d2`,
``--algo ppo`` the recurrent PPO of :mod:`splice.examples.ppo`.

Examples:
    >>> from splice.cli import build_parser
    >>> args = build_parser().parse_args(["train", "--agent", "mlp", "--frames", "1000"])
    >>> args.agent, args.frames, args.seed
    ('mlp', 1000, 0)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from splice.examples.ppo import PPOConfig
from splice.examples.r2d2 import AGENTS, R2D2Config, TrainResult

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``splice`` command."""
    defaults = R2D2Config()
    parser = argparse.ArgumentParser(
        prog="splice", description="splice: whole, correct RL trajectories."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        help="train a recurrent DQN (or PPO) on velocity-masked CartPole",
        description=(
            "Train an agent on CartPole-v1 with the velocities removed from the observation, "
            "evaluate it greedily over 20 episodes, and write the learning curve (PNG) and a "
            "JSON summary to the output folder."
        ),
    )
    train.add_argument(
        "--agent",
        choices=[*AGENTS, "all"],
        default="recurrent",
        help="recurrent (R2D2-style, default), mlp (no memory), naive (recurrent on fixed "
        "windows that cross episode ends), or all three in turn",
    )
    train.add_argument(
        "--algo",
        choices=["r2d2", "ppo"],
        default="r2d2",
        help="r2d2 (recurrent DQN, default; --agent picks its variant) or ppo (recurrent PPO)",
    )
    train.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ppo = PPOConfig()
    train.add_argument(
        "--frames",
        type=int,
        default=None,
        help=f"environment steps to collect (default {defaults.total_frames}, ppo "
        f"{ppo.total_frames})",
    )
    train.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help=f"stop training after this many seconds (default {defaults.time_limit:.0f}, ppo "
        f"{ppo.time_limit:.0f})",
    )
    train.add_argument("--output", type=Path, default=Path("outputs/train"), help="output folder")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``splice`` console script."""
    args = build_parser().parse_args(argv)
    given = {"total_frames": args.frames, "time_limit": args.time_limit}
    given = {k: v for k, v in given.items() if v is not None}
    if args.algo == "ppo":
        run_one(PPOConfig(seed=args.seed, **given), args.output, quiet=args.quiet)
        return 0
    agents = list(AGENTS) if args.agent == "all" else [args.agent]
    results: dict[str, TrainResult] = {}
    for agent in agents:
        config = R2D2Config(agent=agent, seed=args.seed, **given)
        out = args.output / agent if len(agents) > 1 else args.output
        results[agent] = run_one(config, out, quiet=args.quiet)
    if len(agents) > 1:
        figure = plot_curves(results, args.output / "learning_curves.png")
        print(f"comparison figure: {figure}")
    return 0


def run_one(config: R2D2Config | PPOConfig, output: Path, *, quiet: bool) -> TrainResult:
    """Train one agent with a progress bar; write ``summary.json`` and ``learning_curve.png``."""
    from splice.examples import ppo, r2d2

    output.mkdir(parents=True, exist_ok=True)
    bar = None if quiet else _progress_bar(config)
    last_eval = float("nan")

    def progress(point: dict[str, float]) -> None:
        nonlocal last_eval
        last_eval = point.get("eval_return", last_eval)
        if bar is not None:
            bar.n = int(point["frames"])
            bar.set_postfix(
                episodes=int(point["episodes"]),
                ret=f"{point['recent_return']:.0f}",
                eval=f"{last_eval:.0f}",
                loss=f"{point['loss']:.3f}",
                refresh=False,
            )
            bar.refresh()

    try:
        if isinstance(config, PPOConfig):
            result: TrainResult = ppo.train(config, progress=progress)
        else:
            result = r2d2.train(config, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    summary = result.summary()
    (output / "summary.json").write_text(json.dumps(summary, indent=2))
    figure = plot_curves({config.agent: result}, output / "learning_curve.png")
    print(
        f"{config.agent} (seed {config.seed}): greedy evaluation over {config.eval_episodes} "
        f"episodes: mean return {result.final_mean:.1f} (last weights: "
        f"{summary['last_mean']:.1f}); {result.frames} frames, {result.updates} updates, "
        f"{result.wall_seconds:.0f} s"
    )
    print(f"summary: {output / 'summary.json'}\nlearning curve: {figure}")
    return result


def plot_curves(results: dict[str, TrainResult], path: Path) -> Path:
    """Greedy evaluation return (and training-episode return) against frames, one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (agent, result) in enumerate(results.items()):
        color = f"C{i}"
        frames = [p["frames"] for p in result.curve]
        ax.plot(frames, [p["eval_return"] for p in result.curve], color=color, label=agent)
        ax.plot(
            frames,
            [p["recent_return"] for p in result.curve],
            color=color,
            alpha=0.35,
            linestyle="--",
        )
    ax.axhline(400, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("frames collected")
    ax.set_ylabel("return (max 500)")
    ax.set_title("Velocity-masked CartPole: greedy evaluation (solid), training episodes (dashed)")
    ax.title.set_fontsize(9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _progress_bar(config: R2D2Config | PPOConfig) -> Any:
    from splice.collectors._progress import require_tqdm

    tqdm = require_tqdm()
    return tqdm(
        total=config.total_frames,
        unit="frames",
        unit_scale=True,
        desc=config.agent,
        dynamic_ncols=True,
        file=sys.stderr,
    )


if __name__ == "__main__":
    raise SystemExit(main())
