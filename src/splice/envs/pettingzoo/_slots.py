"""What the PettingZoo adapters share: the envs and their agents, the slot pool, the agent
leaves, writing an agent's results into its slot, and the policy the slots run.

See :mod:`splice.envs.pettingzoo` for the layout this produces.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from splice.envs.base import EnvAdapter, StepTargets
from splice.envs.errors import EnvError
from splice.envs.pettingzoo._policy import AgentSlotsPolicy
from splice.envs.spaces import Leaf

__all__ = ["AGENT_GROUP", "AGENT_ID", "AgentSlotsAdapter", "PettingZooEnvs", "default_group"]

Key = tuple[str, ...]
#: The agent taking each step: its index in the env's ``possible_agents`` (int64; ``-1`` in
#: the policy's input for a slot with no agent acting).
AGENT_ID: Key = ("agent", "id")
#: The agent's group: its index in the adapter's :attr:`~AgentSlotsAdapter.group_names`.
AGENT_GROUP: Key = ("agent", "group")

_NUMBERED = re.compile(r"^(.*)_\d+$")


def default_group(agent: str) -> str:
    """An agent's group by PettingZoo's naming convention: its name without the ``_N``
    suffix (``"adversary_0"`` is in group ``"adversary"``); a name without one is its own
    group.

    Examples:
        >>> default_group("adversary_0"), default_group("player_1"), default_group("solo")
        ('adversary', 'player', 'solo')
    """
    match = _NUMBERED.match(str(agent))
    return match.group(1) if match else str(agent)


class PettingZooEnvs:
    """``num_envs`` copies of a PettingZoo env (parallel or AEC API) as one collector env;
    pass it wherever a collector takes an env or an env factory. It is picklable when
    ``make_env`` is (cloudpickle), so it travels to worker processes and Ray actors, each of
    which makes its own copies.

    Args:
        make_env: a zero-argument callable returning a PettingZoo ``ParallelEnv`` or
            ``AECEnv``; every copy must have the same ``possible_agents`` and spaces.
        num_envs: how many copies are stepped in turn by one adapter.
        groups: agent groups, ``{group name: [agent, ...]}`` covering every possible agent;
            default: :func:`default_group` of each agent's name.
        max_agents: agent slots per env copy (default: ``len(possible_agents)``, enough for
            every agent at once); fewer slots cost less when few agents live at a time.

    Raises:
        TypeError: ``make_env`` is not callable, or ``num_envs`` is not an int.
        ValueError: ``num_envs < 1``.

    Examples:
        >>> import pettingzoo
        >>> envs = PettingZooEnvs(lambda: pettingzoo.make("aec", "classic/tictactoe-v3"), 2)
        >>> [type(env).__name__ for env in envs.make()]
        ['OrderEnforcingWrapper', 'OrderEnforcingWrapper']
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        num_envs: int = 1,
        *,
        groups: Mapping[str, Sequence[str]] | None = None,
        max_agents: int | None = None,
    ) -> None:
        if not callable(make_env):
            raise TypeError(
                f"make_env must be a zero-argument callable returning a PettingZoo env, got "
                f"{type(make_env).__name__}"
            )
        for name, value in (("num_envs", num_envs), ("max_agents", max_agents)):
            if value is None and name == "max_agents":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.make_env = make_env
        self.num_envs = num_envs
        self.groups = None if groups is None else {g: list(a) for g, a in groups.items()}
        self.max_agents = max_agents

    def make(self) -> list[Any]:
        """Make the copies."""
        return [self.make_env() for _ in range(self.num_envs)]

    def __call__(self) -> PettingZooEnvs:
        """Itself: it is also an env factory (``create_env_fn`` of the multi-worker
        collectors), each worker making its own copies."""
        return self


def _groups_of(
    agents: list[Any], groups: Mapping[str, Sequence[Any]] | None
) -> tuple[list[str], np.ndarray]:
    """Group names (in order of first appearance) and each agent's group index."""
    if groups is None:
        of = {agent: default_group(agent) for agent in agents}
    else:
        of = {}
        for group, members in groups.items():
            for agent in members:
                if agent not in agents:
                    raise ValueError(
                        f"groups names agent {agent!r} (group {group!r}), which is not one of "
                        f"the env's possible_agents {agents}"
                    )
                if agent in of:
                    raise ValueError(f"agent {agent!r} is in two groups: {of[agent]!r}, {group!r}")
                of[agent] = group
        missing = [agent for agent in agents if agent not in of]
        if missing:
            raise ValueError(f"groups leaves agents {missing} out; every agent needs a group")
    names = list(dict.fromkeys(of[agent] for agent in agents))
    index = np.array([names.index(of[agent]) for agent in agents], np.int64)
    return names, index


class SlotPool:
    """Which agent lives in which row (slot). An agent that joins takes the free slot that
    has held the fewest steps so far, so that every row fills at about the same pace (a
    batch needs ``T`` steps in every row, and agents that live longer than others would
    otherwise make their rows run ahead and staging grow without bound).

    Examples:
        >>> pool = SlotPool(3)
        >>> pool.take(), pool.take()
        (0, 1)
        >>> pool.count(np.array([True, True, False]))
        >>> pool.release(0)
        >>> pool.take()  # slot 2 has held fewer steps than slot 0
        2
    """

    def __init__(self, size: int) -> None:
        self.free = np.ones(size, np.bool_)
        self.steps = np.zeros(size, np.int64)

    def take(self) -> int:
        candidates = np.flatnonzero(self.free)
        if not candidates.size:
            raise EnvError(
                "more agents are alive at once than there are agent slots; raise max_agents "
                "(PettingZooEnvs(..., max_agents=...))"
            )
        slot = int(candidates[np.argmin(self.steps[candidates])])
        self.free[slot] = False
        return slot

    def release(self, slot: int) -> None:
        self.free[slot] = True

    def count(self, live: np.ndarray | None) -> None:
        """One more step for the slots in ``live`` (``None``: every slot)."""
        if live is None:
            self.steps += 1
        else:
            self.steps[live] += 1

    def clear(self) -> None:
        self.free[:] = True


class AgentSlotsAdapter(EnvAdapter):
    """Shared part of :class:`~splice.envs.pettingzoo.ParallelAgentsAdapter` and
    :class:`~splice.envs.pettingzoo.AECAgentsAdapter`: rows are agent slots (see
    :mod:`splice.envs.pettingzoo`).

    Args:
        envs: the env copies (one API, same agents and spaces).
        groups: see :class:`PettingZooEnvs`.
        max_agents: see :class:`PettingZooEnvs`.
    """

    dead_steps = True
    dead_step_restarts = False
    supports_partial_reset = False
    api = ""

    def __init__(
        self,
        envs: list[Any],
        groups: Mapping[str, Sequence[Any]] | None = None,
        max_agents: int | None = None,
    ) -> None:
        if not envs:
            raise ValueError("no PettingZoo env given")
        self.envs = envs
        self.env = envs[0]
        agents = list(getattr(envs[0], "possible_agents", None) or [])
        if not agents:
            raise EnvError(f"{type(envs[0]).__name__} has no possible_agents")
        for env in envs[1:]:
            if list(env.possible_agents) != agents:
                raise ValueError(
                    f"the env copies differ in possible_agents: {agents} vs "
                    f"{list(env.possible_agents)}"
                )
        #: The env's ``possible_agents``: ``("agent", "id")`` indexes this list.
        self.agent_names: list[Any] = agents
        self._index = {agent: i for i, agent in enumerate(agents)}
        #: The group names: ``("agent", "group")`` indexes this list.
        self.group_names, self.agent_group = _groups_of(agents, groups)
        self.single_observation_space = self._same_space("observation_space")
        self.single_action_space = self._same_space("action_space")
        per_env = len(agents) if max_agents is None else int(max_agents)
        self.num_envs = len(envs) * per_env
        self.batched = True
        self.autoreset_mode = f"PettingZoo {self.api} API"
        self._init_spaces()
        self.random_action_space = batch_space(self.single_action_space, self.num_envs)
        b = self.num_envs
        self.pool = SlotPool(b)
        #: Per slot, the agent (index) that acts in it at the next step, or -1: the agent
        #: leaf of :attr:`obs` (the policy's input), kept by the subclass.
        self._ids = np.full(b, -1, np.int64)
        self._groups = np.full(b, -1, np.int64)
        #: Per env copy, ``{agent: slot}`` of its agents.
        self._slot_of: list[dict[Any, int]] = [{} for _ in envs]
        self._agent_leaves = [
            Leaf(AGENT_ID, (), np.dtype(np.int64), spaces.Box(-1, len(agents) - 1, (), np.int64)),
            Leaf(
                AGENT_GROUP,
                (),
                np.dtype(np.int64),
                spaces.Box(-1, len(self.group_names) - 1, (), np.int64),
            ),
        ]
        self._mask_leaf = next(
            (i for i, leaf in enumerate(self.obs_leaves) if leaf.key == ("action_mask",)), None
        )
        self._checked: set[Any] = set()  # agents whose observation was checked

    def _same_space(self, which: str) -> spaces.Space[Any]:
        first = self.agent_names[0]
        space = getattr(self.env, which)(first)
        for agent in self.agent_names[1:]:
            other = getattr(self.env, which)(agent)
            if other != space:
                fix = "pad_observations_v0" if which == "observation_space" else ""
                fix = fix or "pad_action_space_v0"
                raise ValueError(
                    f"agents {first!r} and {agent!r} have different {which.replace('_', ' ')}s "
                    f"({space!r} vs {other!r}); the agents of one collector share one layout. "
                    f"Pad them to one (supersuit.{fix}) or give each kind of agent a collector "
                    "of its own"
                )
        return space

    # ------------------------------------------------------------------ leaves
    def select(self, *, exclude_keys: list[Key] | None = None, info_keys: Any = None) -> None:
        """As :meth:`EnvAdapter.select`; ``info_keys`` are not read from PettingZoo infos.

        Raises:
            ValueError: ``info_keys`` given.
        """
        if info_keys:
            raise ValueError(
                "info_keys are not supported with PettingZoo envs (per-agent infos are not "
                "stored); put what the policy needs in the observation"
            )
        super().select(exclude_keys=exclude_keys)
        self._mask_leaf = next(
            (i for i, leaf in enumerate(self.obs_leaves) if leaf.key == ("action_mask",)), None
        )

    @property
    def info_leaves(self) -> list[Leaf]:
        """The agent leaves, :data:`AGENT_ID` and :data:`AGENT_GROUP` (stored like info
        entries: the value entering each step and ``("next", ...)``)."""
        return self._agent_leaves

    @property
    def input_leaves(self) -> list[tuple[Key, Leaf]]:
        return [(("observation", *leaf.key), leaf) for leaf in self.obs_leaves] + [
            (leaf.key, leaf) for leaf in self._agent_leaves
        ]

    def bind(self, staging: StepTargets) -> None:
        super().bind(staging)
        self._next_id, self._next_group = staging.next_info[0], staging.next_info[1]

    # ------------------------------------------------------------------- slots
    def _join(self, e: int, agent: Any) -> int:
        """A slot for ``agent`` of env ``e``, starting a life."""
        index = self._index.get(agent)
        if index is None:
            raise EnvError(
                f"agent {agent!r} of env {e} is not one of its possible_agents {self.agent_names}"
            )
        slot = self.pool.take()
        self._slot_of[e][agent] = slot
        return slot

    def _acts(self, slot: int, agent: Any) -> None:
        """``agent`` acts in ``slot`` at the next step."""
        index = self._index[agent]
        self._ids[slot] = index
        self._groups[slot] = self.agent_group[index]

    def _leave(self, e: int, agent: Any) -> int:
        """``agent`` of env ``e``'s life ended: its slot is free."""
        slot = self._slot_of[e].pop(agent)
        self._ids[slot] = -1
        self._groups[slot] = -1
        self.pool.release(slot)
        return slot

    def _clear_slots(self) -> None:
        self.pool.clear()
        self._ids[:] = -1
        self._groups[:] = -1
        for slots in self._slot_of:
            slots.clear()

    # ------------------------------------------------------------------ writes
    def _values(self, agent: Any, obs: Any) -> list[Any]:
        """The leaves of one agent's observation (checked the first time it is seen)."""
        if agent not in self._checked:
            self._check_agent_obs(agent, obs)
        return self._flatten(obs)

    def _check_agent_obs(self, agent: Any, obs: Any) -> None:
        if obs is None:
            raise EnvError(f"the env gave no observation for agent {agent!r}")
        for leaf, value in zip(self.obs_leaves, self._flatten(obs), strict=True):
            shape = tuple(np.shape(value))
            if leaf.is_tensor and shape != leaf.shape:
                raise EnvError(
                    f"agent {agent!r}'s observation {('observation', *leaf.key)!r} has shape "
                    f"{list(shape)}; expected {list(leaf.shape)} from its observation space "
                    f"{self.single_observation_space!r}"
                )
        self._checked.add(agent)

    def _write_obs(self, c: int, slot: int, values: list[Any]) -> None:
        for arr, value in zip(self._next_obs, values, strict=True):
            arr[c, slot] = value

    def _entering(self, c: int | None, joins: list[tuple[int, list[Any]]]) -> None:
        """Set :attr:`obs`: the next observations written at column ``c`` (views), with the
        rows of the agents that start a life at the next step (``joins``) patched in (then
        copies: their column keeps what it holds, e.g. the final observation of the agent
        the slot held before)."""
        if c is None:
            b = self.num_envs
            values = [np.zeros((b, *leaf.shape), leaf.dtype) for leaf in self.obs_leaves]
        else:
            values = [arr[c] for arr in self._next_obs]
            if joins:
                values = [np.array(v) for v in values]
        for slot, leaves in joins:
            for arr, value in zip(values, leaves, strict=True):
                arr[slot] = value
        self.obs = [*values, self._ids, self._groups]

    # --------------------------------------------------------------- actions
    def slot_actions(self, actions: Mapping[Any, Any], env: int = 0) -> np.ndarray:
        """The ``[B]`` action array :meth:`step` takes, from one env copy's per-agent actions
        (PettingZoo's ``{agent: action}``): each agent's action in its slot, the other rows
        zero (ignored).

        Raises:
            ValueError: an agent that is not acting in that env now (dead, not joined yet,
                waiting for its turn, or unknown), or an acting agent left out.

        Examples:
            >>> import pettingzoo
            >>> from splice.envs import make_adapter
            >>> adapter = make_adapter(pettingzoo.make("aec", "classic/tictactoe-v3"))
            >>> adapter.reset(seed=0)
            >>> adapter.slot_actions({"player_1": 4})
            array([4, 0])
            >>> adapter.slot_actions({"player_2": 4})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: agent 'player_2' of env 0 is not acting now ...
        """
        acting = self.acting_agents(env)
        for agent in actions:
            if agent not in acting:
                raise ValueError(
                    f"agent {agent!r} of env {env} is not acting now (dead, not joined yet, "
                    f"waiting for its turn, or unknown); acting agents: {sorted(acting, key=str)}"
                )
        missing = [agent for agent in acting if agent not in actions]
        if missing:
            raise ValueError(f"no action for the acting agents {missing} of env {env}")
        out = np.zeros((self.num_envs, *self.act_leaf.shape), self.act_leaf.dtype)
        for agent, action in actions.items():
            out[acting[agent]] = action
        return out

    def acting_agents(self, env: int = 0) -> dict[Any, int]:
        """``{agent: slot}`` of the agents of env copy ``env`` that act at the next step."""
        return {agent: slot for agent, slot in self._slot_of[env].items() if self._ids[slot] >= 0}

    def action_sampler(self) -> Any:
        """Uniform random actions for every slot; where the observation has an
        ``"action_mask"`` leaf, each acting agent's action is drawn among the allowed ones (as
        ``action_space.sample(mask)`` does in a PettingZoo loop)."""
        sample = self.random_action_space.sample
        leaf = self._mask_leaf
        if leaf is None or not isinstance(self.single_action_space, spaces.Discrete):
            return sample
        start = int(self.single_action_space.start)

        def masked() -> np.ndarray:
            rng = self.random_action_space.np_random  # seed_actions() replaces it
            action = np.zeros(self.num_envs, np.int64)
            mask = np.asarray(self.obs[leaf])
            for slot in np.flatnonzero(self._ids >= 0):
                allowed = np.flatnonzero(mask[slot])
                if allowed.size:
                    action[slot] = start + allowed[rng.integers(allowed.size)]
            return action

        return masked

    def wrap_policy(self, policy: Any) -> Any:
        """The policy runs on the acting slots only (:class:`AgentSlotsPolicy`): per agent,
        the user's policy, or the entry of a :class:`~splice.envs.pettingzoo.PolicyMap`."""
        return AgentSlotsPolicy.for_agents(policy, self.agent_names, self.group_names,
                                           self.agent_group)  # fmt: skip

    def reset_envs(self, mask: np.ndarray) -> None:
        raise RuntimeError(
            f"{type(self).__name__} cannot reset some of its agent slots: a PettingZoo env "
            "ends its agents itself (use the env's own step limit, e.g. max_cycles)"
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()
