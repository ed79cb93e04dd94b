"""Trajectory ids: unique across envs, batches and collectors; state_dict continues them."""

from __future__ import annotations

import pytest
import torch

from splice import Collector, TrajectoryIds
from splice.collectors.ids import ID_BITS, MAX_WORKER_ID, worker_of
from splice.testing import counting_vec


def _episode_ids(batches) -> list[torch.Tensor]:
    """Per batch: the id of each episode that starts in it."""
    return [b["collector", "traj_ids"][b["is_init"].squeeze(-1)] for b in batches]


def test_ids_unique_across_envs_and_batches_and_continue_across_cuts():
    with Collector(
        counting_vec([1, 3, 4, 7]), frames_per_batch=40, total_frames=400, worker_id=60
    ) as c:
        batches = list(c)
    started = torch.cat(_episode_ids(batches))
    assert started.unique().numel() == started.numel()  # every episode got its own id
    data = torch.cat(batches, 1)
    ids = data["collector", "traj_ids"]
    # one id per episode: ids change exactly where an episode starts, and never come back
    change = ids[:, 1:] != ids[:, :-1]
    assert torch.equal(change, data["is_init"].squeeze(-1)[:, 1:])
    assert set(ids.unique().tolist()) == set(started.tolist())
    assert bool((worker_of(ids) == 60).all())
    # ids are drawn in order of episode start (time, then env row)
    first = batches[0]["collector", "traj_ids"]
    assert torch.equal(first[:, 0], torch.arange(4) + (60 << ID_BITS))
    # env 0 (length 1) ends first: its second episode takes the next id, at time step 1
    assert int(first[0, 1]) == 4 + (60 << ID_BITS)


def test_two_collectors_with_different_id_spaces_never_collide():
    a = Collector(counting_vec([2, 3]), frames_per_batch=20, total_frames=100, worker_id=61)
    b = Collector(counting_vec([2, 3]), frames_per_batch=20, total_frames=100, worker_id=62)
    ids_a = torch.cat([x["collector", "traj_ids"].flatten() for x in a])
    ids_b = torch.cat([x["collector", "traj_ids"].flatten() for x in b])
    assert not set(ids_a.tolist()) & set(ids_b.tolist())
    a.shutdown()
    b.shutdown()


def test_collectors_without_worker_id_get_distinct_spaces():
    a = Collector(counting_vec([2]), frames_per_batch=4)
    b = Collector(counting_vec([2]), frames_per_batch=4)
    assert a.ids.worker_id != b.ids.worker_id
    ia = next(iter(a))["collector", "traj_ids"].flatten()
    ib = next(iter(b))["collector", "traj_ids"].flatten()
    assert not set(ia.tolist()) & set(ib.tolist())
    a.shutdown()
    b.shutdown()


def test_state_dict_round_trip_continues_ids():
    first = Collector(counting_vec([2, 3]), frames_per_batch=20, total_frames=60, worker_id=63)
    seen = torch.cat([x["collector", "traj_ids"].flatten() for x in first])
    state = first.state_dict()
    first.shutdown()
    assert state["ids"] == {"worker_id": 63, "next": int(seen.max() - (63 << ID_BITS)) + 1}
    second = Collector(counting_vec([2, 3]), frames_per_batch=20, total_frames=120, worker_id=64)
    second.load_state_dict(state)
    assert second.frames == 60
    assert len(second) == 3
    later = torch.cat([x["collector", "traj_ids"].flatten() for x in second])
    assert later.numel() == 60  # the frame budget continues too
    assert int(later.min()) == int(seen.max()) + 1  # fresh episodes, next ids of the saved space
    second.shutdown()


def test_trajectory_ids_validation():
    with pytest.raises(ValueError, match="worker_id"):
        TrajectoryIds(-1)
    with pytest.raises(ValueError, match="worker_id"):
        TrajectoryIds(MAX_WORKER_ID + 1)
    ids = TrajectoryIds(65, start=2**ID_BITS - 1)
    ids.take(1)
    with pytest.raises(ValueError, match="exhausted"):
        ids.take(1)
