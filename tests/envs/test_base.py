"""The adapters' shared staging writes: a scalar written through :func:`item_writer` (with
:func:`write_item`'s fallback to numpy's assignment) stores exactly what numpy's assignment
stores, and fails where numpy's fails; a single env's step writes the same data either way."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from splice import Collector
from splice.envs.base import item_writer, write_item
from splice.testing import CountingEnv

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64,
          np.float64, np.float32]  # fmt: skip

VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(
        [
            np.int64(-3),
            np.uint64(2**63 + 5),
            np.float32(0.1),
            np.bool_(True),
            np.float64(2.5e300),
            np.int8(-128),
            np.array(7),
            np.array([1.5]),
            np.array([1, 2]),
            None,
            "3",
            1 + 2j,
        ]
    ),
)


def write(target: Any, fallback: np.ndarray, value: Any) -> None:
    """What the loop and the adapters do (:func:`write_item`): the writer first, numpy's
    assignment if it refuses."""
    write_item(target, fallback, 1, value)


@given(dtype=st.sampled_from(DTYPES), value=VALUES)
@settings(max_examples=400, deadline=None)
def test_item_writer_stores_what_numpy_stores(dtype: Any, value: Any) -> None:
    staged = np.zeros((3, 1), dtype)[:, 0]  # a single env's [C] view of [C, 1] staging
    reference = staged.copy()
    try:
        with np.errstate(all="ignore"):
            reference[1] = value
    except Exception as e:  # numpy refuses the value: so does the writer's fallback
        with pytest.raises(type(e)), np.errstate(all="ignore"):
            write(item_writer(staged), staged, value)
        return
    with np.errstate(all="ignore"):
        write(item_writer(staged), staged, value)
    assert staged.tobytes() == reference.tobytes()


def test_item_writer_views_only_exact_scalar_columns() -> None:
    assert isinstance(item_writer(np.zeros(4, np.int64)), memoryview)
    assert isinstance(item_writer(np.zeros(4, np.bool_)), memoryview)
    for column in (np.zeros(4, np.float32), np.zeros((4, 2), np.int64), np.zeros(8)[::2],
                   np.empty(4, object)):  # fmt: skip
        assert item_writer(column) is column


class OddValuesEnv(CountingEnv):
    """CountingEnv whose Discrete observation arrives as a float, then as np.int64, and whose
    ``lives`` info entry switches from a Python int to a float: values a memoryview refuses
    mid-batch, which numpy casts."""

    def __init__(self) -> None:
        super().__init__(length=4)
        self.observation_space = spaces.Discrete(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.int64(self.total % 100), {"lives": 3}

    def step(self, action):
        _, reward, term, trunc, _ = super().step(action)
        obs = float(self.total % 100) if self.total % 3 else np.int64(self.total % 100)
        return obs, reward, term, trunc, {"lives": 3 if self.total < 5 else 2.0}


def test_values_a_memoryview_refuses_are_cast_as_numpy_casts() -> None:
    (batch,) = list(Collector(OddValuesEnv(), frames_per_batch=12, total_frames=12,
                              info_keys=["lives"]))  # fmt: skip
    total = torch.arange(1, 13)
    assert batch["next", "observation"].dtype == torch.int64
    assert torch.equal(batch["next", "observation"], total % 100)
    assert torch.equal(batch["next", "lives"], torch.where(total < 5, 3, 2))
    assert torch.equal(batch["observation"][1:], batch["next", "observation"][:-1])


def test_a_bad_info_value_between_checked_steps_names_the_key() -> None:
    """A single env's one required entry is read without checks after a batch's first step:
    a value of the wrong shape there is still an error naming the key."""

    class Ragged(CountingEnv):
        def reset(self, *, seed=None, options=None):
            obs, _ = super().reset(seed=seed)
            return obs, {"v": np.zeros(2)}

        def step(self, action):
            obs, reward, term, trunc, _ = super().step(action)
            return obs, reward, term, trunc, {"v": np.zeros(2 if self.total < 3 else 3)}

    from splice.envs.errors import EnvError

    with pytest.raises(EnvError, match=r"info key 'v' has shape \[3\].*expected \[2\]"):
        list(Collector(Ragged(length=50), frames_per_batch=8, total_frames=8, info_keys=["v"]))


def test_taxi_one_env_same_data_as_a_hand_run() -> None:
    """Taxi with its action_mask (the one-lookup info read, memoryview writes) against the same
    env stepped by hand with the collector's actions."""
    (batch,) = list(Collector(gym.make("Taxi-v4"), frames_per_batch=300, total_frames=300,
                              seed=3, info_keys=["action_mask"]))  # fmt: skip
    env = gym.make("Taxi-v4")
    obs, info = env.reset(seed=3)
    for t in range(300):
        assert batch["observation"][t].item() == obs
        assert np.array_equal(batch["action_mask"][t].numpy(), info["action_mask"])
        obs, reward, term, trunc, info = env.step(batch["action"][t].item())
        assert batch["next", "observation"][t].item() == obs
        assert np.array_equal(batch["next", "action_mask"][t].numpy(), info["action_mask"])
        assert batch["next", "reward"][t].item() == reward
        assert bool(batch["next", "terminated"][t]) == term
        assert bool(batch["next", "truncated"][t]) == trunc
        if term or trunc:
            obs, info = env.reset()
