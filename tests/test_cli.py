"""``splice train``: the options, and a tiny PPO run end to end with its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splice.cli import build_parser, main


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
    assert summary["curve"] and "eval_return" in summary["curve"][0]
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "ppo (seed 0): greedy evaluation over 20 episodes" in out
