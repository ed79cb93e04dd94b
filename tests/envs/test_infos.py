"""``Collector(info_keys=...)``: info entries at the right step, in every env kind and autoreset
mode, visible to the policy; clear errors for missing, ragged and colliding keys."""

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
from tensordict import TensorDictBase

from splice import Collector
from splice.envs import EPISODE_STATISTICS, EnvError
from splice.testing import CountingEnv, counting_vec, threshold_policy

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
LENGTHS = [2, 3, 5]


def check_counting_infos(batch: TensorDictBase) -> None:
    """CountingEnv's infos repeat its counts: the entering info (root) matches the observation
    entering the step, the step's info (``next``) matches the TRUE next observation."""
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert torch.equal(batch["total"].float(), obs[..., 0])
    assert torch.equal(batch["t"].float(), obs[..., 1])
    assert torch.equal(batch["next", "total"].float(), nxt[..., 0])
    assert torch.equal(batch["next", "t"].float(), nxt[..., 1])
    init = batch["is_init"].squeeze(-1)
    assert bool((batch["t"][init] == 0).all())  # the reset info at episode starts
    done = batch["next", "done"].squeeze(-1)
    assert bool((batch["next", "t"][done] > 0).all())  # the final step's info, not a reset's


def collect(env: Any, policy: Any = threshold_policy, **kw: Any) -> list[TensorDictBase]:
    kw.setdefault("frames_per_batch", 30)
    kw.setdefault("total_frames", 90)
    with Collector(env, policy, seed=0, worker_id=kw.pop("worker_id", 70), **kw) as c:
        return list(c)


def test_single_env_infos() -> None:
    batches = collect(CountingEnv(4), info_keys=["total", "t"])
    for batch in batches:
        check_counting_infos(batch)
        assert batch["t"].dtype == torch.int64 and batch["t"].shape == (30,)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", [{}, {"max_frames_per_traj": 4}])
def test_vector_infos_every_autoreset_mode(mode: AutoresetMode, extra: dict[str, Any]) -> None:
    batches = collect(counting_vec(LENGTHS, mode), info_keys=["total", "t"], **extra)
    for batch in batches:
        check_counting_infos(batch)
    if mode != AutoresetMode.NEXT_STEP:  # the three modes give the same data
        ref = collect(counting_vec(LENGTHS), info_keys=["total", "t"], **extra)
        for a, b in zip(ref, batches, strict=True):
            assert (a == b).all()


def test_policy_sees_the_entering_info() -> None:
    seen: list[torch.Tensor] = []

    def policy(td: TensorDictBase) -> TensorDictBase:
        seen.append(td["t"].clone())
        assert torch.equal(td["t"].float(), td["observation"][..., 1])
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        return td

    with Collector(
        counting_vec(LENGTHS), policy, frames_per_batch=30, total_frames=30, info_keys=["t"]
    ) as c:
        (_batch,) = list(c)
    assert len(seen) > 10  # called every step (plus the first, discovery call)


def test_taxi_action_mask_reaches_the_policy() -> None:
    """A masked policy acts on Taxi's ``action_mask`` (only allowed actions are taken), and the
    mask stored for each step is the one of the state the agent acted in."""

    def masked_first_allowed(td: TensorDictBase) -> TensorDictBase:
        mask = td["action_mask"].bool()
        scores = torch.rand(mask.shape).masked_fill(~mask, -1.0)
        td["action"] = scores.argmax(-1)
        return td

    env = gym.make_vec("Taxi-v4", num_envs=3, vectorization_mode="sync")
    with Collector(
        env,
        masked_first_allowed,
        frames_per_batch=300,
        total_frames=300,
        info_keys=["action_mask"],
        seed=0,
    ) as c:
        (batch,) = list(c)
    mask, action = batch["action_mask"], batch["action"]
    assert mask.dtype == torch.int8 and mask.shape == (3, 100, 6)
    assert bool(mask.gather(-1, action.unsqueeze(-1)).all())  # every action was allowed
    taxi = gym.make("Taxi-v4").unwrapped
    expected = np.stack([taxi.action_mask(int(s)) for s in batch["observation"].reshape(-1)])
    assert np.array_equal(mask.reshape(-1, 6).numpy(), expected)
    nexp = np.stack([taxi.action_mask(int(s)) for s in batch["next", "observation"].reshape(-1)])
    assert np.array_equal(batch["next", "action_mask"].reshape(-1, 6).numpy(), nexp)


@pytest.mark.parametrize("mode", MODES)
def test_record_episode_statistics_vector(mode: AutoresetMode) -> None:
    env = gym.make_vec(
        "CartPole-v1",
        num_envs=3,
        vectorization_mode="sync",
        wrappers=[gym.wrappers.RecordEpisodeStatistics],
        vector_kwargs={"autoreset_mode": mode},
    )
    (batch,) = collect(
        env, frames_per_batch=600, total_frames=600, info_keys={"episode": EPISODE_STATISTICS}
    )
    check_episode_statistics(batch)


def test_record_episode_statistics_single_env() -> None:
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    (batch,) = collect(
        env, frames_per_batch=300, total_frames=300, info_keys={"episode": EPISODE_STATISTICS}
    )
    check_episode_statistics(batch.unsqueeze(0))


def test_record_episode_statistics_vector_wrapper() -> None:
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point")
    )
    (batch,) = collect(
        env, frames_per_batch=400, total_frames=400, info_keys={"episode": EPISODE_STATISTICS}
    )
    check_episode_statistics(batch)


def check_episode_statistics(batch: TensorDictBase) -> None:
    """``("next", "episode", "r")`` at every episode end is that episode's return (and ``l``
    its length); zero on the other steps."""
    done = batch["next", "done"].squeeze(-1)
    init = batch["is_init"].squeeze(-1)
    ret, length = batch["next", "episode", "r"], batch["next", "episode", "l"]
    assert int(done.sum()) >= 3
    assert bool((ret[~done] == 0).all()) and bool((length[~done] == 0).all())
    for row in range(batch.shape[0]):
        starts = torch.nonzero(init[row]).squeeze(-1).tolist()
        for end in torch.nonzero(done[row]).squeeze(-1).tolist():
            start = max(s for s in [*starts, -1] if s <= end)
            if start < 0:
                continue  # the episode began before this batch
            reward = batch["next", "reward"][row, start : end + 1].sum().item()
            assert ret[row, end].item() == pytest.approx(reward)
            assert length[row, end].item() == end - start + 1


def test_envpool_like_infos_without_masks() -> None:
    """envpool's infos are plain ``[B]`` arrays (no ``_key`` masks)."""

    class Envpool(gym.vector.VectorEnv):
        metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}  # noqa: RUF012

        def __init__(self) -> None:
            self.num_envs = 2
            self.single_observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
            self.single_action_space = spaces.Discrete(2)
            self.observation_space = self.single_observation_space
            self.action_space = self.single_action_space
            self.t = np.zeros(2, np.int32)

        def info(self) -> dict[str, Any]:
            return {"env_id": np.arange(2, dtype=np.int32), "elapsed_step": self.t.copy()}

        def reset(self, *, seed=None, options=None):
            self.t[:] = 0
            return self.t[:, None].astype(np.float32), self.info()

        def step(self, actions):
            self.t += 1
            return (
                self.t[:, None].astype(np.float32),
                np.ones(2),
                self.t > 10,
                self.t < 0,
                self.info(),
            )

    (batch,) = collect(
        Envpool(), None, frames_per_batch=10, total_frames=10, info_keys=["elapsed_step", "env_id"]
    )
    assert torch.equal(batch["env_id"], torch.tensor([[0] * 5, [1] * 5], dtype=torch.int32))
    assert torch.equal(batch["next", "elapsed_step"].float(), batch["next", "observation"][..., 0])


class InfoEnv(CountingEnv):
    """CountingEnv whose infos come from ``make_info(t)``."""

    def __init__(self, make_info: Any, length: int = 3) -> None:
        super().__init__(length)
        self.make_info = make_info

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, self.make_info(self.t)

    def step(self, action):
        obs, reward, term, trunc, _ = super().step(action)
        return obs, reward, term, trunc, self.make_info(self.t)


def test_missing_required_key_at_reset_names_it() -> None:
    c = Collector(CountingEnv(), frames_per_batch=4, info_keys=["lives"])
    with pytest.raises(EnvError, match=r"info key 'lives' is not in the env's reset info.*'t'"):
        next(iter(c))


def test_missing_required_key_later_names_it() -> None:
    env = InfoEnv(lambda t: {"x": 1} if t < 2 else {})
    with pytest.raises(EnvError, match=r"info key 'x' is missing from the info of step\(\)"):
        next(iter(Collector(env, frames_per_batch=6, info_keys=["x"])))


def test_missing_for_some_envs_of_a_vector_env_names_the_rows() -> None:
    env = SyncVectorEnv([lambda: InfoEnv(lambda t: {"x": 1}), lambda: InfoEnv(lambda t: {})])
    with pytest.raises(EnvError, match=r"'x' is missing from the info of reset\(\)"):
        next(iter(Collector(env, frames_per_batch=6, info_keys=["x"])))
    env = SyncVectorEnv(
        [lambda: InfoEnv(lambda t: {"x": 1}), lambda: InfoEnv(lambda t: {"x": 1} if t < 2 else {})]
    )
    with pytest.raises(
        EnvError, match=r"'x' is missing from the info of step\(\) \(env rows \[1\]\)"
    ):
        next(iter(Collector(env, frames_per_batch=6, info_keys=["x"])))


def test_ragged_entries_name_the_key() -> None:
    env = InfoEnv(lambda t: {"v": np.zeros(2 if t < 2 else 3)})
    with pytest.raises(EnvError, match=r"info key 'v' has shape \[3\].*expected \[2\]"):
        list(Collector(env, frames_per_batch=2, total_frames=8, info_keys=["v"]))
    env = SyncVectorEnv([lambda: InfoEnv(lambda t: {"v": np.zeros(t + 1)})] * 2)
    with pytest.raises(EnvError, match="info key 'v'"):
        list(Collector(env, frames_per_batch=4, total_frames=8, info_keys=["v"]))


def test_optional_key_is_zero_where_absent() -> None:
    env = InfoEnv(lambda t: {"bonus": np.float32(t)} if t == 2 else {})
    (batch,) = collect(
        env,
        frames_per_batch=9,
        total_frames=9,
        info_keys={"bonus": spaces.Box(-np.inf, np.inf, (), np.float32)},
    )
    t_next = batch["next", "observation"][:, 1]
    assert torch.equal(batch["next", "bonus"], torch.where(t_next == 2, 2.0, 0.0))
    assert bool((batch["bonus"] == torch.where(batch["observation"][:, 1] == 2, 2.0, 0.0)).all())


def test_nested_info_keys() -> None:
    env = InfoEnv(lambda t: {"stats": {"t2": 2 * t, "other": "x"}})
    (batch,) = collect(env, frames_per_batch=6, total_frames=6, info_keys=[("stats", "t2")])
    assert torch.equal(batch["next", "stats", "t2"].float(), 2 * batch["next", "observation"][:, 1])


def test_text_info_entries_are_non_tensor() -> None:
    env = InfoEnv(lambda t: {"msg": f"t={t}"})
    (batch,) = collect(env, frames_per_batch=6, total_frames=6, info_keys=["msg"])
    t = batch["observation"][:, 1].long().tolist()
    assert batch.get("msg").tolist() == [f"t={i}" for i in t]


@pytest.mark.parametrize(
    ("info_keys", "error", "match"),
    [
        (["next"], ValueError, "collides with the batch's own key 'next'"),
        ([("observation", "x")], ValueError, "collides"),
        ([3], TypeError, "info_keys entries must be str"),
        ("lives", TypeError, "info_keys must be a list"),
        (["a", "a"], ValueError, "repeats"),
        ({"a": "Box"}, TypeError, "must be a gymnasium space"),
        ({"a": spaces.Text(3)}, TypeError, "declare Box"),
    ],
)
def test_bad_info_keys_are_refused_up_front(info_keys: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Collector(CountingEnv(), frames_per_batch=4, info_keys=info_keys)


@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    mode=st.sampled_from(MODES),
    limit=st.one_of(st.none(), st.integers(1, 5)),
    steps=st.integers(1, 7),
)
@settings(max_examples=25, deadline=None)
def test_infos_line_up_with_observations(
    lengths: list[int], mode: AutoresetMode, limit: int | None, steps: int
) -> None:
    """Whatever the episode lengths, autoreset mode, time limit and batch size, every step's
    entering info matches its observation and its next info the true next observation."""
    n = len(lengths)
    batches = collect(
        counting_vec(lengths, mode),
        frames_per_batch=n * steps,
        total_frames=3 * n * steps,
        info_keys=["total", "t"],
        max_frames_per_traj=limit,
    )
    for batch in batches:
        check_counting_infos(batch)


@given(
    a=st.booleans(),
    ep=st.one_of(st.none(), st.sets(st.sampled_from(["r", "l"]))),
    s=st.one_of(st.none(), st.booleans()),
    check=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_reader_fast_path_matches_the_rule(
    a: bool, ep: set[str] | None, s: bool | None, check: bool
) -> None:
    """One env, required and optional entries, top level and nested, each present or absent:
    the values read are the entries themselves, zero for an absent optional one, and a missing
    required one is an error naming it (the step path reads entries grouped by parent dict)."""
    from splice.envs.infos import InfoReader, parse_info_keys

    keys = {
        "a": None,
        "ep": spaces.Dict(
            r=spaces.Box(-np.inf, np.inf, (), np.float64), l=spaces.Box(0, 9, (), np.int64)
        ),
        ("s", "x"): None,
    }
    reader = InfoReader(parse_info_keys(keys), num_envs=1, batched=False)
    reader.discover({"a": np.ones(2, np.float32), "s": {"x": 3}})
    info: dict[str, Any] = {}
    if a:
        info["a"] = np.full(2, 5.0, np.float32)
    if ep is not None:
        info["ep"] = {k: {"r": 1.5, "l": 4}[k] for k in ep}
    if s is not None:
        info["s"] = {"x": 7} if s else {}
    step = reader.read_step(info)
    if not a or not s:
        with pytest.raises(EnvError, match=r"info key ('a'|\('s', 'x'\)) is missing"):
            reader.read(info, "step()", check)
        assert step is None
        return
    values = reader.read(info, "step()", check)
    present = {"a": [5.0, 5.0], "l": 4, "r": 1.5, "x": 7}
    expected = [
        present[leaf.key[-1]] if leaf.key[0] != "ep" or leaf.key[-1] in (ep or ()) else 0
        for leaf in reader.leaves
    ]
    assert [leaf.key[-1] for leaf in reader.leaves] in (["a", "l", "r", "x"], ["a", "r", "l", "x"])
    assert [np.asarray(v).tolist() for v in values] == expected
    if ep is None or ep == {"r", "l"}:  # the parent dict absent, or every entry in it
        assert step is not None
    if step is not None:
        assert [np.asarray(v).tolist() for v in step] == [np.asarray(v).tolist() for v in values]
