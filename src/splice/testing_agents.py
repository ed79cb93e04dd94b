"""Multi-agent test envs whose agents join and leave at chosen steps, a ground-truth
per-agent loop over them, and the per-agent transitions of collector batches to compare
with it (tests of :mod:`splice.envs.pettingzoo`; needs ``pettingzoo``).

A *schedule* gives each agent its lives in an episode: ``(start, stop, end)`` — the agent
joins so that it acts first at step (parallel) or cycle (AEC) ``start``, acts last at
``stop - 1``, where its step is ``terminated`` (``end="term"``) or ``truncated``
(``"trunc"``); ``stop=None`` lives until the episode's last step (``length - 1``), where every
agent still there is truncated. Every episode follows the same schedule.

Each agent's observation is ``[tag, agent index, count, t, 0]`` where ``count`` is how many
steps the agent has taken in this env so far (over all its lives and episodes): along an
agent's steps, the entering ``count`` goes 0, 1, 2, ... and the next one is one more, so a
step lost, repeated, reordered or given to another agent shows. The reward of an agent's
step is its action plus ``agent index / 100`` (AEC: plus ``0.5`` for every other agent's
turn before its next one, accumulated as PettingZoo defines).

Examples:
    >>> env = ScheduledParallelEnv({"a_0": [(0, 2, "term")], "a_1": [(1, None, "term")]}, 3)
    >>> obs, _ = env.reset()
    >>> sorted(obs)
    ['a_0']
    >>> obs, reward, term, trunc, _ = env.step({"a_0": 1})
    >>> sorted(obs), reward
    (['a_0', 'a_1'], {'a_0': 1.0})
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from tensordict import TensorDictBase

from splice.collectors.ids import worker_of
from splice.layout import (
    ACTION,
    IS_INIT,
    MASK,
    NEXT,
    NEXT_OBSERVATION,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
)

__all__ = [
    "Collected",
    "Schedule",
    "ScheduledAECEnv",
    "ScheduledParallelEnv",
    "Transition",
    "assert_agent_streams",
    "collected_transitions",
    "count_policy",
    "ground_truth",
]

#: ``{agent: [(start, stop or None, "term" | "trunc"), ...]}``
Schedule = Mapping[str, Sequence[tuple[int, int | None, str]]]
_OBS = spaces.Box(-np.inf, np.inf, (5,), np.float32)
_ACT = spaces.Discrete(3)


@dataclass(frozen=True)
class Transition:
    """One agent step: its env (tag) and agent, and what it holds."""

    tag: int
    agent: int
    count: int  # the entering observation's count: the agent's step number in its env
    action: int
    reward: float
    next_count: int
    terminated: bool
    truncated: bool


class _Lives:
    def __init__(self, schedule: Schedule, length: int) -> None:
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        self.length = length
        self.agents = list(schedule)
        self.ends: dict[tuple[str, int], str] = {}  # (agent, last step) -> flag
        self.starts: dict[int, list[str]] = {}
        for agent, lives in schedule.items():
            for start, stop, end in lives:
                stop = length if stop is None else stop
                if not 0 <= start < stop <= length or end not in ("term", "trunc"):
                    raise ValueError(f"bad life {(start, stop, end)} of {agent!r}")
                self.starts.setdefault(start, []).append(agent)
                self.ends[(agent, stop - 1)] = end


def _obs(tag: int, index: int, count: int, t: int) -> np.ndarray:
    return np.array([tag, index, count, t, 0], np.float32)


class ScheduledParallelEnv(ParallelEnv):  # type: ignore[misc]
    """A PettingZoo ``ParallelEnv`` following a schedule (see the module docstring).

    Args:
        schedule: the agents' lives in each episode; its keys are ``possible_agents``.
        length: steps per episode.
        tag: the first observation entry.

    ``step`` raises ``ValueError`` for an action of an agent that is not live, or a live
    agent without one.
    """

    metadata: dict[str, Any] = {"name": "scheduled_parallel"}  # noqa: RUF012

    def __init__(self, schedule: Schedule, length: int, tag: int = 0) -> None:
        self.lives = _Lives(schedule, length)
        self.possible_agents = list(schedule)
        self.agents: list[str] = []
        self.tag = tag
        self.count = dict.fromkeys(self.possible_agents, 0)
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return _OBS

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return _ACT

    def _observe(self, agent: str) -> np.ndarray:
        return _obs(self.tag, self.possible_agents.index(agent), self.count[agent], self.t)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.t = 0
        self.agents = list(self.lives.starts.get(0, []))
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        if set(actions) != set(self.agents):
            raise ValueError(f"actions for {sorted(actions)}, live agents {sorted(self.agents)}")
        reward, term, trunc = {}, {}, {}
        for agent in self.agents:
            self.count[agent] += 1
            reward[agent] = float(actions[agent]) + self.possible_agents.index(agent) / 100
            end = self.lives.ends.get((agent, self.t))
            term[agent], trunc[agent] = end == "term", end == "trunc"
        self.t += 1
        if self.t >= self.lives.length:
            for agent in self.agents:
                trunc[agent] = trunc[agent] or not term[agent]
        acted = list(self.agents)
        obs = {a: self._observe(a) for a in acted}
        survivors = [a for a in acted if not (term[a] or trunc[a])]
        joining = [] if self.t >= self.lives.length else self.lives.starts.get(self.t, [])
        self.agents = survivors + [a for a in joining if a not in survivors]
        for agent in joining:
            obs[agent] = self._observe(agent)
        return obs, reward, term, trunc, {a: {} for a in obs}


class ScheduledAECEnv(AECEnv):  # type: ignore[misc]
    """A PettingZoo ``AECEnv`` following a schedule (see the module docstring): in each
    cycle the live agents act in order of their index; an agent whose life ends is selected
    dead (it must step ``None``) before the next agent acts.

    Args:
        schedule: the agents' lives in each episode (in cycles).
        length: cycles per episode.
        tag: the first observation entry.
    """

    metadata: dict[str, Any] = {"name": "scheduled_aec"}  # noqa: RUF012

    def __init__(self, schedule: Schedule, length: int, tag: int = 0) -> None:
        super().__init__()
        self.lives = _Lives(schedule, length)
        self.possible_agents = list(schedule)
        self.agents: list[str] = []
        self.tag = tag
        self.count = dict.fromkeys(self.possible_agents, 0)
        self.t = 0
        self._queue: list[str] = []
        self.agent_selection: Any = None

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return _OBS

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return _ACT

    def observe(self, agent: str) -> np.ndarray:
        return _obs(self.tag, self.possible_agents.index(agent), self.count[agent], self.t)

    def _add(self, agents: list[str]) -> None:
        for agent in agents:
            if agent in self.agents:
                continue
            self.agents.append(agent)
            self.rewards[agent] = 0.0
            self._cumulative_rewards[agent] = 0.0
            self.terminations[agent] = self.truncations[agent] = False
            self.infos[agent] = {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.t = 0
        self.agents = []
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self._add(self.lives.starts.get(0, []))
        self._queue = sorted(self.agents, key=self.possible_agents.index)
        self.agent_selection = self._queue.pop(0) if self._queue else None

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            if action is not None:
                raise ValueError("when an agent is dead, the only valid action is None")
            for table in (self.rewards, self._cumulative_rewards, self.infos):
                del table[agent]
            del self.terminations[agent], self.truncations[agent]
            self.agents.remove(agent)
        else:
            if action is None:
                raise ValueError(f"live agent {agent!r} got action None")
            self.count[agent] += 1
            self._cumulative_rewards[agent] = 0.0
            for other in self.agents:
                self.rewards[other] = 0.5 if other != agent else 0.0
            self.rewards[agent] = float(action) + self.possible_agents.index(agent) / 100
            end = self.lives.ends.get((agent, self.t))
            self.terminations[agent], self.truncations[agent] = end == "term", end == "trunc"
            for other, reward in self.rewards.items():
                self._cumulative_rewards[other] += reward
        self._select()

    def _select(self) -> None:
        dead = [a for a in self.agents if self.terminations[a] or self.truncations[a]]
        if dead:
            self.agent_selection = dead[0]
            return
        while not self._queue:
            if not self.agents and self.t + 1 not in self.lives.starts:
                return  # the episode is over
            self.t += 1
            if self.t >= self.lives.length:
                for agent in self.agents:
                    self.truncations[agent] = True
                if self.agents:
                    self.agent_selection = self.agents[0]
                return
            self._add(self.lives.starts.get(self.t, []))
            self._queue = sorted(self.agents, key=self.possible_agents.index)
        self.agent_selection = self._queue.pop(0)


Policy = Callable[[np.ndarray], int]


def count_policy(obs: np.ndarray) -> int:
    """A deterministic policy for these envs: the agent's count plus its index, mod 3."""
    return int(obs[2] + obs[1]) % 3


def ground_truth(env: Any, steps: int, policy: Policy = count_policy) -> list[Transition]:
    """Every agent transition of ``env`` (a scheduled env, freshly made) over ``steps`` env
    steps (parallel) or agent turns (AEC), from a plain PettingZoo loop: reset, step until no
    agent is left, reset again. Transitions still open at the end are left out."""
    out: list[Transition] = []
    if isinstance(env, ParallelEnv):
        obs, _ = env.reset()
        for _ in range(steps):
            actions = {agent: policy(obs[agent]) for agent in env.agents}
            before = {agent: obs[agent] for agent in env.agents}
            obs, reward, term, trunc, _ = env.step(actions)
            for agent, entering in before.items():
                out.append(_transition(entering, actions[agent], reward[agent], obs[agent],
                                       term[agent], trunc[agent]))  # fmt: skip
            if not env.agents:
                obs, _ = env.reset()
        return out
    env.reset()
    open_steps: dict[str, tuple[np.ndarray, int]] = {}
    for _ in range(steps):
        if not env.agents:
            env.reset()
        agent = env.agent_selection
        obs, reward, term, trunc, _ = env.last()
        if agent in open_steps:
            entering, action = open_steps.pop(agent)
            out.append(_transition(entering, action, reward, obs, term, trunc))
        if term or trunc:
            env.step(None)
            continue
        action = policy(obs)
        open_steps[agent] = (obs, action)
        env.step(action)
    return out


def _transition(
    entering: np.ndarray, action: int, reward: float, nxt: np.ndarray, term: bool, trunc: bool
) -> Transition:
    return Transition(
        tag=int(entering[0]),
        agent=int(entering[1]),
        count=int(entering[2]),
        action=int(action),
        reward=round(float(reward), 4),
        next_count=int(nxt[2]),
        terminated=bool(term),
        truncated=bool(trunc),
    )


@dataclass(frozen=True)
class Collected:
    """A transition found in a collector's output, with where it was found."""

    worker: int  # the id space of its trajectory id
    batch: int  # the index of the batch that held it
    row: int  # its row in that batch (-1 for layouts without slot rows)
    traj: int  # its trajectory id
    init: bool  # its is_init flag
    step: Transition


def collected_transitions(batches: Sequence[TensorDictBase]) -> list[Collected]:
    """The agent transitions in collector batches of scheduled envs (``[S, T]`` slot rows,
    or any layout with the data contract's keys: split or whole episodes, padded or not), in
    batch order, row by row. Checks on the way that the stored agent id is the
    observation's agent."""
    out: list[Collected] = []
    for b, batch in enumerate(batches):
        rows = batch.ndim == 2 and MASK not in batch.keys(True)
        flat = batch.reshape(-1)
        if MASK in flat.keys(True):
            flat = flat[flat[MASK]]
        row = np.repeat(np.arange(batch.shape[0]), batch.shape[1]) if rows else None
        ids = flat[TRAJ_IDS].numpy()
        obs, nxt = flat[OBSERVATION].numpy(), flat[NEXT_OBSERVATION].numpy()
        agent_id = flat["agent", "id"].numpy()
        assert (agent_id == obs[:, 1]).all(), "a step stored under another agent's id"
        assert (flat[NEXT, "agent", "id"].numpy() == agent_id).all()
        action = flat[ACTION].numpy()
        reward = flat[REWARD].numpy().reshape(-1)
        term = flat[TERMINATED].numpy().reshape(-1)
        trunc = flat[TRUNCATED].numpy().reshape(-1)
        init = flat[IS_INIT].numpy().reshape(-1)
        for i in range(len(flat)):
            step = _transition(obs[i], action[i], reward[i], nxt[i], term[i], trunc[i])
            r = -1 if row is None else int(row[i])
            out.append(Collected(int(worker_of(ids[i])), b, r, int(ids[i]), bool(init[i]), step))
    return out


def assert_agent_streams(
    batches: Sequence[TensorDictBase],
    make_envs: Callable[[], list[Any]],
    policy: Policy = count_policy,
    complete: bool = False,
) -> int:
    """Check collector output over scheduled envs against :func:`ground_truth` runs of fresh
    ``make_envs()`` copies (what each worker made):

    * every trajectory id holds the consecutive steps of one agent life, in order across
      batches, from the life's first step (``is_init`` there and only there), each step equal
      to the ground truth in every field (action, reward, next observation, end flags);
      distinct lives have distinct ids; no step is found twice;
    * ``[S, T]`` batches: each row continues across batches, and a trajectory is followed in
      its row only after its last step (the env's flag), so no step of a row is lost; at
      most one life per row is still open at the end;
    * with ``complete``, every trajectory is a whole life.

    Rows advance on their own, so an agent's later life may be delivered before an earlier
    one that lies in a slower row. Returns the number of transitions checked.

    Examples:
        >>> from splice import Collector
        >>> def make():
        ...     return [ScheduledAECEnv({"a_0": [(0, None, "term")], "a_1": [(1, 3, "term")]},
        ...                             4, tag=0)]
        >>> def policy(td):
        ...     obs = td["observation"]
        ...     return td.set("action", ((obs[:, 2] + obs[:, 1]) % 3).long())
        >>> with Collector(make(), policy, frames_per_batch=20, total_frames=40) as c:
        ...     batches = list(c)
        >>> assert_agent_streams(batches, make)
        40
    """
    found = collected_transitions(batches)
    longest: dict[tuple[int, int], int] = {}
    for item in found:
        pair = (item.step.tag, item.step.agent)
        longest[pair] = max(longest.get(pair, 0), item.step.next_count)
    truth: dict[tuple[int, int, int], Transition] = {}
    for env in make_envs():
        # Enough env steps (or turns) for every agent to reach its last collected count.
        most = max((n for (tag, _), n in longest.items() if tag == env.tag), default=0)
        steps = (most + 2) * (len(env.possible_agents) + 1) * (env.lives.length + 1)
        for t in ground_truth(env, steps, policy):
            truth[(t.tag, t.agent, t.count)] = t
    seen: set[tuple[int, int, int, int]] = set()
    lives: dict[int, list[Collected]] = {}
    for item in found:
        where = (item.step.tag, item.step.agent, item.step.count)
        assert (item.worker, *where) not in seen, f"step {where} of {item.worker} found twice"
        seen.add((item.worker, *where))
        expected = truth.get(where)
        assert item.step == expected, f"{item.step} != ground truth {expected}"
        lives.setdefault(item.traj, []).append(item)
    for traj, items in lives.items():
        first = items[0].step
        counts = [item.step.count for item in items]
        assert counts == list(range(first.count, first.count + len(items))), (
            f"trajectory {traj}: steps {counts} (agent {first.agent}, env {first.tag})"
        )
        assert len({(item.worker, item.step.tag, item.step.agent) for item in items}) == 1
        assert [item.batch for item in items] == sorted(item.batch for item in items)
        before = truth.get((first.tag, first.agent, first.count - 1))
        starts = before is None or before.terminated or before.truncated
        assert starts, f"trajectory {traj} starts inside a life (count {first.count})"
        assert [item.init for item in items] == [True] + [False] * (len(items) - 1), (
            f"trajectory {traj}: is_init {[item.init for item in items]}"
        )
        for item in items[:-1]:
            assert not (item.step.terminated or item.step.truncated), f"{traj} ends early"
        if complete:
            assert items[-1].step.terminated or items[-1].step.truncated, f"{traj} ends open"
    streams: dict[int, list[Collected]] = {}
    for item in found:
        if item.row >= 0:
            streams.setdefault(item.row, []).append(item)
    for row, items in streams.items():
        open_lives = 0
        for prev, item in itertools.pairwise(items):
            if item.traj != prev.traj:
                assert prev.step.terminated or prev.step.truncated, (
                    f"row {row}: trajectory {prev.traj} is followed by {item.traj} before it ended"
                )
        last = items[-1].step
        open_lives += not (last.terminated or last.truncated)
        assert open_lives <= 1
    return len(found)
