"""Collector(track_episodes=True) records every finished episode's return, in order."""

from __future__ import annotations

import gymnasium as gym
import torch

from splice import Collector
from splice.layout import DONE, REWARD, TRAJ_IDS


def test_episode_log_matches_the_data() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    collector = Collector(env, frames_per_batch=150, total_frames=1500, seed=0, track_episodes=True)
    batches = list(collector)
    data = torch.cat([b.reshape(-1) for b in batches])
    ends = data[DONE].view(-1)
    expected = [float(data[REWARD][data[TRAJ_IDS] == t].sum()) for t in data[TRAJ_IDS][ends]]
    logged = collector.episode_log
    assert sorted(r for _, r in logged) == sorted(expected)
    assert len(logged) == int(ends.sum()) > 10
    frames = [f for f, _ in logged]
    assert frames == sorted(frames) and frames[-1] <= 1500 and frames[0] % 150 == 0


def test_no_log_by_default() -> None:
    collector = Collector(gym.make("CartPole-v1"), frames_per_batch=100, total_frames=300, seed=0)
    list(collector)
    assert collector.episode_log == []
