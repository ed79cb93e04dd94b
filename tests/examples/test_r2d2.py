"""The recurrent DQN's training loop: rate limiter, time limit, schedules, kept vs last."""

from __future__ import annotations

import pytest

from splice.examples.r2d2 import R2D2Config, train

SMALL = {"learning_starts": 500, "eval_every": 1_000, "eval_episodes": 2, "eval_every_episodes": 4}


def _lag_bound(config: R2D2Config) -> int:
    """Frames the collector may be ahead of the learner: the limiter lets a batch start while
    the lag is at most two batches (the collecting thread checks it), so three batches at most,
    plus the rounding of one update's frames. Exact however the threads are scheduled."""
    batch = config.num_envs * config.steps_per_batch
    return config.learning_starts + 3 * batch + config.frames_per_update


def test_rate_limiter_holds_through_evaluations() -> None:
    # popgym evaluations step a python vector env: slow enough that a collector left running
    # during them runs ahead of the learner
    config = R2D2Config(env_id="popgym-RepeatFirstEasy-v0", total_frames=4_000, **SMALL)
    result = train(config)
    assert result.frames >= config.total_frames
    assert len(result.curve) == 4
    assert result.frames <= result.updates * config.frames_per_update + _lag_bound(config)


def test_time_limit_stops_collection_and_learning_together() -> None:
    config = R2D2Config(total_frames=10_000_000, time_limit=4.0, **SMALL)
    result = train(config)
    assert result.train_seconds < 4.0 + 10.0  # the last update and the collector's batch
    assert 0 < result.frames < 1_000_000
    assert result.frames <= result.updates * config.frames_per_update + _lag_bound(config)


def test_kept_checkpoint_and_last_weights_are_both_reported() -> None:
    result = train(R2D2Config(agent="mlp", total_frames=3_000, **SMALL))
    best = max(result.curve, key=lambda p: p["eval_return"])
    assert result.kept_eval_return == best["eval_return"]
    assert result.kept_frames in [p["frames"] for p in result.curve]
    assert len(result.final_returns) == len(result.last_returns) == SMALL["eval_episodes"]
    summary = result.summary()
    assert {"final_mean", "last_mean", "kept_frames", "kept_eval_return"} <= set(summary)

    last = train(R2D2Config(agent="mlp", total_frames=3_000, keep_best=False, **SMALL))
    assert last.kept_frames is None and last.final_returns == last.last_returns


def test_learning_rate_schedule() -> None:
    constant = R2D2Config(lr=1e-3)
    assert constant.learning_rate(0) == constant.learning_rate(10**9) == 1e-3
    decay = R2D2Config(lr=1e-3, lr_end=1e-4, total_frames=1_000)
    assert decay.learning_rate(0) == 1e-3
    assert decay.learning_rate(500) == pytest.approx(5.5e-4)
    assert decay.learning_rate(1_000) == decay.learning_rate(5_000) == pytest.approx(1e-4)
    late = R2D2Config(lr=1e-3, lr_end=0.0, lr_decay_start=600, total_frames=1_000)
    assert late.learning_rate(600) == 1e-3 and late.learning_rate(800) == pytest.approx(5e-4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 1.5}, "gamma must be in"),
        ({"reward_scale": 0.0}, "reward_scale must be > 0"),
        ({"agent": "lstm"}, "agent must be one of"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
    ],
)
def test_bad_config_values_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        R2D2Config(**kwargs)
