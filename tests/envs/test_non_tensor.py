"""Observations without a tensor form (Text, MiniGrid's MissionSpace) are carried per step as
tensordict non-tensor entries, or dropped by name with ``exclude_keys``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from splice import Collector
from splice._non_tensor import non_tensor_values, to_non_tensor
from splice.testing import CountingEnv

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


class TextEnv(CountingEnv):
    """CountingEnv with a Dict observation: the counts, and a text naming the episode and step
    (``"e<episode> t<step>"``), or a constant text with ``constant=True``."""

    def __init__(self, length: int = 3, tag: int = 0, constant: bool = False) -> None:
        super().__init__(length, tag)
        self.constant = constant
        self.episode = -1
        self.observation_space = spaces.Dict(
            counts=spaces.Box(-np.inf, np.inf, (3,), np.float32), text=spaces.Text(16)
        )

    def _obs(self) -> Any:
        text = "same" if self.constant else f"e{self.episode} t{self.t} g{self.tag}"
        return {"counts": super()._obs(), "text": text}

    def reset(self, *, seed=None, options=None):
        self.episode += 1
        return super().reset(seed=seed, options=options)


def expected_text(counts: torch.Tensor, episodes: torch.Tensor) -> list[Any]:
    """The text of every step from its counts (step, tag) and its episode number."""
    if counts.dim() == 2:
        return [
            f"e{int(e)} t{int(c[1])} g{int(c[2])}" for c, e in zip(counts, episodes, strict=True)
        ]
    return [expected_text(c, e) for c, e in zip(counts, episodes, strict=True)]


def episode_numbers(batch: TensorDictBase, first: torch.Tensor) -> torch.Tensor:
    init = batch["is_init"].squeeze(-1).long()
    return first.unsqueeze(-1) + init.cumsum(-1) - init[..., :1]


@pytest.mark.parametrize("mode", MODES)
def test_text_observations_vector(mode: AutoresetMode) -> None:
    env = SyncVectorEnv(
        [lambda i=i: TextEnv(length=2 + i, tag=i) for i in range(3)], autoreset_mode=mode
    )
    with Collector(env, frames_per_batch=30, total_frames=30, seed=0) as c:
        (batch,) = list(c)
    text = batch.get(("observation", "text"))
    assert isinstance(text, NonTensorStack) and list(text.batch_size) == [3, 10]
    episodes = episode_numbers(batch, torch.zeros(3, dtype=torch.long))
    assert text.tolist() == expected_text(batch["observation", "counts"], episodes)
    # next: the TRUE next observation's text, also at episode ends (the final one)
    done = batch["next", "done"].squeeze(-1).long()
    next_episodes = episode_numbers(batch, torch.zeros(3, dtype=torch.long)) + 0 * done
    assert batch.get(("next", "observation", "text")).tolist() == expected_text(
        batch["next", "observation", "counts"], next_episodes
    )


def test_text_observations_single_env_and_policy_input() -> None:
    seen: list[str] = []

    def policy(td: TensorDictBase) -> TensorDictBase:
        seen.append(td["observation", "text"])
        td["action"] = torch.tensor(1)
        return td

    with Collector(TextEnv(), policy, frames_per_batch=7, total_frames=7) as c:
        (batch,) = list(c)
    text = batch.get(("observation", "text")).tolist()
    assert text == expected_text(
        batch["observation", "counts"], episode_numbers(batch, torch.tensor(0))
    )
    assert seen == text  # the policy saw each step's text


def test_constant_text_is_one_entry() -> None:
    env = SyncVectorEnv([lambda: TextEnv(constant=True)] * 2)
    with Collector(env, frames_per_batch=20, total_frames=20) as c:
        (batch,) = list(c)
    text = batch.get(("observation", "text"))
    assert isinstance(text, NonTensorData) and text.tolist() == [["same"] * 10] * 2
    assert batch[0, 3]["observation", "text"] == "same"


def test_exclude_keys_drops_text() -> None:
    with Collector(
        TextEnv(), frames_per_batch=6, total_frames=6, exclude_keys=[("observation", "text")]
    ) as c:
        (batch,) = list(c)
    assert ("observation", "text") not in batch.keys(True)
    assert batch["observation", "counts"].shape == (6, 3)
    with pytest.raises(ValueError, match=r"exclude_keys entry \('observation', 'nope'\) matches"):
        Collector(TextEnv(), frames_per_batch=6, exclude_keys=[("observation", "nope")])
    with pytest.raises(ValueError, match="not an observation key"):
        Collector(TextEnv(), frames_per_batch=6, exclude_keys=["text"])
    with pytest.raises(ValueError, match="excludes every observation key"):
        Collector(TextEnv(), frames_per_batch=6, exclude_keys=["observation"])


def test_split_trajs_with_text_says_what_to_do() -> None:
    with pytest.raises(
        ValueError, match=r"split_trajs cannot carry.*exclude_keys=\[\('observation', 'text'\)\]"
    ):
        Collector(TextEnv(), frames_per_batch=6, split_trajs=True)


def test_minigrid_raw_collects() -> None:
    minigrid = pytest.importorskip("minigrid")  # noqa: F841 (registers the envs)
    with Collector("MiniGrid-MemoryS7-v0", frames_per_batch=20, total_frames=20, seed=0) as c:
        (batch,) = list(c)
    mission = batch.get(("observation", "mission")).tolist()
    assert mission == ["go to the matching object at the end of the hallway"] * 20
    assert batch["observation", "image"].shape == (20, 7, 7, 3)
    env = gym.make("MiniGrid-MemoryS7-v0")
    obs, _ = env.reset(seed=0)
    assert np.array_equal(batch["observation", "image"][0].numpy(), obs["image"])


@given(rows=st.integers(1, 3), data=st.data())
@settings(max_examples=60, deadline=None)
def test_non_tensor_round_trip(rows: int, data: Any) -> None:
    width = data.draw(st.integers(1, 5))
    flat = data.draw(st.lists(st.sampled_from(["a", "b", ""]), min_size=rows * width,
                              max_size=rows * width))  # fmt: skip
    arr = np.empty((rows, width), dtype=object)
    arr[...] = np.array(flat, dtype=object).reshape(rows, width)
    for values_ in (arr, arr[0]):
        entry = to_non_tensor(values_)
        assert list(entry.batch_size) == list(values_.shape)
        assert np.array_equal(non_tensor_values(entry), values_)
        assert entry.tolist() == values_.tolist()
