"""The data contract validator names the key, the expected and the actual dtype/shape."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from splice.layout import (
    DONE,
    MASK,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
    LayoutError,
    validate_batch,
)
from splice.testing import synthetic_rollout


def test_collector_like_batch_is_valid() -> None:
    validate_batch(synthetic_rollout(3, 20, 5.0), required=[TRAJ_IDS, DONE, REWARD])


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (DONE, torch.zeros(2, 4), r"key \('next', 'done'\): expected dtype torch.bool and shape"),
        (REWARD, torch.zeros(2, 4, 1, dtype=torch.int64), r"\('next', 'reward'\).*floating"),
        (TRAJ_IDS, torch.zeros(2, 4), r"traj_ids.*an integer dtype.*float32"),
        (MASK, torch.ones(2, 4, 1, dtype=torch.bool), r"mask.*shape \[2, 4\].*\[2, 4, 1\]"),
    ],
)
def test_wrong_dtype_or_shape(key, value, match) -> None:
    td = TensorDict({key: value}, batch_size=[2, 4])
    with pytest.raises(ValueError, match=match):
        validate_batch(td)


def test_missing_required_key() -> None:
    with pytest.raises(ValueError, match=r"missing key \('collector', 'traj_ids'\)"):
        validate_batch(TensorDict({}, [3]), required=[TRAJ_IDS])


def test_done_must_be_terminated_or_truncated() -> None:
    td = synthetic_rollout(2, 30, 4.0)
    td[TERMINATED][0, 0] = True  # an end without done
    with pytest.raises(ValueError, match="differs at 1 of 60 positions"):
        validate_batch(td)
    validate_batch(td, check_done_consistency=False)
    td[TERMINATED][0, 0] = False
    td[DONE][1, 3], td[TERMINATED][1, 3], td[TRUNCATED][1, 3] = False, False, True
    with pytest.raises(ValueError, match=r"terminated \| truncated"):
        validate_batch(td)


def test_ids_below_minus_one_break_the_contract() -> None:
    """-1 is the only padding id (issue 11, item 8): validate_batch refuses any other negative
    id, naming the key, the first bad id and its position."""
    td = TensorDict({TRAJ_IDS: torch.tensor([[0, 0, -1], [1, -7, 1]])}, [2, 3])
    with pytest.raises(
        LayoutError,
        match=r"'traj_ids'.*1 trajectory id\(s\) below -1, the first -7 at flat position 4",
    ):
        validate_batch(td)
    td[TRAJ_IDS][1, 1] = -1
    validate_batch(td)
