"""TorchRL's ``test/test_postprocs.py`` (pytorch/rl at 6e18e35b2, the 0.14.0 release), ported.

Ported: ``TestSplits`` (``split_trajectories``), imports changed. Not ported (TorchRL-only,
see ``inventory.py``): ``TestMultiStep`` and ``TestDensifyReward`` (TorchRL's ``MultiStep`` and
``DensifyReward`` post-processing transforms; splice has no post-processing layer).
"""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

from splice import split_trajectories

from .differences import PADDING_ID


def _ends_with(key, match):  # torchrl._utils._ends_with
    return key == match if isinstance(key, str) else key[-1] == match


class TestSplits:
    """Tests the splitting of collected tensordicts in trajectories."""

    @staticmethod
    def create_fake_trajs(num_workers=32, traj_len=200):
        # Port: the fixture is built once per size (a Python loop over steps) and copied.
        return TestSplits._fake_trajs(num_workers, traj_len).clone()

    @staticmethod
    @functools.cache
    def _fake_trajs(
        num_workers=32,
        traj_len=200,
    ):
        traj_ids = torch.arange(num_workers)
        step_count = torch.zeros(num_workers)
        workers = torch.arange(num_workers)

        out = []
        done0 = torch.zeros(num_workers, 1, dtype=torch.bool)
        for _ in range(traj_len):
            done = step_count == traj_ids  # traj_id 0 has 0 steps, 1 has 1 step etc.
            done = done.unsqueeze(-1)
            td = TensorDict(
                source={
                    ("collector", "traj_ids"): traj_ids,
                    "a": traj_ids.clone().unsqueeze(-1),
                    "step_count": step_count,
                    "workers": workers,
                    "done": done0,
                    ("next", "done"): done,
                },
                batch_size=[num_workers],
            )
            done0 = done
            out.append(td.clone())
            step_count += 1

            traj_ids[done.squeeze(-1)] = traj_ids.max() + torch.arange(1, done.sum() + 1)
            step_count[done.squeeze(-1)] = 0

        out = torch.stack(out, 1).contiguous()
        return out

    @pytest.mark.parametrize("num_workers", range(3, 34, 3))
    @pytest.mark.parametrize("traj_len", [10, 17, 50, 97])
    @pytest.mark.parametrize(
        "constr",
        [
            functools.partial(split_trajectories, prefix="collector"),
            functools.partial(split_trajectories),
            functools.partial(split_trajectories, trajectory_key=("collector", "traj_ids")),
        ],
    )
    @pytest.mark.torchrl_difference(PADDING_ID)
    def test_splits(self, num_workers, traj_len, constr):

        trajs = TestSplits.create_fake_trajs(num_workers, traj_len)
        assert trajs.shape[0] == num_workers
        assert trajs.shape[1] == traj_len
        split_trajs = constr(trajs)
        assert split_trajs.shape[0] == split_trajs.get(("collector", "traj_ids")).max() + 1
        assert split_trajs.shape[1] == split_trajs.get("step_count").max() + 1

        assert split_trajs.get(("collector", "mask")).sum() == num_workers * traj_len

        assert split_trajs.get(("next", "done")).sum(1).max() == 1
        out_mask = split_trajs[split_trajs.get(("collector", "mask"))]
        for i in range(split_trajs.shape[0]):
            traj_id_split = split_trajs[i].get(("collector", "traj_ids"))[
                split_trajs[i].get(("collector", "mask"))
            ]
            assert 1 == len(traj_id_split.unique())

        for w in range(num_workers):
            assert (out_mask.get("workers") == w).sum() == traj_len
        # Assert that either the chain is not done XOR if it is it must have the desired length (equal to traj id by design)
        for i in range(split_trajs.get(("collector", "traj_ids")).max()):
            idx_traj_id = out_mask.get(("collector", "traj_ids")) == i
            # (!=) == (xor)
            c1 = (idx_traj_id.sum() - 1 == i) and (
                out_mask.get(("next", "done"))[idx_traj_id].sum() == 1
            )  # option 1: trajectory is complete
            c2 = out_mask.get(("next", "done"))[idx_traj_id].sum() == 0
            assert c1 != c2, (
                f"traj_len={traj_len}, "
                f"num_workers={num_workers}, "
                f"traj_id={i}, "
                f"idx_traj_id.sum()={idx_traj_id.sum()}, "
                f"done={out_mask.get('done')[idx_traj_id].sum()}"
            )

        assert (
            split_trajs.get(("collector", "traj_ids")).unique().numel()
            == split_trajs.get(("collector", "traj_ids")).max() + 1
        )

    @pytest.mark.parametrize("num_workers", range(3, 34, 3))
    @pytest.mark.parametrize("traj_len", [10, 17, 50, 97])
    @pytest.mark.parametrize(
        "constr",
        [
            functools.partial(split_trajectories, prefix="collector", as_nested=True),
            functools.partial(split_trajectories, as_nested=True),
            functools.partial(
                split_trajectories,
                trajectory_key=("collector", "traj_ids"),
                as_nested=True,
            ),
        ],
    )
    def test_split_traj_nested(self, num_workers, traj_len, constr):
        trajs = TestSplits.create_fake_trajs(num_workers, traj_len)
        assert trajs.shape[0] == num_workers
        assert trajs.shape[1] == traj_len
        split_trajs = constr(trajs)
        assert split_trajs.shape[-1] == -1
        assert split_trajs["next", "done"].is_nested

    @pytest.mark.parametrize("num_workers", range(3, 34, 3))
    @pytest.mark.parametrize("traj_len", [10, 17, 50, 97])
    @pytest.mark.parametrize(
        "constr0,constr1",
        [
            [
                functools.partial(split_trajectories, prefix="collector", as_nested=True),
                functools.partial(split_trajectories, prefix="collector", as_nested=False),
            ],
            [
                functools.partial(split_trajectories, as_nested=True),
                functools.partial(split_trajectories, as_nested=False),
            ],
            [
                functools.partial(
                    split_trajectories,
                    trajectory_key=("collector", "traj_ids"),
                    as_nested=True,
                ),
                functools.partial(
                    split_trajectories,
                    trajectory_key=("collector", "traj_ids"),
                    as_nested=False,
                ),
            ],
        ],
    )
    @pytest.mark.torchrl_difference(PADDING_ID)
    def test_split_traj_nested_equiv(self, num_workers, traj_len, constr0, constr1):
        trajs = TestSplits.create_fake_trajs(num_workers, traj_len)
        assert trajs.shape[0] == num_workers
        assert trajs.shape[1] == traj_len
        split_trajs1 = constr1(trajs)
        mask_key = None
        for key in split_trajs1.keys(True, True):
            if _ends_with(key, "mask"):
                mask_key = key
                break
        split_trajs0 = constr0(trajs).to_padded_tensor(mask_key=mask_key)
        assert (split_trajs0 == split_trajs1).all()
