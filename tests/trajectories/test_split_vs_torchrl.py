"""Agreement with TorchRL 0.14.1's split_trajectories wherever TorchRL is correct.

TorchRL is installed by the test command (the ``bench`` extra), so this runs in CI; it is
skipped only where torchrl is genuinely absent.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import split_trajectories
from splice.layout import MASK, TRAJ_IDS
from splice.testing import synthetic_rollout

torchrl_utils = pytest.importorskip("torchrl.collectors.utils")


def torchrl_split(td: TensorDict, **kwargs) -> TensorDict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchrl_utils.split_trajectories(td, **kwargs)


def assert_same_as_torchrl(ours: TensorDict, theirs: TensorDict, ids_key=TRAJ_IDS) -> None:
    """Equal everywhere, except that our padded ids are -1 where TorchRL writes 0."""
    assert ours.batch_size == theirs.batch_size
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    mask = ours[(*ids_key[:-1], "mask")] if isinstance(ids_key, tuple) else ours["mask"]
    for key in theirs.keys(True, True):
        a, b = ours[key], theirs[key]
        assert a.dtype == b.dtype, key
        if key == ids_key:
            assert (a[~mask] == -1).all()
            a = torch.where(mask, a, torch.zeros_like(a))
        assert torch.equal(a, b), key


@settings(max_examples=40, deadline=None)
@given(
    n_env=st.integers(1, 6),
    n_steps=st.integers(2, 60),
    mean_len=st.floats(1.0, 30.0),
    seed=st.integers(0, 10_000),
)
def test_matches_torchrl_on_collector_batches(n_env, n_steps, mean_len, seed) -> None:
    batch = synthetic_rollout(n_env, n_steps, mean_len, seed=seed)
    # TorchRL returns its input unchanged (plus a mask) when every row is one trajectory;
    # compare only where it actually splits.
    if batch[TRAJ_IDS].unique().numel() == n_env and n_env > 1:
        return
    assert_same_as_torchrl(split_trajectories(batch), torchrl_split(batch))


@pytest.mark.parametrize("prefix_variant", ["prefix", "default", "trajectory_key"])
@pytest.mark.parametrize(("n_workers", "traj_len"), [(3, 10), (6, 17), (9, 50)])
def test_torchrl_fake_trajs_fixture(prefix_variant, n_workers, traj_len) -> None:
    """TorchRL's own test_splits fixture: trajectory k lasts k + 1 steps."""
    td = fake_trajs(n_workers, traj_len)
    kwargs = {
        "prefix": {"prefix": "collector"},
        "default": {},
        "trajectory_key": {"trajectory_key": TRAJ_IDS},
    }[prefix_variant]
    ours, theirs = split_trajectories(td, **kwargs), torchrl_split(td, **kwargs)
    assert_same_as_torchrl(ours, theirs)
    assert ours.shape[0] == int(td[TRAJ_IDS].max()) + 1
    assert int(ours[MASK].sum()) == n_workers * traj_len
    assert (ours[("next", "done")].sum(1) <= 1).all()


def test_nested_matches_torchrl_values() -> None:
    batch = synthetic_rollout(4, 50, 8.0, seed=5)
    ours = split_trajectories(batch, as_nested=True)
    theirs = torchrl_split(batch, as_nested=True)
    assert ours.batch_size == theirs.batch_size
    for key in theirs.keys(True, True):
        for a, b in zip(ours[key].unbind(0), theirs[key].unbind(0), strict=True):
            assert torch.equal(a, b), key
    # ... and unlike TorchRL we always return the mask.
    assert MASK in ours.keys(True) and MASK not in theirs.keys(True)


def test_ids_from_done_match_torchrl() -> None:
    batch = synthetic_rollout(5, 40, 6.0, seed=7).exclude(TRAJ_IDS)
    assert_same_as_torchrl(split_trajectories(batch), torchrl_split(batch))


def test_torchrl_crashes_where_we_group_non_adjacent_ids() -> None:
    td = TensorDict({TRAJ_IDS: torch.tensor([0, 0, 1, 1, 0, 0])}, [6])
    with pytest.raises(RuntimeError, match="split_with_sizes"):
        torchrl_split(td)
    assert split_trajectories(td).batch_size == torch.Size([2, 4])


def fake_trajs(n_workers: int, traj_len: int) -> TensorDict:
    """Mirror of TorchRL's ``create_fake_trajs``: ids count up; trajectory k lasts k + 1 steps."""
    traj_ids = torch.arange(n_workers)
    step_count = torch.zeros(n_workers, dtype=torch.int64)
    done = torch.zeros(n_workers, dtype=torch.bool)
    ids, steps, dones = [], [], []
    for _ in range(traj_len):
        done = step_count == traj_ids
        ids.append(traj_ids.clone())
        steps.append(step_count.clone())
        dones.append(done.clone())
        n_new = int(done.sum())
        step_count = torch.where(done, 0, step_count + 1)
        traj_ids = traj_ids.clone()
        traj_ids[done] = traj_ids.max() + 1 + torch.arange(n_new)
    return TensorDict(
        {
            TRAJ_IDS: torch.stack(ids, 1),
            "step_count": torch.stack(steps, 1),
            "workers": torch.arange(n_workers)[:, None].expand(n_workers, traj_len).clone(),
            ("next", "done"): torch.stack(dones, 1).unsqueeze(-1),
        },
        batch_size=[n_workers, traj_len],
    )
