"""The collection loop's options travel as one :class:`LoopOptions`: built by the settings
check from the public constructors' keywords, carried whole by a worker's spec, taken whole by
the rollout loop (which applies every one of them itself)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from splice import Collector, MultiAsyncCollector, MultiSyncCollector
from splice.collectors._settings import CollectorSettings, LoopOptions
from splice.collectors._worker import WorkerCore, WorkerSpec
from splice.collectors.ids import TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.envs import make_adapter
from splice.envs.infos import parse_info_keys
from splice.layout import CUT, IS_INIT, TRAJ_IDS, TRUNCATED
from splice.testing import counting_vec

OPTIONS = [field.name for field in dataclasses.fields(LoopOptions)]


def always_one(td):
    td["action"] = torch.ones(td.batch_size, dtype=torch.long)  # reward 1 per step
    return td


@pytest.mark.parametrize(
    "function",
    [CollectorSettings.check, Collector.__init__, MultiSyncCollector, MultiAsyncCollector],
)
def test_every_loop_option_is_a_keyword_of_the_check_and_of_the_public_constructors(function):
    params = inspect.signature(function).parameters
    for name in OPTIONS:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_the_check_builds_the_loop_options_normalised():
    settings = CollectorSettings.check(
        frames_per_batch=10,
        max_frames_per_traj=5,
        set_truncated=True,
        reset_at_each_iter=True,
        progress=True,  # implies track_episodes
        info_keys=["lives"],
        exclude_keys=["observation"],
        device="cpu",
        storing_device="cpu",
    )
    assert settings.loop == LoopOptions(
        max_frames_per_traj=5,
        set_truncated=True,
        reset_at_each_iter=True,
        track_episodes=True,
        info_keys=tuple(parse_info_keys(["lives"])),
        exclude_keys=(("observation",),),
        device=torch.device("cpu"),
        storing_device=torch.device("cpu"),
    )
    assert CollectorSettings.check(frames_per_batch=10).loop == LoopOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.loop.max_frames_per_traj = 6


def test_the_rollout_loop_applies_its_options():
    loop = RolloutLoop(
        make_adapter(counting_vec([100])),
        always_one,
        steps=6,
        ids=TrajectoryIds(),
        options=LoopOptions(max_frames_per_traj=4, reset_at_each_iter=True, track_episodes=True),
    )
    ids = set()
    for _ in range(3):
        batch = loop.collect()
        # reset_at_each_iter: every batch starts new episodes; max_frames_per_traj: cut at 4
        assert batch["observation"][0, :, 1].tolist() == [0, 1, 2, 3, 0, 1]
        assert batch[TRUNCATED][0, :, 0].tolist() == [False, False, False, True, False, False]
        assert bool(batch[IS_INIT][0, 0]) and bool(batch[CUT][0, -1])
        assert loop.episodes.returns.tolist() == [4.0]  # track_episodes
        ids |= {int(i) for i in batch[TRAJ_IDS].unique()}
    assert len(ids) == 6
    loop.close()


def test_without_options_the_loop_carries_episodes_across_batches():
    loop = RolloutLoop(make_adapter(counting_vec([100])), None, steps=5, ids=TrajectoryIds())
    first, second = loop.collect(), loop.collect()
    assert second["observation"][0, :, 1].tolist() == [5, 6, 7, 8, 9]
    assert int(second[TRAJ_IDS][0, 0]) == int(first[TRAJ_IDS][0, -1])
    assert loop.episodes.returns.size == 0  # no track_episodes
    loop.close()


def test_a_worker_spec_carries_the_loop_options_to_its_loop():
    spec = WorkerSpec(
        index=0,
        env=lambda: counting_vec([100]),
        policy=always_one,
        worker_id=TrajectoryIds().worker_id,
        loop=LoopOptions(max_frames_per_traj=4, reset_at_each_iter=True, track_episodes=True),
    )
    core = WorkerCore(spec)
    try:
        core.configure(steps=6)
        for _ in range(2):
            batch, returns = core.collect(random_actions=False)
            assert batch["observation"][0, :, 1].tolist() == [0, 1, 2, 3, 0, 1]
            assert returns.tolist() == [4.0]
    finally:
        core.close()
