"""The ``splice`` command: ``splice train`` trains an agent on a partially observed task.

``--algo r2d2`` (the default) runs the recurrent DQN of :mod:`splice.examples.r2d2`, on
velocity-masked CartPole or, with ``--env ID``, on any gymnasium env id with discrete actions
(``popgym-RepeatFirstEasy-v0``, ``Acrobot-v1``, ...); ``--algo ppo`` runs the recurrent PPO
of :mod:`splice.examples.ppo` (velocity-masked CartPole only).

``splice --version`` prints the installed version.

Examples:
    >>> from splice.cli import build_parser
    >>> args = build_parser().parse_args(["train", "--agent", "mlp", "--frames", "1000"])
    >>> args.agent, args.frames, args.seed, args.env, args.mask_velocity
    ('mlp', 1000, 0, 'CartPole-v1', None)
    >>> print(build_parser().format_usage().strip())
    usage: splice [-h] [--version] {train} ...
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from splice import __version__
from splice.collectors._progress import make_bar
from splice.examples.ppo import PPOConfig
from splice.examples.r2d2 import AGENTS, R2D2Config, TrainResult
from splice.examples.tasks import MASKABLE

__all__ = ["build_parser", "main"]

#: What ``splice train`` imports besides the core (the ``train`` extra): progress bar, figures.
_TRAIN_EXTRA = ("tqdm", "matplotlib")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``splice`` command."""
    defaults = R2D2Config()
    parser = argparse.ArgumentParser(
        prog="splice", description="splice: whole, correct RL trajectories."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        help="train a recurrent DQN or PPO (default task: velocity-masked CartPole)",
        description=(
            "Train an agent on a gymnasium env with discrete actions (default: CartPole-v1 "
            "with the velocities removed from the observation), evaluate the kept model (the "
            "checkpoint with the best periodic evaluation) and the last weights greedily over "
            "20 fresh episodes, and write the learning curve (PNG) and a JSON summary to the "
            "output folder."
        ),
    )
    train.add_argument(
        "--env",
        default=MASKABLE,
        metavar="ID",
        help=f"gymnasium env id with discrete actions, e.g. popgym-RepeatFirstEasy-v0 "
        f"(default {MASKABLE})",
    )
    train.add_argument(
        "--mask-velocity",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"remove the velocities from {MASKABLE}'s observation (default: on for "
        f"{MASKABLE}; other envs are used as they are)",
    )
    train.add_argument(
        "--max-episode-steps",
        type=int,
        default=None,
        metavar="N",
        help="time limit of every episode (default: the env's own)",
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
        help="r2d2 (recurrent DQN, default; --agent picks its variant) or ppo (recurrent PPO, "
        f"velocity-masked {MASKABLE} only)",
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
    train.add_argument(
        "--gamma",
        type=float,
        default=None,
        help=f"discount (default {defaults.gamma}, ppo {ppo.gamma})",
    )
    train.add_argument(
        "--reward-scale",
        type=float,
        default=None,
        help="multiply rewards by this in the learning targets (returns are reported "
        f"unscaled; default {defaults.reward_scale:g}, ppo {ppo.reward_scale:g})",
    )
    train.add_argument("--output", type=Path, default=Path("outputs/train"), help="output folder")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``splice`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    missing = [name for name in _TRAIN_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        parser.error(
            f"splice train needs {' and '.join(missing)}, which the core install leaves out: "
            "pip install 'splice-rl[train]'"
        )
    given = {
        "total_frames": args.frames,
        "time_limit": args.time_limit,
        "gamma": args.gamma,
        "reward_scale": args.reward_scale,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if args.algo == "ppo":
        task = (args.env, args.mask_velocity, args.max_episode_steps)
        if task != (MASKABLE, None, None) and task != (MASKABLE, True, None):
            parser.error(
                f"--algo ppo trains on velocity-masked {MASKABLE} only (no --env, "
                "--no-mask-velocity or --max-episode-steps)"
            )
        try:
            ppo_config = PPOConfig(seed=args.seed, **given)
        except ValueError as error:
            parser.error(str(error))
        run_one(ppo_config, args.output, quiet=args.quiet)
        return 0
    agents = list(AGENTS) if args.agent == "all" else [args.agent]
    results: dict[str, TrainResult] = {}
    for agent in agents:
        try:  # a bad value, env id or space: a usage error, before anything is written
            config = R2D2Config(
                agent=agent,
                env_id=args.env,
                mask_velocity=args.mask_velocity,
                max_episode_steps=args.max_episode_steps,
                seed=args.seed,
                **given,
            )
            config.make_env(1).close()
        except ValueError as error:
            parser.error(str(error))
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
    bar = None if quiet else make_bar(config.total_frames, desc=config.agent)
    last_eval = float("nan")

    def progress(point: dict[str, float]) -> None:
        nonlocal last_eval
        last_eval = point.get("eval_return", last_eval)
        if bar is not None:
            bar.set_postfix(
                episodes=int(point["episodes"]),
                ret=f"{point['recent_return']:.4g}",
                eval=f"{last_eval:.4g}",
                loss=f"{point['loss']:.3f}",
                refresh=False,
            )
            bar.update(int(point["frames"]) - bar.n)  # prints at most every mininterval

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
    kept = (
        f"kept model (best periodic evaluation, at {result.kept_frames} frames)"
        if result.kept_frames is not None
        else "last weights"
    )
    print(
        f"{config.agent} on {_task_name(config)} (seed {config.seed}): greedy mean return over "
        f"{config.eval_episodes} fresh episodes: {kept} {result.final_mean:.4g}, last weights "
        f"{summary['last_mean']:.4g}; {result.frames} frames, {result.updates} updates, "
        f"{result.wall_seconds:.0f} s"
    )
    print(f"summary: {output / 'summary.json'}\nlearning curve: {figure}")
    return result


def plot_curves(results: dict[str, TrainResult], path: Path) -> Path:
    """Greedy evaluation return (and training-episode return) against frames, one figure."""
    import gymnasium as gym
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fields = next(iter(results.values())).config
    config = R2D2Config(**fields) if "env_id" in fields else R2D2Config()  # ppo: masked CartPole
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
    threshold = gym.spec(config.env_id.rpartition(":")[2]).reward_threshold
    if threshold is not None:
        ax.axhline(threshold, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("frames collected")
    ax.set_ylabel("return")
    ax.set_title(f"{_task_name(config)}: greedy evaluation (solid), training episodes (dashed)")
    ax.title.set_fontsize(9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _task_name(config: R2D2Config | PPOConfig) -> str:
    if isinstance(config, PPOConfig):
        return f"velocity-masked {MASKABLE}"
    return f"velocity-masked {config.env_id}" if config.masked else config.env_id


if __name__ == "__main__":
    raise SystemExit(main())
