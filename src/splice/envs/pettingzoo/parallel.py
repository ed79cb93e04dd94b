"""PettingZoo's parallel API: every live agent acts at every step.

Examples:
    >>> from mpe2 import simple_spread_v3
    >>> from splice.envs import make_adapter
    >>> adapter = make_adapter(simple_spread_v3.parallel_env(max_cycles=5))
    >>> type(adapter).__name__, adapter.num_envs, adapter.agent_names
    ('ParallelAgentsAdapter', 3, ['agent_0', 'agent_1', 'agent_2'])
    >>> adapter.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splice.envs.errors import EnvError
from splice.envs.pettingzoo._slots import AgentSlotsAdapter

__all__ = ["ParallelAgentsAdapter"]


class ParallelAgentsAdapter(AgentSlotsAdapter):
    """Agent slots over PettingZoo ``ParallelEnv`` copies (see :mod:`splice.envs.pettingzoo`).

    At each step every live agent of every copy acts; an agent whose step returns
    ``terminated`` or ``truncated`` ends its trajectory there and frees its slot; an agent
    that appears in a step's observations starts a trajectory at the next step; a copy with
    no agent left is reset (its agents start new trajectories), and an agent it still listed
    without an end flag gets ``truncated``.

    Args:
        envs: the ``ParallelEnv`` copies.
        groups: see :class:`~splice.envs.pettingzoo.PettingZooEnvs`.
        max_agents: see :class:`~splice.envs.pettingzoo.PettingZooEnvs`.
    """

    api = "parallel"

    def reset(self, seed: int | None = None) -> None:
        self._clear_slots()
        joins: list[tuple[int, list[Any]]] = []
        for e, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + e)
            joins += self._join_all(e, env, obs)
        self._entering(None, joins)
        self.check_next = True

    def _join_all(self, e: int, env: Any, obs: dict[Any, Any]) -> list[tuple[int, list[Any]]]:
        """Every agent of a freshly reset copy starts a life."""
        joins = []
        for agent in obs:
            slot = self._join(e, agent)
            self._acts(slot, agent)
            joins.append((slot, self._values(agent, obs[agent])))
        if not joins:
            raise EnvError(f"env {e} ({type(env).__name__}) has no agent after reset()")
        return joins

    def step(self, action: Any, c: int) -> np.ndarray | None:
        rows = action.tolist() if np.ndim(action) == 1 else action
        ids = self._ids
        acting = ids >= 0
        dead = None if acting.all() else ~acting
        self._next_id[c] = ids  # the agent of each step, at its ("next", "agent", ...) too
        self._next_group[c] = self._groups
        slots: list[int] = []
        observations: list[Any] = []
        rewards: list[float] = []
        ends: list[tuple[int, bool, bool]] = []
        joins: list[tuple[int, list[Any]]] = []
        for e, env in enumerate(self.envs):
            slot_of = self._slot_of[e]
            obs, reward, terminated, truncated, _ = env.step(
                {agent: rows[slot] for agent, slot in slot_of.items()}
            )
            leaving = []
            for agent, slot in slot_of.items():
                value = obs.get(agent)
                if value is None:
                    raise EnvError(
                        f"env {e}'s step() returned no observation for agent {agent!r}, which "
                        "acted (an agent leaves with terminated or truncated set)"
                    )
                if agent not in self._checked:
                    self._check_agent_obs(agent, value)
                slots.append(slot)
                observations.append(value)
                rewards.append(reward.get(agent, 0.0))
                term, trunc = terminated.get(agent, False), truncated.get(agent, False)
                if term or trunc:
                    ends.append((slot, bool(term), bool(trunc)))
                    leaving.append(agent)
            for agent in leaving:
                self._leave(e, agent)
            if len(obs) > len(slot_of) + len(leaving):  # agents that appeared
                for agent in obs:
                    if agent not in slot_of and agent not in leaving:
                        slot = self._join(e, agent)
                        self._acts(slot, agent)
                        joins.append((slot, self._values(agent, obs[agent])))
            if not env.agents:  # the episode is over: every agent still here is cut short
                for agent in list(slot_of):
                    ends.append((self._leave(e, agent), False, True))
                fresh, _ = env.reset()
                joins += self._join_all(e, env, fresh)
        self._write(c, slots, observations, rewards, ends)
        self.pool.count(None if dead is None else acting)
        self.starting = None
        if joins:
            starting = np.zeros(self.num_envs, np.bool_)
            starting[[slot for slot, _ in joins]] = True
            self.starting = starting
        self._entering(c, joins)
        return dead

    def _write(
        self,
        c: int,
        slots: list[int],
        observations: list[Any],
        rewards: list[float],
        ends: list[tuple[int, bool, bool]],
    ) -> None:
        at = np.asarray(slots, np.intp)
        if self._single_leaf:
            self._next_obs0[c, at] = np.stack(observations)
        else:
            leaves = [self._flatten(value) for value in observations]
            for i, arr in enumerate(self._next_obs):
                arr[c, at] = np.stack([values[i] for values in leaves])
        self._reward[c, at] = rewards
        for slot, term, trunc in ends:
            if term:
                self._terminated[c, slot] = True
            if trunc:
                self._truncated[c, slot] = True
