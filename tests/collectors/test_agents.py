"""PettingZoo envs through the collectors (rows are agent slots, splice.envs.pettingzoo):
against a ground-truth per-agent loop (splice.testing_agents), every agent transition exactly
once, in order, under its agent and trajectory id, with the env's end flags, for random
join/leave schedules, both APIs, in this process, worker processes and Ray; and what comes
downstream: whole episodes, splitting, replay slices, value targets, recurrent state."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splice import (
    Collector,
    LazyTensorStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
    SliceSampler,
    split_trajectories,
    targets,
)
from splice.envs.pettingzoo import PettingZooEnvs
from splice.layout import (
    DONE,
    IS_INIT,
    MASK,
    NEXT,
    NEXT_OBSERVATION,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
)
from splice.testing_agents import (
    ScheduledAECEnv,
    ScheduledParallelEnv,
    assert_agent_streams,
    collected_transitions,
)

pytestmark = pytest.mark.timeout(240)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

APIS = {"parallel": ScheduledParallelEnv, "aec": ScheduledAECEnv}


def count_policy(td):
    """The TensorDict form of splice.testing_agents.count_policy (what ground_truth runs)."""
    obs = td["observation"]
    td["action"] = ((obs[..., 2] + obs[..., 1]) % 3).long()
    return td


@st.composite
def schedules(draw, names: list[str], length: int) -> dict[str, list]:
    """Lives for each agent: up to two per episode, a gap of at least one step between two
    lives of one agent (PettingZoo cannot end an agent and bring it back in one step);
    the first agent is there from the start (an env needs an agent after reset)."""
    schedule = {}
    for i, name in enumerate(names):
        lives, t = [], 0
        for k in range(draw(st.integers(1 if i == 0 else 0, 2))):
            if t >= length:
                break
            start = 0 if (i == 0 and k == 0) else draw(st.integers(t, length - 1))
            stop = draw(st.one_of(st.none(), st.integers(start + 1, length)))
            lives.append((start, stop, draw(st.sampled_from(["term", "trunc"]))))
            if stop is None:
                break
            t = stop + 1
        schedule[name] = lives
    return schedule


@st.composite
def setups(draw):
    n_agents = draw(st.integers(1, 4))
    names = [f"{('red', 'blue')[i % 2]}_{i}" for i in range(n_agents)]
    length = draw(st.integers(1, 6))
    copies = [draw(schedules(names, length)) for _ in range(draw(st.integers(1, 3)))]
    return copies, length, draw(st.integers(1, 7)), draw(st.integers(1, 4))


def factory(api: str, copies: list, length: int):
    kind = APIS[api]
    return lambda: [kind(schedule, length, tag=i) for i, schedule in enumerate(copies)]


@pytest.mark.parametrize("api", list(APIS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups())
def test_every_agent_transition_once_in_order_with_its_id_and_flags(api, setup):
    copies, length, steps, n_batches = setup
    make = factory(api, copies, length)
    envs = make()
    slots = len(envs) * len(envs[0].possible_agents)
    frames = slots * steps
    with Collector(
        envs, count_policy, frames_per_batch=frames, total_frames=frames * n_batches
    ) as c:
        batches = list(c)
    assert all(batch.batch_size == (slots, steps) for batch in batches)
    assert assert_agent_streams(batches, make) == frames * n_batches


@pytest.mark.parametrize("api", list(APIS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), fmt=st.sampled_from(["padded", "cat"]))
def test_whole_agent_episodes_each_step_once(api, setup, fmt):
    """``trajs_per_batch``: whole agent lives (AEC: assembled from the batches, as an agent's
    life has other agents' turns inside), every step once across the emitted episodes."""
    copies, length, steps, n_batches = setup
    make = factory(api, copies, length)
    envs = make()
    slots = len(envs) * len(envs[0].possible_agents)
    collector = Collector(envs, count_policy, frames_per_batch=slots * steps,
                          total_frames=slots * steps * n_batches, trajs_per_batch=2,
                          traj_format=fmt, drop_incomplete=True)  # fmt: skip
    with collector:
        episodes = list(collector)
    for ep in episodes:
        rows = ep if fmt == "padded" else split_trajectories(ep)
        assert rows[IS_INIT][:, 0].all(), "an episode starts at an agent's first step"
        last = rows[MASK].sum(1) - 1
        assert rows[DONE][torch.arange(len(rows)), last].all(), "an episode ends with a flag"
    if episodes:
        assert_agent_streams(episodes, make, complete=True)
    found = collected_transitions(episodes)
    assert len({(t.worker, t.traj, t.step.count) for t in found}) == len(found)


def per_worker(batches: list) -> dict[int, list]:
    """The rows of each worker (its trajectory id space) in each batch, in batch order."""
    out: dict[int, list] = {}
    for batch in batches:
        rows = batch.reshape(-1, batch.shape[-1])
        workers = rows[TRAJ_IDS][:, 0] >> 40
        for worker in workers.unique().tolist():
            out.setdefault(worker, []).append(rows[workers == worker])
    return out


WORKER_COPIES = [
    {"red_0": [(0, None, "term")], "blue_1": [(2, 5, "term")], "red_2": [(1, 5, "trunc")]},
    {"red_0": [(0, 2, "trunc"), (3, None, "term")], "blue_1": [(0, None, "term")],
     "red_2": [(1, 4, "term")]},
]  # fmt: skip


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector])
def test_worker_processes_keep_every_agent_transition(api, kind):
    make = factory(api, WORKER_COPIES, 6)
    with kind(make, count_policy, num_workers=2, frames_per_batch=2 * 6 * 5,
              total_frames=2 * 6 * 5 * 6) as collector:  # fmt: skip
        batches = list(collector)
    streams = per_worker(batches)
    assert len(streams) == 2
    assert sum(assert_agent_streams(parts, make) for parts in streams.values()) == 2 * 6 * 5 * 6


def test_ray_workers_keep_every_agent_transition(ray_instance):
    make = factory("aec", WORKER_COPIES, 6)
    frames = 2 * 6 * 4
    with MultiSyncCollector(
        make,
        count_policy,
        num_workers=2,
        backend="ray",
        frames_per_batch=frames,
        total_frames=frames * 4,
    ) as collector:
        batches = list(collector)
    streams = per_worker(batches)
    assert len(streams) == 2
    assert sum(assert_agent_streams(parts, make) for parts in streams.values()) == frames * 4


# ------------------------------------------------------------------------- downstream
SCHEDULE = {
    "red_0": [(0, 3, "term"), (4, None, "trunc")],
    "blue_1": [(1, None, "term")],
    "red_2": [(0, 5, "trunc")],
}


@pytest.mark.parametrize("api", list(APIS))
def test_split_trajectories_gives_one_agent_life_per_row(api):
    make = factory(api, [SCHEDULE, SCHEDULE], 6)
    with Collector(make(), count_policy, frames_per_batch=6 * 7, total_frames=6 * 7 * 3) as c:
        batches = list(c)
    rows = [split_trajectories(batch) for batch in batches]
    for split in rows:
        ids = split[TRAJ_IDS]
        assert (ids[split[MASK]].reshape(-1) >= 0).all()
        for r in range(len(split)):
            kept = split[r][split[MASK][r]]
            assert kept[TRAJ_IDS].unique().numel() == 1
            assert kept["agent", "id"].unique().numel() == 1
    assert_agent_streams(rows, make)


@pytest.mark.parametrize("api", list(APIS))
def test_replay_slices_never_cross_agents(api):
    make = factory(api, [SCHEDULE], 6)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(1_000), sampler=SliceSampler(slice_len=3), batch_size=30
    )
    with Collector(make(), count_policy, frames_per_batch=3 * 8, total_frames=3 * 8 * 6,
                   replay_buffer=buffer) as c:  # fmt: skip
        for _ in c:
            pass
    for _ in range(20):
        sample = buffer.sample().reshape(-1, 3)
        for piece in sample:
            assert piece[TRAJ_IDS].unique().numel() == 1
            assert piece["agent", "id"].unique().numel() == 1
            counts = piece[OBSERVATION][:, 2]
            assert (counts == counts[0] + torch.arange(3)).all(), "a slice of consecutive steps"


@pytest.mark.parametrize("api", list(APIS))
def test_value_targets_stay_within_each_agent_life(api):
    """GAE on an ``[S, T]`` batch of agent slots equals GAE computed on each agent's life in
    the batch alone (bootstrapping where the batch cuts it)."""
    make = factory(api, [SCHEDULE, SCHEDULE], 6)
    with Collector(make(), count_policy, frames_per_batch=6 * 9, total_frames=6 * 9) as c:
        batch = next(iter(c))
    value = batch[OBSERVATION][..., 2] * 0.1 + batch[OBSERVATION][..., 1]
    next_value = batch[NEXT_OBSERVATION][..., 2] * 0.1 + batch[NEXT_OBSERVATION][..., 1]
    advantage, _ = targets.gae(batch, value, next_value, gamma=0.9, lmbda=0.8)
    flat = batch.reshape(-1)
    v, nv, adv = value.reshape(-1), next_value.reshape(-1), advantage.reshape(-1)
    for traj in flat[TRAJ_IDS].unique():
        at = torch.nonzero(flat[TRAJ_IDS] == traj).squeeze(1)  # the life's steps, in order
        a_next = 0.0
        for i in reversed(at.tolist()):
            reward = float(flat[REWARD][i])
            term, done = bool(flat[TERMINATED][i]), bool(flat[DONE][i])
            delta = reward + 0.9 * (not term) * float(nv[i]) - float(v[i])
            continues = i != at[-1] and not done
            a_next = delta + 0.9 * 0.8 * continues * a_next
            assert abs(float(adv[i]) - a_next) < 1e-4


class CountingGRU(torch.nn.Module):
    """A GRU policy over the scheduled envs' observations (action: count_policy's)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cell = torch.nn.GRUCell(5, 4)

    def forward(self, td):
        h = td.get("h", None)
        if h is None:
            h = torch.zeros(*td.batch_size, 4)
        td["next", "h"] = self.cell(td["observation"] / 10, h)
        return count_policy(td)


@pytest.mark.parametrize("api", list(APIS))
def test_recurrent_state_is_per_agent_life(api):
    """The state entering an agent's step is the one its previous step produced (carried over
    the other agents' turns in AEC envs, and over batch edges), zero at the agent's first
    step: the GRU run over each agent life alone gives the same states."""
    make = factory(api, [SCHEDULE, SCHEDULE], 6)
    gru = CountingGRU()
    with Collector(make(), gru, frames_per_batch=6 * 5, total_frames=6 * 5 * 4) as c:
        batches = list(c)
    flat = torch.cat([split_trajectories(b)[split_trajectories(b)[MASK]] for b in batches])
    with torch.no_grad():
        for traj in flat[TRAJ_IDS].unique():
            life = flat[flat[TRAJ_IDS] == traj]
            h = torch.zeros(4) if bool(life[IS_INIT][0]) else life["h"][0]
            for step in life:
                torch.testing.assert_close(step["h"], h)
                h = gru.cell(step[OBSERVATION][None] / 10, h[None])[0]
                torch.testing.assert_close(step[NEXT, "h"], h)


def test_policy_map_runs_each_group_its_policy():
    def constant(k):
        def policy(td):
            td["action"] = torch.full(td.batch_size, k, dtype=torch.long)
            return td

        return policy

    from splice.envs.pettingzoo import PolicyMap

    make = factory("aec", [SCHEDULE], 6)
    policy = PolicyMap({"red": constant(1), "blue_1": constant(2)})
    with Collector(make(), policy, frames_per_batch=3 * 6, total_frames=3 * 6 * 2) as c:
        batches = list(c)
    for batch in batches:
        flat = batch.reshape(-1)
        red = flat["agent", "group"] == 0
        assert (flat["action"][red] == 1).all() and (flat["action"][~red] == 2).all()


def tagged_copy():
    """A scheduled env whose tag counts the copies made in this process (0, 1, ...)."""
    tagged_copy.made = getattr(tagged_copy, "made", -1) + 1
    return ScheduledParallelEnv(SCHEDULE, 6, tag=tagged_copy.made)


def test_pettingzoo_envs_copies_travel_to_workers():
    """``PettingZooEnvs`` (a factory and a count) is what worker processes rebuild."""
    envs = PettingZooEnvs(tagged_copy, num_envs=2)
    with MultiSyncCollector(envs, count_policy, num_workers=2, frames_per_batch=2 * 6 * 5,
                            total_frames=2 * 6 * 5 * 3) as collector:  # fmt: skip
        batches = list(collector)
    assert all(b.batch_size == (12, 5) for b in batches)
    streams = per_worker(batches)
    assert len(streams) == 2
    for parts in streams.values():
        assert_agent_streams(parts, lambda: [ScheduledParallelEnv(SCHEDULE, 6, tag=i)
                                             for i in range(2)])  # fmt: skip
