"""``splice.testing``'s fault env (the other helpers are exercised by every test that uses
them); its ``"block"`` fault is exercised end to end by the collectors' shutdown tests
(tests/collectors/test_multi.py, test_ray.py)."""

from __future__ import annotations

import pytest

from splice.testing import FaultyEnv


def test_faulty_env_counts_like_counting_env_until_its_step_then_raises(tmp_path):
    env = FaultyEnv(at=6, length=4)
    obs, _ = env.reset()
    totals = []
    for _ in range(5):  # across an episode end: the step count goes on
        obs, _, terminated, _, _ = env.step(0)
        totals.append(int(obs[0]))
        if terminated:
            env.reset()
    assert totals == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="env exploded at step 6"):
        env.step(0)
    with pytest.raises(ValueError, match="at step 6"):  # and at every later step
        env.step(0)


def test_a_marker_makes_the_raise_happen_once(tmp_path):
    marker = tmp_path / "raised"
    first = FaultyEnv(at=1, marker=str(marker))
    first.reset()
    with pytest.raises(ValueError):
        first.step(0)
    assert marker.exists()
    second = FaultyEnv(at=1, marker=str(marker))  # e.g. a replacement worker's env
    second.reset()
    assert int(second.step(0)[0][0]) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"at": 0}, ValueError, "at must be a step number >= 1"),
        ({"at": 2.0}, TypeError, "at must be an int"),
        ({"at": 2, "fault": "explode"}, ValueError, "fault must be 'raise' or 'block'"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        FaultyEnv(**kwargs)
