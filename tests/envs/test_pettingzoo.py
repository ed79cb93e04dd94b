"""PettingZoo adapters (splice.envs.pettingzoo) on real envs from their packages: classic
turn-based games (AEC), MPE and butterfly (parallel, agents that die), step by step against
plain PettingZoo loops with the same seeds and actions; and bad input."""

from __future__ import annotations

import numpy as np
import pettingzoo
import pytest
import torch
from mpe2 import simple_adversary_v3, simple_spread_v3

from splice import Collector
from splice.envs import make_adapter
from splice.envs.pettingzoo import PettingZooEnvs, PolicyMap
from splice.layout import (
    ACTION,
    DONE,
    IS_INIT,
    NEXT_OBSERVATION,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
    validate_batch,
)
from splice.policies import PolicyError
from splice.testing_agents import ScheduledAECEnv, ScheduledParallelEnv

pytestmark = pytest.mark.timeout(120)


def tictactoe():
    return pettingzoo.make("aec", "classic/tictactoe-v3")


def first_legal(td):
    """Deterministic: the first allowed move of the action mask."""
    mask = td["observation", "action_mask"]
    td["action"] = mask.argmax(-1).long()
    return td


def lives_of(batches):
    """``{traj id: [(agent, obs, action, reward, next obs, term, trunc), ...]}`` in order."""
    out: dict[int, list] = {}
    for batch in batches:
        flat = batch.reshape(-1)
        for i in range(len(flat)):
            step = flat[i]
            out.setdefault(int(step[TRAJ_IDS]), []).append(step)
    return out


def test_tictactoe_games_match_a_plain_aec_loop():
    """Each player's steps run from its move to its next observation (after the other
    player's move), reward as ``last()`` gives it; the game's end ends both players'
    trajectories with ``terminated`` and the final rewards."""
    with Collector([tictactoe(), tictactoe()], first_legal, frames_per_batch=4 * 6,
                   total_frames=4 * 6 * 4, seed=3) as collector:  # fmt: skip
        batches = list(collector)
    for batch in batches:
        validate_batch(batch)
    # The plain loop: same deterministic moves.
    env = tictactoe()
    env.reset(seed=3)
    truth: dict[str, list] = {}
    open_: dict[str, tuple] = {}
    for agent in env.agent_iter(200):
        obs, reward, term, trunc, _ = env.last()
        if agent in open_:
            entering, action = open_.pop(agent)
            truth.setdefault(agent, []).append((entering, action, reward, obs, term, trunc))
        if term or trunc:
            env.step(None)
            if not env.agents:
                env.reset()
            continue
        action = int(np.argmax(obs["action_mask"]))
        open_[agent] = (obs, action)
        env.step(action)
    env0 = [(t, steps) for t, steps in lives_of(batches).items()]
    names = ["player_1", "player_2"]
    used = {name: 0 for name in names}
    games = 0
    for _, steps in sorted(env0, key=lambda item: item[0]):
        agent = names[int(steps[0]["agent", "id"])]
        # copy 0's games: its observations are those of the plain loop (same seed, same moves)
        for k, step in enumerate(steps):
            entering, action, reward, nxt, term, trunc = truth[agent][used[agent] + k]
            if not np.array_equal(
                step[OBSERVATION, "observation"].numpy(), entering["observation"]
            ):
                break  # a game of copy 1 (it plays the same moves: equal games are fine too)
            assert int(step[ACTION]) == action
            assert float(step[REWARD]) == reward
            np.testing.assert_array_equal(
                step[NEXT_OBSERVATION, "observation"].numpy(), nxt["observation"]
            )
            assert bool(step[TERMINATED]) == term and bool(step[TRUNCATED]) == trunc
        else:
            used[agent] += len(steps)
            games += bool(steps[-1][DONE])
    assert games >= 4
    # Each finished game: both players end with terminated, rewards of a game sum to 0.
    for steps in lives_of(batches).values():
        assert bool(steps[0][IS_INIT]) and not any(bool(s[IS_INIT]) for s in steps[1:])


def test_connect_four_random_masked_moves_are_legal_and_games_end_for_both():
    """Random actions respect the action mask (no illegal-move penalty, which would end a
    game with -1 for one player only): every finished game's final rewards sum to 0."""
    make = lambda: pettingzoo.make("aec", "classic/connect_four-v3")  # noqa: E731
    with Collector(PettingZooEnvs(make, 3), frames_per_batch=6 * 30, total_frames=6 * 30 * 3,
                   seed=0) as collector:  # fmt: skip
        batches = list(collector)
    ends = []
    for batch in batches:
        validate_batch(batch)
        flat = batch.reshape(-1)
        mask = flat[OBSERVATION, "action_mask"]
        assert mask[torch.arange(len(flat)), flat[ACTION]].all(), "an illegal move"
        done = flat[DONE].squeeze(-1)
        ends += flat[REWARD].squeeze(-1)[done].tolist()
        assert not flat[TRUNCATED].any()
    assert len(ends) >= 4
    assert sum(ends) == 0 and all(r in (-1.0, 0.0, 1.0) for r in ends)


def test_simple_spread_matches_a_plain_parallel_loop():
    make = lambda: simple_spread_v3.parallel_env(max_cycles=7)  # noqa: E731

    def policy(td):
        td["action"] = ((td["observation"][:, :2].sum(-1) > 0).long() + 2 * td["agent", "id"]) % 5
        return td

    frames = 6 * 10
    with Collector(PettingZooEnvs(make, 2), policy, frames_per_batch=frames,
                   total_frames=frames * 3, seed=11) as collector:  # fmt: skip
        batches = list(collector)
    lives = lives_of(batches)
    # every agent life: 7 steps, truncated at the last one (max_cycles), is_init at the first
    complete = [steps for steps in lives.values() if bool(steps[-1][DONE])]
    assert len(complete) >= 6
    for steps in complete:
        assert len(steps) == 7 and bool(steps[-1][TRUNCATED]) and bool(steps[0][IS_INIT])
    # copy 0 against the plain loop with the same seed and policy
    env = make()
    obs, _ = env.reset(seed=11)
    truth = {agent: [] for agent in env.possible_agents}
    for _ in range(7 * 4):
        actions = {
            a: (int(obs[a][:2].sum() > 0) + 2 * env.possible_agents.index(a)) % 5
            for a in env.agents
        }
        nxt, reward, term, trunc, _ = env.step(actions)
        for a in actions:
            truth[a].append((obs[a], actions[a], reward[a], nxt[a], term[a], trunc[a]))
        obs = nxt if env.agents else env.reset()[0]
    matched = 0
    for steps in lives.values():
        agent = env.possible_agents[int(steps[0]["agent", "id"])]
        for rows in (truth[agent][i : i + 7] for i in range(0, len(truth[agent]), 7)):
            if np.allclose(steps[0][OBSERVATION].numpy(), rows[0][0]):
                for step, (o, a, r, n, te, tr) in zip(steps, rows, strict=False):
                    np.testing.assert_allclose(step[OBSERVATION].numpy(), o, rtol=1e-6)
                    assert int(step[ACTION]) == a
                    assert float(step[REWARD]) == pytest.approx(r, rel=1e-6)
                    np.testing.assert_allclose(step[NEXT_OBSERVATION].numpy(), n, rtol=1e-6)
                    assert (bool(step[TERMINATED]), bool(step[TRUNCATED])) == (te, tr)
                matched += 1
    assert matched >= 6  # copy 0's lives (copy 1 has its own seed)


def test_knights_archers_zombies_each_life_is_one_trajectory():
    """Butterfly KAZ (2 copies, random moves): each agent life is one trajectory with the
    env's flags at its end only (the zombies' arrival terminates every agent); the policy
    runs only for slots that hold an agent."""
    make = lambda: pettingzoo.make(  # noqa: E731
        "parallel", "butterfly/knights_archers_zombies-v11", max_cycles=80
    )
    generator = torch.Generator().manual_seed(0)

    def policy(td):
        assert (td["agent", "id"] >= 0).all(), "the policy got a row with no agent"
        td["action"] = torch.randint(0, 6, td.batch_size, generator=generator)
        return td

    with Collector(PettingZooEnvs(make, 2), policy, frames_per_batch=8 * 50,
                   total_frames=8 * 50 * 4, seed=0) as collector:  # fmt: skip
        batches = list(collector)
    lives = lives_of(batches)
    ended = [steps for steps in lives.values() if bool(steps[-1][DONE])]
    assert len(ended) >= 8
    for steps in lives.values():
        assert bool(steps[0][IS_INIT])
        assert not any(bool(s[DONE]) for s in steps[:-1])
        assert len({int(s["agent", "id"]) for s in steps}) == 1
        assert len(steps) <= 80


# ------------------------------------------------------------------------- bad input
def test_an_env_that_is_neither_gymnasium_nor_pettingzoo_is_refused():
    with pytest.raises(TypeError, match=r"gymnasium\.Env.*PettingZoo env"):
        make_adapter(object())
    with pytest.raises(TypeError, match="PettingZoo env"):
        make_adapter(lambda: 42)
    with pytest.raises(TypeError, match="PettingZoo env"):
        Collector(object(), frames_per_batch=4)


def test_supersuit_vector_envs_are_refused_with_the_way_out():
    import supersuit

    vec = supersuit.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env())
    with pytest.raises(ValueError, match=r"SuperSuit.*PettingZooEnvs"):
        make_adapter(vec)


def test_a_policy_map_without_an_agent_is_refused_before_any_step():
    stepped = []

    class Watched(ScheduledParallelEnv):
        def step(self, actions):
            stepped.append(1)
            return super().step(actions)

    env = Watched({"red_0": [(0, None, "term")], "blue_1": [(0, None, "term")]}, 3)
    with pytest.raises(ValueError, match="no policy for agent 'blue_1' \\(group 'blue'\\)"):
        Collector(env, PolicyMap({"red": first_legal}), frames_per_batch=4)
    assert not stepped


def test_an_action_for_an_agent_that_is_not_acting_is_refused_and_changes_nothing():
    env = ScheduledAECEnv({"red_0": [(0, None, "term")], "blue_1": [(1, 3, "term")]}, 4)
    adapter = make_adapter(env)
    adapter.reset(seed=0)
    before = adapter.acting_agents()
    with pytest.raises(ValueError, match="agent 'blue_1' of env 0 is not acting now"):
        adapter.slot_actions({"red_0": 1, "blue_1": 2})  # blue_1 has not joined yet
    with pytest.raises(ValueError, match="no action for the acting agents \\['red_0'\\]"):
        adapter.slot_actions({})
    assert adapter.acting_agents() == before
    adapter.bind(adapter.allocate(4))
    adapter.step(adapter.slot_actions({"red_0": 1}), 0)
    assert list(adapter.acting_agents()) == ["red_0"]  # blue_1 joins in cycle 1
    adapter.close()


def test_heterogeneous_agent_spaces_are_refused_naming_the_agents():
    with pytest.raises(ValueError, match=r"different observation spaces.*pad_observations_v0"):
        make_adapter(simple_adversary_v3.parallel_env())


def test_options_that_do_not_apply_to_agent_slots_are_refused():
    env = lambda: simple_spread_v3.parallel_env(max_cycles=5)  # noqa: E731
    with pytest.raises(ValueError, match="info_keys are not supported with PettingZoo"):
        Collector(env(), frames_per_batch=6, info_keys=["x"])
    with pytest.raises(ValueError, match="max_frames_per_traj needs an env that can reset"):
        Collector(env(), frames_per_batch=6, max_frames_per_traj=3)


def test_policy_map_entries_that_write_different_keys_are_refused():
    def plain(td):
        td["action"] = torch.zeros(td.batch_size, dtype=torch.long)
        return td

    def extra(td):
        td["score"] = torch.zeros(td.batch_size)
        return plain(td)

    env = ScheduledAECEnv({"red_0": [(0, None, "term")], "blue_1": [(0, None, "term")]}, 4)
    collector = Collector(env, PolicyMap({"red": plain, "blue": extra}), frames_per_batch=8)
    with pytest.raises(PolicyError, match="write different keys"):
        next(iter(collector))
    collector.shutdown()
