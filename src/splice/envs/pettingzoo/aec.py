"""PettingZoo's AEC API: agents act in turn.

An agent's step runs from its action to its next observation, which PettingZoo gives when
the agent is selected again (``env.last()``), with the reward accumulated over the other
agents' turns in between (``last()``'s cumulative reward). So the results of the step an
agent takes at column ``c`` are written into column ``c`` later, at its next turn (or when
it is selected dead, or when its env copy is reset): the adapter reports such steps through
:meth:`~splice.envs.EnvAdapter.incomplete`, and the collector loop never returns a batch
holding one. The columns in which an agent waits are dead steps of its slot.

Examples:
    >>> import pettingzoo
    >>> from splice.envs import make_adapter
    >>> adapter = make_adapter(pettingzoo.make("aec", "classic/tictactoe-v3"))
    >>> type(adapter).__name__, adapter.num_envs, adapter.group_names
    ('AECAgentsAdapter', 2, ['player'])
    >>> adapter.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splice.envs.errors import EnvError
from splice.envs.pettingzoo._slots import AgentSlotsAdapter

__all__ = ["AECAgentsAdapter"]


class AECAgentsAdapter(AgentSlotsAdapter):
    """Agent slots over PettingZoo ``AECEnv`` copies (see :mod:`splice.envs.pettingzoo` and
    this module's docstring).

    At each step every copy's selected agent acts. Agents selected dead (terminated or
    truncated) end their trajectory (their last step gets the flag) and are stepped with
    ``None`` by the adapter, without a policy call; a copy with no agent left is reset. An
    agent that joins starts its trajectory at its first turn.

    Args:
        envs: the ``AECEnv`` copies.
        groups: see :class:`~splice.envs.pettingzoo.PettingZooEnvs`.
        max_agents: see :class:`~splice.envs.pettingzoo.PettingZooEnvs`.
    """

    api = "AEC"
    contiguous_episodes = False  # an agent's trajectory has the other agents' turns inside

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        b = self.num_envs
        #: Per slot, the column of its step that awaits its next turn, or -1.
        self._pending = np.full(b, -1, np.int64)
        #: Per slot, whether its agent has acted in this life (its next turn continues it).
        self._acted = np.zeros(b, np.bool_)
        #: Per env copy, the slot of its selected agent (what acts at the next step).
        self._acting = np.zeros(len(self.envs), np.intp)
        self._all_dead = np.ones(b, np.bool_)
        self._bound = False

    def bind(self, staging: Any) -> None:
        super().bind(staging)
        self._bound = True

    def incomplete(self) -> np.ndarray:
        return self._pending

    def columns_moved(self, shift: int) -> None:
        pending = self._pending
        pending[pending >= 0] -= shift

    def reset(self, seed: int | None = None) -> None:
        self._flush()
        self._clear_slots()
        self._acted[:] = False
        joins: list[tuple[int, list[Any]]] = []
        for e, env in enumerate(self.envs):
            env.reset(seed=None if seed is None else seed + e)
            self._start_agents(e, env)
            join = self._select(e, env, None)
            assert join is not None  # a first turn after a reset starts a life
            joins.append(join)
        self._entering(None, joins)
        self.check_next = True

    def _flush(self) -> None:
        """Before a reset: the steps awaiting their agent's next turn end now, truncated, with
        the agent's current observation and its reward so far."""
        if not self._bound:
            return
        for e, env in enumerate(self.envs):
            for agent, slot in self._slot_of[e].items():
                p = int(self._pending[slot])
                if p < 0:
                    continue
                cumulative = getattr(env, "_cumulative_rewards", {})
                self._complete(p, slot, agent, env.observe(agent), cumulative.get(agent, 0.0))
                self._truncated[p, slot] = True
        self._pending[:] = -1

    def _start_agents(self, e: int, env: Any) -> None:
        if not env.agents:
            raise EnvError(f"env {e} ({type(env).__name__}) has no agent after reset()")
        for agent in env.agents:
            self._acted[self._join(e, agent)] = False

    def step(self, action: Any, c: int) -> np.ndarray | None:
        rows = action.tolist() if np.ndim(action) == 1 else action
        acting = self._acting.copy()
        dead = self._all_dead.copy()
        dead[acting] = False
        self._ids[acting] = -1
        self._groups[acting] = -1
        joins: list[tuple[int, list[Any]]] = []
        for e, env in enumerate(self.envs):
            slot = int(acting[e])
            env.step(rows[slot])
            self._pending[slot] = c
            self._acted[slot] = True
            join = self._select(e, env, c)
            if join is not None:
                joins.append(join)
        self.pool.count(None if len(acting) == self.num_envs else ~dead)
        self.starting = None
        if joins:
            starting = np.zeros(self.num_envs, np.bool_)
            starting[[slot for slot, _ in joins]] = True
            self.starting = starting
        self._entering(c, joins)
        return None if len(acting) == self.num_envs else dead

    def _select(self, e: int, env: Any, c: int | None) -> tuple[int, list[Any]] | None:
        """Complete the step of the agent now selected in copy ``e`` (if it awaits its turn),
        step dead agents with ``None``, reset the copy when no agent is left, until a live
        agent is selected: it acts at the next step. Returns its slot and observation if that
        step starts its life (else its observation is written at column ``c``)."""
        resets = 0
        while True:
            if not env.agents:
                resets += 1
                if resets > 1:
                    raise EnvError(f"env {e} ({type(env).__name__}) ended right after reset()")
                env.reset()
                self._start_agents(e, env)
            agent = env.agent_selection
            slot = self._slot_of[e].get(agent)
            if slot is None:  # joined during the episode
                slot = self._join(e, agent)
                self._acted[slot] = False
            obs, reward, terminated, truncated, _ = env.last()
            p = int(self._pending[slot])
            if p >= 0:
                self._complete(p, slot, agent, obs, reward)
                if terminated:
                    self._terminated[p, slot] = True
                if truncated:
                    self._truncated[p, slot] = True
                self._pending[slot] = -1
            if terminated or truncated:
                env.step(None)
                self._leave(e, agent)
                continue
            self._acting[e] = slot
            self._acts(slot, agent)
            if not self._acted[slot]:
                return slot, self._values(agent, obs)
            if p != c:  # (the step just completed at c wrote it already)
                assert c is not None
                self._write_obs(c, slot, self._values(agent, obs))
                self._next_id[c, slot] = self._ids[slot]
                self._next_group[c, slot] = self._groups[slot]
            return None

    def _complete(self, p: int, slot: int, agent: Any, obs: Any, reward: float) -> None:
        """Write the results of ``agent``'s step at column ``p``."""
        self._write_obs(p, slot, self._values(agent, obs))
        self._reward[p, slot] = reward
        index = self._index[agent]
        self._next_id[p, slot] = index
        self._next_group[p, slot] = self.agent_group[index]

    def _leave(self, e: int, agent: Any) -> int:
        slot = super()._leave(e, agent)
        self._acted[slot] = False
        return slot
