"""Non-tensor entries are refused by name everywhere, never silently dropped."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDictBase

from splice import Collector, LayoutError, ReplayBuffer, TrajectoryAssembler
from splice.policies import PolicyError
from splice.testing import synthetic_rollout


def with_note(batch: TensorDictBase) -> TensorDictBase:
    batch.set_non_tensor(("info", "note"), "hello")
    return batch


def test_replay_buffer_refuses_and_stays_empty() -> None:
    rb = ReplayBuffer()
    with pytest.raises(LayoutError, match=r"key \('info', 'note'\) holds NonTensorData"):
        rb.extend(with_note(synthetic_rollout(2, 10, 4.0)))
    assert len(rb) == 0


def test_assembler_refuses() -> None:
    with pytest.raises(LayoutError, match=r"\('info', 'note'\)"):
        TrajectoryAssembler().ingest(with_note(synthetic_rollout(2, 10, 4.0)))


def test_collector_refuses_a_policy_writing_non_tensors() -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        td.set_non_tensor("note", "hello")
        return td

    collector = Collector(gym.make("CartPole-v1"), policy, frames_per_batch=10, total_frames=10)
    with pytest.raises(PolicyError, match="'note' holds NonTensorData"):
        next(iter(collector))
    collector.shutdown()
