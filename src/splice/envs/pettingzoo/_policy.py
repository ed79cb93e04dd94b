"""The policy of agent slots: the user's policy (or one per agent group) run on the rows of
the agents that act, the other rows' recurrent state held.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> def double(td):
    ...     td["action"] = td["observation"] * 2
    ...     return td
    >>> policy = AgentSlotsPolicy.for_agents(double, ["a_0", "a_1"], ["a"], np.zeros(2, np.int64))
    >>> td = TensorDict(
    ...     {"observation": torch.tensor([1, 2, 3]), "agent": {"id": torch.tensor([0, -1, 1])}},
    ...     batch_size=[3],
    ... )
    >>> policy(td)["action"]  # row 1 acts for no agent: not computed
    tensor([2, 0, 6])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from splice.layout import NEXT, as_key_tuple
from splice.policies import ModulePolicy, PolicyError, as_policy

__all__ = ["AgentSlotsPolicy", "PolicyMap"]

Key = tuple[str, ...]
_AGENT_ID = ("agent", "id")


class PolicyMap(torch.nn.Module):
    """One policy per agent group (or per agent), for a collector over PettingZoo envs.

    Each agent runs the entry named after it, else the entry of its group
    (:attr:`~splice.envs.pettingzoo.AgentSlotsAdapter.group_names`); the collector refuses a
    map that leaves an agent without one. Entries take what ``policy=`` takes
    (:func:`splice.policies.as_policy`), and all must write the same keys with the same
    shapes (the agents' steps share one batch). It is an ``nn.Module`` holding the entries'
    modules, so weights reach worker processes as for one policy.

    Args:
        policies: ``{group or agent name: policy}``.

    Raises:
        ValueError: an empty map.
        TypeError: a name that is not a str, or an entry ``as_policy`` refuses.

    Examples:
        >>> import torch
        >>> pm = PolicyMap({"adversary": torch.nn.Linear(8, 5), "agent": torch.nn.Linear(8, 5)})
        >>> sorted(pm.policies), sum(p.numel() for p in pm.parameters())
        (['adversary', 'agent'], 90)
    """

    def __init__(self, policies: Mapping[str, Any]) -> None:
        super().__init__()
        if not isinstance(policies, Mapping) or not policies:
            raise ValueError("PolicyMap needs a non-empty mapping {group or agent name: policy}")
        self.policies: dict[str, Any] = {}
        modules = {}
        for name, policy in policies.items():
            if not isinstance(name, str):
                raise TypeError(f"PolicyMap names must be str, got {name!r}")
            wrapped = as_policy(policy)
            if wrapped is None:
                raise TypeError(f"PolicyMap entry {name!r} is None; give every entry a policy")
            self.policies[name] = wrapped
            module = wrapped.module if isinstance(wrapped, ModulePolicy) else wrapped
            if isinstance(module, torch.nn.Module):
                modules[name.replace(".", "_")] = module
        self.entries = torch.nn.ModuleDict(modules)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        raise RuntimeError(
            "a PolicyMap runs inside a collector over PettingZoo envs, which picks each "
            "agent's entry; call an entry of .policies directly"
        )


class AgentSlotsPolicy:
    """Runs each acting row (``("agent", "id") >= 0``) through its agent's policy; rows with
    no acting agent are not computed: their outputs are zero and their recurrent state
    (``("next", key)``) is the state they entered with, so an agent's state is carried over
    the steps in which it does not act (another agent's turn).

    Build it with :meth:`for_agents`. Rows that share a policy are run in one call.
    """

    def __init__(self, policies: list[Any], policy_of_agent: np.ndarray) -> None:
        self.policies = policies
        self._of_agent = np.append(policy_of_agent, -1)  # agent id -1: no agent acting
        self._keys: list[Key] | None = None  # the outputs, once seen
        self._inputs: tuple[Any, list[tuple[Key, torch.Tensor]]] | None = None
        self._checked: set[int] = set()  # the policies whose output keys were checked
        self._buffers: dict[Key, torch.Tensor] = {}

    @classmethod
    def for_agents(
        cls,
        policy: Any,
        agents: Sequence[Any],
        groups: Sequence[str],
        agent_group: np.ndarray,
    ) -> AgentSlotsPolicy:
        """The policy of each agent: ``policy`` for all, or a :class:`PolicyMap`'s entries.

        Raises:
            ValueError: the map has no entry for an agent (by its name or its group's).
        """
        if not isinstance(policy, PolicyMap):
            return cls([policy], np.zeros(len(agents), np.int64))
        names = list(policy.policies)
        of_agent = np.empty(len(agents), np.int64)
        for i, agent in enumerate(agents):
            group = groups[agent_group[i]]
            name = str(agent) if str(agent) in policy.policies else group
            if name not in policy.policies:
                raise ValueError(
                    f"the PolicyMap has no policy for agent {agent!r} (group {group!r}); its "
                    f"entries: {names}. Name each group (or agent) of the env: {list(groups)}"
                )
            of_agent[i] = names.index(name)
        return cls([policy.policies[n] for n in names], of_agent)

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        which = self._of_agent[td.get(_AGENT_ID).cpu().numpy().reshape(-1)]
        if len(self.policies) == 1 and not (which < 0).any():  # nothing to gather
            if self._keys is not None:
                return self.policies[0](td)
            before = {as_key_tuple(key) for key in td.keys(True, True)}
            out = self.policies[0](td)
            self._keys = sorted({as_key_tuple(k) for k in out.keys(True, True)} - before)
            return out
        inputs = self._input_leaves(td)
        keys = {key for key, _ in inputs}
        ran = False
        for k, policy in enumerate(self.policies):
            rows = np.flatnonzero(which == k)
            if not rows.size and (ran or k < len(self.policies) - 1):
                continue  # (an empty call only if no row acts at all: to learn the outputs)
            ran = True
            at = torch.from_numpy(rows).to(td.device) if td.device else torch.from_numpy(rows)
            out = policy(_rows_of(inputs, at))
            if k not in self._checked:  # the keys a policy writes: checked at its first call
                produced = sorted({as_key_tuple(key) for key in out.keys(True, True)} - keys)
                if self._keys is None:
                    self._keys = produced
                elif produced != self._keys:
                    raise PolicyError(
                        f"the policies of a PolicyMap write different keys: policy {k} wrote "
                        f"{produced}, another {self._keys}; the agents' steps share one batch, "
                        "so every policy must write the same keys"
                    )
                self._checked.add(k)
            for key in self._keys or []:
                value = out.get(key)
                if isinstance(value, torch.Tensor):
                    self._buffer(td, key, value)[at] = value
        for key in self._keys or []:
            if key in self._buffers:
                td.set(key, self._buffers[key])
        return td

    def _input_leaves(self, td: TensorDictBase) -> list[tuple[Key, torch.Tensor]]:
        """The step's input leaves (the step TensorDict also holds the last call's outputs).
        The collector's step TensorDict keeps its tensors from step to step (it writes each
        step's values into them), so they are looked up again only when its keys change
        (the recurrent state joins after the first call) or it is another TensorDict."""
        root = (id(td), tuple(td.keys()))
        if self._inputs is None or self._inputs[0] != root:
            leaves = {as_key_tuple(key) for key in td.keys(True, True)}
            keys = sorted(leaves - set(self._keys or []))
            values = [(key, td.get(key)) for key in keys]
            self._inputs = (root, [(k, v) for k, v in values if isinstance(v, torch.Tensor)])
        self._prepared: set[Key] = set()
        return self._inputs[1]

    def _buffer(self, td: TensorDictBase, key: Key, value: torch.Tensor) -> torch.Tensor:
        """The whole-batch output of ``key`` for this call: zeros, or for a recurrent state
        (``("next", k)`` with ``k`` an input) the state each row entered with."""
        buf = self._buffers.get(key)
        if key in self._prepared:
            assert buf is not None
            return buf
        self._prepared.add(key)
        b = td.batch_size[0]
        if buf is None or buf.shape[1:] != value.shape[1:] or buf.dtype != value.dtype:
            buf = torch.zeros((b, *value.shape[1:]), dtype=value.dtype, device=value.device)
            self._buffers[key] = buf
        if key[0] == NEXT:
            entering = td.get(key[1:], None)
            if entering is None:
                buf.zero_()
            else:
                buf.copy_(entering)
        return buf


def _rows_of(leaves: list[tuple[Key, torch.Tensor]], rows: torch.Tensor) -> TensorDictBase:
    """The ``rows`` of the ``leaves``: one ``index_select`` per leaf, nested by key (a
    TensorDict built in one go, without per-entry checks)."""
    nested: dict[str, Any] = {}
    for key, value in leaves:
        node = nested
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value.index_select(0, rows)
    return TensorDict._new_unsafe(nested, batch_size=torch.Size([rows.numel()]))
