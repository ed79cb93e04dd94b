"""PettingZoo environments (parallel and AEC APIs): one trajectory per agent life.

``pip install 'splice-rl[multiagent]'``. Any collector takes a PettingZoo env, a list of env
copies, or :class:`PettingZooEnvs` (copies made from a factory; picklable, so it also goes to
worker processes and Ray actors) in place of a gymnasium env.

**Layout: rows are agent slots.** A batch is ``[S, T]`` like a vector env's ``[B, T]``, where
the ``S`` rows are *agent slots* (``num_envs * len(possible_agents)`` by default): every
step of a row is one step of one agent, and an agent's life in an episode is one trajectory,
in one row, with its own id (``("collector", "traj_ids")``, from the same id spaces as every
collector). So the data contract holds per agent: ``is_init`` at an agent's first step,
``terminated``/``truncated`` as the env says at its last, the env's end ends every live
agent's trajectory (an agent still listed without a flag is ``truncated``), and a batch's
cut marks every live agent's. Each step also stores its agent:

* ``("agent", "id")``: the agent's index in ``possible_agents``
  (:attr:`~AgentSlotsAdapter.agent_names`), int64;
* ``("agent", "group")``: its group's index in :attr:`~AgentSlotsAdapter.group_names`
  (default groups: the agent name without its ``_N`` suffix, see :func:`default_group`);

both at the step and under ``("next", ...)`` (the same value), like info entries.

*Why not TorchRL's group layout* (``(group, "observation")`` with an agent dim, ``[B, T,
n_agents, ...]``): it needs every agent of a group present at every step. Agents that die,
join, or wait for their turn would leave holes (masked steps) inside rows, and every
downstream piece (splitting, slicing, value targets, recurrent state) would need the mask.
One agent per row keeps the single-agent contract, so everything downstream works per agent
trajectory unchanged; the price is that a step of one agent does not sit next to the other
agents' steps of the same env step (join on ``("agent", "id")`` and the env copy if a
centralised critic needs them).

**Dead steps.** Staging columns are env steps. A slot's column is *dead* (never in the data,
as gymnasium's NEXT_STEP reset step) when the slot holds no agent, and, in AEC envs, when
another agent takes its turn: an agent's step runs from its action to its next observation
(see :mod:`splice.envs.pettingzoo.aec`). A joining agent takes the free slot that has held
the fewest steps, so rows fill evenly.

**Policy.** The policy runs on the acting slots only (no call for dead rows; their outputs
are zero and their recurrent state is carried over unchanged, so an AEC agent's state
survives the other agents' turns; it is zeroed at the agent's first step, ``is_init``). Its
input holds ``("agent", "id")`` and ``("agent", "group")``; one policy for all agents
(parameter sharing), or a :class:`PolicyMap` with one per group or agent. Random actions
(``policy=None``) respect an ``"action_mask"`` observation leaf.

Examples:
    >>> from mpe2 import simple_spread_v3
    >>> from splice import Collector
    >>> envs = PettingZooEnvs(lambda: simple_spread_v3.parallel_env(max_cycles=10), num_envs=2)
    >>> collector = Collector(envs, frames_per_batch=60, total_frames=60, seed=0)
    >>> batch = next(iter(collector))
    >>> batch.batch_size  # 2 envs x 3 agents, 10 steps each
    torch.Size([6, 10])
    >>> sorted(batch["agent", "id"].unique().tolist())
    [0, 1, 2]
    >>> collector.shutdown()
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from splice.envs.pettingzoo._policy import PolicyMap
from splice.envs.pettingzoo._slots import (
    AGENT_GROUP,
    AGENT_ID,
    AgentSlotsAdapter,
    PettingZooEnvs,
    default_group,
)
from splice.envs.pettingzoo.aec import AECAgentsAdapter
from splice.envs.pettingzoo.parallel import ParallelAgentsAdapter

__all__ = [
    "AGENT_GROUP",
    "AGENT_ID",
    "PettingZooEnvs",
    "PolicyMap",
    "default_group",
]


def _apis() -> tuple[type, type] | None:
    """PettingZoo's ``(ParallelEnv, AECEnv)``, or None if PettingZoo is not installed."""
    if "pettingzoo" not in sys.modules and importlib.util.find_spec("pettingzoo") is None:
        return None
    from pettingzoo import AECEnv, ParallelEnv

    return ParallelEnv, AECEnv


def is_pettingzoo(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo env, a non-empty list of them, or a
    :class:`PettingZooEnvs`.

    Examples:
        >>> import pettingzoo
        >>> rps = pettingzoo.make("aec", "classic/rps-v2")
        >>> is_pettingzoo(rps), is_pettingzoo([rps]), is_pettingzoo(3)
        (True, True, False)
    """
    if isinstance(env, PettingZooEnvs):
        return True
    apis = _apis()
    if apis is None:
        return False
    if isinstance(env, list | tuple):
        return bool(env) and all(isinstance(e, apis) for e in env)
    return isinstance(env, apis)


def make_agents_adapter(env: Any) -> AgentSlotsAdapter:
    """The agent-slots adapter of a PettingZoo env, a list of copies, or
    :class:`PettingZooEnvs`.

    Raises:
        TypeError: none of these, or copies mixing the two APIs.
        ValueError: copies with different agents, or agents with different spaces.

    Examples:
        >>> import pettingzoo
        >>> copies = [pettingzoo.make("aec", "classic/rps-v2") for _ in range(2)]
        >>> type(make_agents_adapter(copies)).__name__
        'AECAgentsAdapter'
    """
    groups = max_agents = None
    if isinstance(env, PettingZooEnvs):
        groups, max_agents = env.groups, env.max_agents
        envs = env.make()
    elif isinstance(env, list | tuple):
        envs = list(env)
    else:
        envs = [env]
    apis = _apis()
    if apis is None or not envs:
        raise TypeError(f"not a PettingZoo env: {type(env).__name__}")
    parallel, aec = apis
    if all(isinstance(e, parallel) for e in envs):
        return ParallelAgentsAdapter(envs, groups, max_agents)
    if all(isinstance(e, aec) for e in envs):
        return AECAgentsAdapter(envs, groups, max_agents)
    raise TypeError(
        "the PettingZoo env copies must all be ParallelEnv or all AECEnv; got "
        f"{sorted({type(e).__name__ for e in envs})}"
    )
