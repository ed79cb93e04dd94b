"""The env zoo: real env families from their own packages, collected as a new user would
(raw envs, no wrapper of ours), single and vectorised, split, assembled and replayed; the first
episode of every env row checked step by step against a hand-run of the same env with the same
seed and actions.

The families are :data:`splice.testing.ENV_ZOO`. Optional env packages (extra ``envs``) are
skipped with a reason only when not installed.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from tensordict import TensorDictBase

from splice import (
    Collector,
    LayoutError,
    ReplayBuffer,
    SliceSampler,
    TrajectoryAssembler,
    split_trajectories,
)
from splice._non_tensor import non_tensor_values
from splice.envs.spaces import flattener, observation_leaves
from splice.replay import LazyTensorStorage
from splice.testing import ENV_ZOO, EnvFamily

#: Every episode is cut at this many steps (gymnasium's TimeLimit), so that short runs hold
#: whole episodes to assemble.
MAX_STEPS = 25
IDS = [f.name for f in ENV_ZOO]


def make(family: EnvFamily) -> gym.Env:
    try:
        return family.make(MAX_STEPS)
    except ImportError as e:
        pytest.skip(f"{family.package} is not installed (extra 'envs'): {e}")


def make_vec(family: EnvFamily, n: int = 2) -> SyncVectorEnv:
    make(family).close()  # skips when the package is missing
    return family.make_vec(n, MAX_STEPS)


def leaves_of(batch: TensorDictBase, prefix: tuple[str, ...], keys: list) -> list[np.ndarray]:
    out = []
    for key in keys:
        value = batch.get((*prefix, *key))
        out.append(value.numpy() if isinstance(value, torch.Tensor) else non_tensor_values(value))
    return out


def check_first_episode(family: EnvFamily, row: TensorDictBase, seed: int) -> int:
    """Replay the row's actions in a fresh env reset with ``seed``; compare every step of the
    first episode. Returns the number of steps compared."""
    env = make(family)
    space = env.observation_space
    leaves = observation_leaves(space)
    keys = [leaf.key for leaf in leaves]
    flatten = flattener(space)
    info_keys = family.info_keys or []
    info_keys = list(info_keys) if not isinstance(info_keys, dict) else []
    obs, info = env.reset(seed=seed)
    assert bool(row["is_init"][0])
    actions = row["action"].numpy()
    for t in range(row.shape[0]):
        for got, want in zip(leaves_of(row[t], ("observation",), keys), flatten(obs), strict=True):
            assert np.array_equal(got, np.asarray(want, dtype=got.dtype)), (family.name, t)
        for k in info_keys:
            assert np.array_equal(row[t][k].numpy(), info[k]), (family.name, k, t)
        action = actions[t].item() if actions[t].ndim == 0 else actions[t]
        obs, reward, terminated, truncated, info = env.step(action)
        nxt = leaves_of(row[t], ("next", "observation"), keys)
        for got, want in zip(nxt, flatten(obs), strict=True):
            assert np.array_equal(got, np.asarray(want, dtype=got.dtype)), (family.name, t)
        assert row["next", "reward"][t].item() == np.float32(reward), (family.name, t)
        assert bool(row["next", "terminated"][t]) == terminated
        assert bool(row["next", "truncated"][t]) == truncated
        for k in info_keys:
            assert np.array_equal(row[t]["next", k].numpy(), info[k]), (family.name, k, t)
        if isinstance(family.info_keys, dict) and (terminated or truncated):
            assert row["next", "episode", "r"][t].item() == info["episode"]["r"]
        if terminated or truncated:
            env.close()
            return t + 1
    env.close()
    return row.shape[0]


@pytest.mark.parametrize("family", ENV_ZOO, ids=IDS)
@pytest.mark.parametrize("vector", [False, True], ids=["single", "vector"])
def test_collect_matches_hand_run(family: EnvFamily, vector: bool) -> None:
    env = make_vec(family) if vector else make(family)
    with Collector(
        env, frames_per_batch=60, total_frames=60, seed=7, info_keys=family.info_keys
    ) as c:
        (batch,) = list(c)
    rows = [batch[i] for i in range(2)] if vector else [batch]
    compared = [check_first_episode(family, row, 7 + i) for i, row in enumerate(rows)]
    assert min(compared) >= 1
    for key in family.non_tensor:
        assert not isinstance(batch.get(key), torch.Tensor)  # carried, not dropped
    if family.name == "atari":  # the standard wrappers: 4 stacked 84x84 grey frames
        assert batch["observation"].shape[-3:] == (4, 84, 84)
        assert batch["observation"].dtype == torch.uint8


def pipeline(family: EnvFamily, exclude: bool) -> None:
    """Collect two batches; split them, assemble whole episodes, write them to a replay buffer
    and sample slices."""
    kwargs = {"exclude_keys": list(family.non_tensor)} if exclude else {}
    with Collector(
        make_vec(family),
        frames_per_batch=60,
        total_frames=120,
        seed=3,
        info_keys=family.info_keys,
        **kwargs,
    ) as c:
        batches = list(c)
    assembler = TrajectoryAssembler()
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1000), sampler=SliceSampler(slice_len=3), batch_size=12
    )
    for batch in batches:
        split = split_trajectories(batch)
        assert int(split["collector", "mask"].sum()) == batch.numel()
        ids = split["collector", "traj_ids"]
        assert bool(((ids == ids[:, :1]) | ~split["collector", "mask"]).all())
        assembler.ingest(batch)
        rows = rb.extend(batch)
        stored = rb[rows.reshape(-1)]
        for key in batch.keys(True, True):
            assert torch.equal(stored[key], batch.reshape(-1)[key]), key
    episodes = assembler.emit(len(assembler))
    assert len(assembler) == 0 and episodes.shape[0] >= 1
    mask = episodes["collector", "mask"]
    last = mask.sum(-1) - 1
    assert bool(episodes["is_init"][:, 0].all())
    assert bool(episodes["next", "done"][torch.arange(len(last)), last].all())
    sample = rb.sample()
    assert torch.equal(sample["action"], rb[sample["index"]]["action"])


@pytest.mark.parametrize("family", ENV_ZOO, ids=IDS)
def test_split_assemble_replay(family: EnvFamily) -> None:
    pipeline(family, exclude=bool(family.non_tensor))


@pytest.mark.xfail(
    raises=LayoutError,
    strict=True,
    reason="split/assembler/replay do not store non-tensor entries yet (issue 13 item 1, the "
    "replay half): the raw MiniGrid batch is refused by name; remove this mark when they do",
)
def test_split_assemble_replay_raw_minigrid() -> None:
    family = next(f for f in ENV_ZOO if f.name == "minigrid")
    with Collector(make_vec(family), frames_per_batch=60, total_frames=60, seed=3) as c:
        (batch,) = list(c)
    split_trajectories(batch)
    ReplayBuffer(storage=LazyTensorStorage(100)).extend(batch)
