"""``splice train``: any env with discrete actions, PPO, the summary, the figure, the progress bar.

Runs are CI-sized: 6,000 frames reach the first gradient steps (after 5,000) and the first
periodic evaluation (at 5,000 frames), so a kept checkpoint exists.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from splice.cli import build_parser, main
from splice.collectors._progress import make_bar


def _train(tmp_path: Path, *args: str) -> dict:
    assert main(["train", "--frames", "6000", "--output", str(tmp_path), *args]) == 0
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    return json.loads((tmp_path / "summary.json").read_text())


def test_popgym_env_trains_and_reports_kept_and_last_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = _train(tmp_path, "--env", "popgym-RepeatFirstEasy-v0", "--seed", "1")
    config = summary["config"]
    assert config["env_id"] == "popgym-RepeatFirstEasy-v0" and config["seed"] == 1
    assert summary["frames"] >= 6000 and summary["updates"] > 0
    # both models evaluated on the same 20 fresh episodes; popgym returns lie in [-1, 1]
    assert len(summary["final_returns"]) == len(summary["last_returns"]) == 20
    assert all(-1.0 - 1e-9 <= r <= 1.0 + 1e-9 for r in summary["last_returns"])
    assert summary["kept_frames"] == summary["curve"][0]["frames"]
    assert summary["kept_eval_return"] == summary["curve"][0]["eval_return"]
    out = capsys.readouterr().out
    assert "popgym-RepeatFirstEasy-v0" in out and "last weights" in out and "kept model" in out


def test_full_cartpole_without_the_mask(tmp_path: Path) -> None:
    summary = _train(tmp_path, "--agent", "mlp", "--no-mask-velocity", "--max-episode-steps", "50")
    assert summary["config"]["mask_velocity"] is False
    assert max(summary["last_returns"]) <= 50  # the time limit applies to evaluation too


def test_progress_bar_writes_a_few_lines_when_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the training loop reports progress every half second; a log gets the first and last
    # state of the bar plus a line per 20 s (LOG_INTERVAL) at most, and once tqdm's monitor
    # thread runs, one per 10 s (its maxinterval): bounded by the run's length, however long
    # that is on this machine (a 60-report run must not print 60 lines)
    started = time.monotonic()
    _train(tmp_path, "--agent", "mlp")
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    states = [s for s in re.split(r"[\r\n]+", err) if "frames" in s]
    assert 1 <= len(states) <= 2 + int(elapsed / 10), (elapsed, states)
    assert "6.0" in states[-1] or "6.1" in states[-1]  # the final count, ~6.0k frames


def test_progress_bar_is_live_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert make_bar(100, file=Terminal()).mininterval < 1.0
    assert make_bar(100, file=io.StringIO()).mininterval >= 10.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Pendulum-v1"], "actions must be Discrete"),
        (["--env", "NoSuchEnv-v0"], "unknown gymnasium env id"),
        (["--env", "popgym-RepeatFirstEasy-v0", "--mask-velocity"], "CartPole-v1 only"),
        (["--frames", "0"], "total_frames must be >= 1"),
        (["--gamma", "1.5"], "gamma must be in [0, 1]"),
    ],
)
def test_bad_arguments_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--output", str(tmp_path / "out"), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_default_is_velocity_masked_cartpole() -> None:
    args = build_parser().parse_args(["train"])
    assert (args.env, args.mask_velocity, args.agent) == ("CartPole-v1", None, "recurrent")


def test_algo_option_keeps_the_r2d2_options() -> None:
    args = build_parser().parse_args(["train"])
    assert (args.algo, args.agent, args.frames, args.time_limit) == (
        "r2d2",
        "recurrent",
        None,
        None,
    )
    args = build_parser().parse_args(["train", "--algo", "ppo", "--frames", "5000"])
    assert (args.algo, args.frames) == ("ppo", 5000)
    args = build_parser().parse_args(["train", "--agent", "all", "--seed", "3"])
    assert (args.algo, args.agent, args.seed) == ("r2d2", "all", 3)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--algo", "dqn"])


@pytest.mark.timeout(120)
def test_ppo_run_writes_summary_and_curve(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--algo", "ppo", "--frames", "6144", "--output", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["agent"] == "ppo" and summary["config"]["total_frames"] == 6144
    assert summary["frames"] >= 6144 and summary["updates"] > 0
    assert len(summary["final_returns"]) == 20 and len(summary["last_returns"]) == 20
    assert summary["final_mean"] > 0 and summary["last_mean"] > 0
    best = max(summary["curve"], key=lambda p: p["eval_return"])  # the kept checkpoint
    assert summary["kept_eval_return"] == best["eval_return"]
    assert summary["kept_frames"] in [p["frames"] for p in summary["curve"]]
    assert summary["curve"] and "eval_return" in summary["curve"][0]
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "ppo on velocity-masked CartPole-v1 (seed 0): greedy mean return" in out


def test_ppo_refuses_another_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--algo", "ppo", "--env", "Acrobot-v1", "--output", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    assert "velocity-masked CartPole-v1 only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import splice

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"splice {splice.__version__}\n"


def test_train_without_the_train_extra_names_the_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a),
    )
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--frames", "100", "--output", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pip install 'splice-rl[train]'" in err
    assert not any(tmp_path.iterdir())  # nothing written
