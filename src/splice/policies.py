"""Policies: what a collector accepts as a policy, the protocol it runs, and a random policy.

**What you can pass.** Every collector passes its ``policy`` argument through
:func:`as_policy`, which accepts:

* a ``tensordict.nn.TensorDictModule`` (or any ``TensorDictModuleBase``: TorchRL's actors,
  ``TensorDictSequential``, ``LSTMModule``...), used as is;
* a function or module taking a TensorDict and returning one (``def policy(td): ...``): its
  first parameter is named ``td`` or ``tensordict``, or is annotated as a TensorDict;
* a plain ``torch.nn.Module`` (or any other callable) mapping the observation tensor to the
  action, e.g. ``torch.nn.Linear(3, 1)`` on Pendulum. :class:`ModulePolicy` runs it. With
  ``as_policy(module, output="greedy")`` it maps observations to Q-values (the action is their
  argmax) and with ``output="sample"`` to logits (the action is sampled from their softmax,
  with torch's global RNG); ``in_keys=`` feeds it several entries, e.g. the leaves of a Dict
  observation; a module returning ``(output, state)`` is recurrent (see :class:`ModulePolicy`).

Anything else is a ``TypeError`` saying what is accepted. The action a policy returns is cast
to the action space's dtype when the cast keeps its kind (float64 to a float32 Box, int32 to
int64 for Discrete, int or bool to MultiBinary's int8); any other dtype, or a wrong shape, is a
:class:`PolicyError` naming the output, its dtype and shape, and the space's.

**The protocol.** A policy in the protocol is a callable that takes a
:class:`tensordict.TensorDict` and returns one (the same object or a new one) holding
``"action"``. The input holds the observation leaves (``"observation"``, or nested keys for
Dict/Tuple spaces), the requested info entries (``Collector(info_keys=...)``, e.g.
``"action_mask"``), ``"is_init"`` (bool ``[..., 1]``, True on the first step of an episode)
and the recurrent state entering the step, if any. Its batch shape is ``[B]`` for a vector env
and ``[]`` for a single env. Every other key the policy writes at the root (logits,
log-probabilities, ...) is stored in the batch too. Non-tensor observations (text) are in the
input as tensordict non-tensor entries.

**Recurrent state.** Whatever the policy writes under ``("next", key)`` is recurrent state
(TorchRL's ``LSTMModule``/``GRUModule`` convention). The collector discovers these keys from the
first call — no primer or spec is needed — then, at every step, feeds ``key`` back at the root,
zeroed where ``is_init`` is True, and stores both the state entering each step (``key``) and
the state it produced (``("next", key)``) in the batch. On the first call the state keys are
absent: the policy must start from zeros (TorchRL's modules do).

A minimal GRU policy:

Examples:
    >>> import gymnasium as gym
    >>> import torch
    >>> from splice import Collector
    >>> class GRUPolicy(torch.nn.Module):
    ...     def __init__(self, obs_dim: int, n_actions: int, hidden: int = 8) -> None:
    ...         super().__init__()
    ...         self.cell = torch.nn.GRUCell(obs_dim, hidden)
    ...         self.head = torch.nn.Linear(hidden, n_actions)
    ...         self.hidden = hidden
    ...
    ...     def forward(self, td):
    ...         h = td.get("hidden", None)  # absent on the very first call
    ...         if h is None:
    ...             h = torch.zeros(*td.batch_size, self.hidden)
    ...         h = self.cell(td["observation"], h)
    ...         td["action"] = self.head(h).argmax(-1)
    ...         td["next", "hidden"] = h  # carried to "hidden" at the next step
    ...         return td
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    >>> collector = Collector(env, GRUPolicy(4, 2), frames_per_batch=20, total_frames=20, seed=0)
    >>> batch = next(iter(collector))
    >>> batch["hidden"].shape, batch["next", "hidden"].shape
    (torch.Size([2, 10, 8]), torch.Size([2, 10, 8]))
    >>> bool((batch["hidden"][batch["is_init"].squeeze(-1)] == 0).all())  # zero at episode starts
    True
    >>> collector.shutdown()
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from splice._rng import seed_from_torch
from splice.layout import ACTION, NEXT, OBSERVATION, as_key_tuple

__all__ = ["ModulePolicy", "Policy", "PolicyError", "RandomPolicy", "as_policy"]

Key = tuple[str, ...]
Output = Literal["action", "greedy", "sample"]
#: The key of the recurrent state of a :class:`ModulePolicy` (a tuple state nests "0", "1"...).
RECURRENT_STATE = "recurrent_state"


@runtime_checkable
class Policy(Protocol):
    """Anything callable as ``policy(td) -> td`` that writes ``"action"`` (see the module doc)."""

    def __call__(self, tensordict: TensorDictBase, /) -> TensorDictBase: ...


class PolicyError(ValueError):
    """A policy returned something the collector cannot store: the message names the key."""


class RandomPolicy:
    """Uniform random actions from a gymnasium action space, as a TensorDict policy.

    The collector does not need it (``policy=None`` samples from the env's action space
    directly, without TensorDicts); it is the same behaviour in the policy protocol, e.g. for
    ``init_random_frames``-style exploration in your own loops.

    Args:
        action_space: the action space of ONE env.
        seed: seeds the space's sampler; without it, the seed is drawn from torch's global
            RNG (``torch.manual_seed`` reproduces the actions).

    Examples:
        >>> from gymnasium import spaces
        >>> from tensordict import TensorDict
        >>> policy = RandomPolicy(spaces.Discrete(3), seed=0)
        >>> policy(TensorDict({}, batch_size=[4]))["action"].shape
        torch.Size([4])
    """

    def __init__(self, action_space: spaces.Space[Any], seed: int | None = None) -> None:
        self.action_space = action_space
        self._batched: dict[int, spaces.Space[Any]] = {}
        self._seed = seed_from_torch() if seed is None else seed
        self.action_space.seed(self._seed)

    def _space_for(self, batch_shape: torch.Size) -> spaces.Space[Any]:
        if len(batch_shape) == 0:
            return self.action_space
        n = int(np.prod(batch_shape))
        if n not in self._batched:
            space = batch_space(self.action_space, n)
            space.seed(self._seed + n)
            self._batched[n] = space
        return self._batched[n]

    def __call__(self, tensordict: TensorDictBase) -> TensorDictBase:
        batch_shape = tensordict.batch_size
        sample = np.asarray(self._space_for(batch_shape).sample())
        action = torch.as_tensor(sample)
        if len(batch_shape) > 1:
            action = action.reshape(*batch_shape, *action.shape[1:])
        tensordict.set(ACTION, action)
        return tensordict


class ModulePolicy:
    """A plain module (or any callable) on tensors, run in the policy protocol.

    Each step it calls ``module(*inputs)`` with one tensor per ``in_keys`` entry, always with a
    leading batch dim (``[B, ...]``; ``B = 1`` for a single env), and turns what it returns
    into the action:

    * ``output="action"``: the return value is the action (``[B, *action_shape]``), cast to
      the action space's dtype by the collector (see :mod:`splice.policies`);
    * ``output="greedy"``: it is ``[B, n]`` Q-values (or logits) for ``Discrete(n)``; the
      action is the argmax, the values are stored as ``"action_value"``;
    * ``output="sample"``: it is ``[B, n]`` logits; the action is sampled from their softmax
      with torch's global RNG, the logits are stored as ``"logits"`` and the log-probability of
      the action as ``"action_log_prob"``.

    **Recurrent modules.** A module that returns a pair ``(output, state)`` is recurrent: it
    is first called as ``module(*inputs)`` (no state: start from zeros, as ``nn.GRU``/``nn.LSTM``
    do with ``hx=None``), then as ``module(*inputs, state)`` with the state it returned at the
    previous step, zeroed for the envs whose episode starts. ``state`` is a tensor or a tuple
    of tensors (``nn.LSTM``'s ``(h, c)``) in torch's RNN layout ``[num_layers, B, hidden]``
    (batch dim 1), so ``out, state = self.gru(obs.unsqueeze(1), state)`` with
    ``batch_first=True`` works unchanged. The batch stores it batch-first,
    ``[..., num_layers, hidden]``, at ``"recurrent_state"`` (a tuple state at
    ``("recurrent_state", "0")``, ``("recurrent_state", "1")``, ...): the state entering each
    step there, the one it produced at ``("next", "recurrent_state")``.

    Args:
        module: the module or callable.
        in_keys: the step entries to pass, in order (default: ``["observation"]``); e.g.
            ``[("observation", "image"), ("observation", "direction")]`` for a Dict
            observation, or ``["observation", "action_mask"]`` with
            ``Collector(info_keys=["action_mask"])``.
        output: ``"action"``, ``"greedy"`` or ``"sample"`` (see above).

    Attributes:
        module: the wrapped module (its weights are the collector's policy weights).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> policy = ModulePolicy(torch.nn.Linear(4, 2), output="greedy")
        >>> td = policy(TensorDict({"observation": torch.ones(3, 4)}, batch_size=[3]))
        >>> td["action"].shape, td["action_value"].shape
        (torch.Size([3]), torch.Size([3, 2]))

        A recurrent module:

        >>> class GRUNet(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.gru = torch.nn.GRU(4, 8, batch_first=True)
        ...         self.head = torch.nn.Linear(8, 2)
        ...
        ...     def forward(self, obs, state=None):
        ...         out, state = self.gru(obs.unsqueeze(1), state)
        ...         return self.head(out[:, 0]), state
        >>> policy = ModulePolicy(GRUNet(), output="sample")
        >>> td = policy(TensorDict({"observation": torch.ones(3, 4)}, batch_size=[3]))
        >>> td["next", "recurrent_state"].shape  # batch-first: [B, num_layers, hidden]
        torch.Size([3, 1, 8])
    """

    def __init__(
        self,
        module: Callable[..., Any],
        *,
        in_keys: Sequence[NestedKey] | None = None,
        output: Output = "action",
    ) -> None:
        if not callable(module):
            raise TypeError(f"ModulePolicy needs a callable module, got {type(module).__name__}")
        if output not in ("action", "greedy", "sample"):
            raise ValueError(f"output must be 'action', 'greedy' or 'sample', got {output!r}")
        if in_keys is not None and (isinstance(in_keys, str | tuple) or not in_keys):
            raise TypeError(
                f"in_keys must be a non-empty list of keys, got {in_keys!r}; e.g. "
                "in_keys=[('observation', 'image')]"
            )
        self.module = module
        self.in_keys: list[Key] = [as_key_tuple(k) for k in (in_keys or [OBSERVATION])]
        self.output = output
        #: ``None`` until the first call, then whether the module returned ``(output, state)``.
        self.recurrent: bool | None = None
        self._state_keys: list[Key] = []

    def __repr__(self) -> str:
        return f"ModulePolicy({self.module!r}, in_keys={self.in_keys!r}, output={self.output!r})"

    def _inputs(self, td: TensorDictBase, batched: bool) -> list[torch.Tensor]:
        inputs = []
        for key in self.in_keys:
            value = td.get(key, None)
            if value is None:
                raise PolicyError(
                    f"policy input {key!r} is not in the step; its entries are "
                    f"{sorted(as_key_tuple(k) for k in td.keys(True, True))}. Pass "
                    "as_policy(module, in_keys=[...]) with some of them"
                )
            if not isinstance(value, torch.Tensor):
                raise PolicyError(
                    f"policy input {key!r} is not a tensor but {type(value).__name__} (a Dict "
                    "observation, or text); name its tensor leaves in "
                    f"as_policy(module, in_keys=[...]), e.g. {_leaf_keys(value, key)}"
                )
            inputs.append(value if batched else value.unsqueeze(0))
        return inputs

    def _state_in(self, td: TensorDictBase, batched: bool, batch: int) -> Any:
        """The state entering the step in the module's layout, or None (start from zeros)."""
        stored = [td.get(key, None) for key in self._state_keys]
        if not stored or any(s is None for s in stored):
            return None
        states = [(s if batched else s.unsqueeze(0)).transpose(0, 1).contiguous() for s in stored]
        return states[0] if self._state_keys == [(RECURRENT_STATE,)] else tuple(states)

    def _store_state(self, td: TensorDictBase, state: Any, batched: bool, batch: int) -> None:
        parts = [state] if isinstance(state, torch.Tensor) else list(state)
        if not self._state_keys:
            self._state_keys = (
                [(RECURRENT_STATE,)]
                if isinstance(state, torch.Tensor)
                else [(RECURRENT_STATE, str(i)) for i in range(len(parts))]
            )
        for key, part in zip(self._state_keys, parts, strict=True):
            if not isinstance(part, torch.Tensor) or part.dim() < 2 or part.shape[1] != batch:
                raise PolicyError(
                    f"the recurrent module returned state {key!r} of shape "
                    f"{list(getattr(part, 'shape', []))}; the convention is torch's RNN layout "
                    f"[num_layers, B, hidden] with B = {batch} (see ModulePolicy)"
                )
            stored = part.transpose(0, 1)
            td.set((NEXT, *key), stored if batched else stored.squeeze(0))

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        batched = td.batch_dims > 0
        inputs = self._inputs(td, batched)
        batch = inputs[0].shape[0]
        if self.recurrent:
            state = self._state_in(td, batched, batch)
            out = self.module(*inputs) if state is None else self.module(*inputs, state)
        else:
            out = self.module(*inputs)
        if self.recurrent is None:
            self.recurrent = isinstance(out, tuple) and len(out) == 2
        if self.recurrent:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise PolicyError(
                    "the recurrent module returned "
                    f"{type(out).__name__}; it must return (output, state) at every call"
                )
            out, state = out
            self._store_state(td, state, batched, batch)
        out = torch.as_tensor(out)
        if self.output == "action":
            action = out
        else:
            if out.dim() != 2 or out.shape[0] != batch:
                raise PolicyError(
                    f"with output={self.output!r} the module must return [B, n] scores for a "
                    f"Discrete(n) action space (B = {batch}); it returned shape {list(out.shape)}"
                )
            if self.output == "greedy":
                action = out.argmax(-1)
                td.set("action_value", out if batched else out[0])
            else:
                log_probs = out.log_softmax(-1)
                action = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
                td.set("logits", out if batched else out[0])
                chosen = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
                td.set("action_log_prob", chosen if batched else chosen[0])
        td.set(ACTION, action if batched else action[0])
        return td


def _leaf_keys(value: Any, key: Key) -> list[Key]:
    if isinstance(value, TensorDictBase):
        return [(*key, *as_key_tuple(k)) for k in value.keys(True, True)][:4]
    return [key]


_TD_PARAM_NAMES = frozenset({"td", "tensordict"})


def _takes_tensordict(policy: Callable[..., Any]) -> bool:
    """Whether ``policy`` is written for TensorDicts: its first parameter is named ``td`` or
    ``tensordict``, or annotated as a TensorDict (or the signature cannot be read)."""
    fn = policy.forward if isinstance(policy, torch.nn.Module) else policy
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    if not params or params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return True
    first = params[0]
    if first.name in _TD_PARAM_NAMES:
        return True
    annotation = first.annotation
    if isinstance(annotation, str):
        return "TensorDict" in annotation
    return isinstance(annotation, type) and issubclass(annotation, TensorDictBase)


def as_policy(
    policy: Any,
    *,
    in_keys: Sequence[NestedKey] | None = None,
    output: Output | None = None,
) -> Any:
    """The policy protocol's form of what a user passes as ``policy``; every collector calls it.

    * ``None`` stays ``None`` (uniform random actions);
    * a ``TensorDictModuleBase``, a :class:`ModulePolicy`, or a callable written for
      TensorDicts (first parameter named ``td``/``tensordict`` or annotated as a TensorDict) is
      returned as is;
    * any other ``nn.Module`` or callable (or any callable when ``in_keys``/``output`` is given)
      becomes ``ModulePolicy(policy, in_keys=in_keys, output=output or "action")``.

    Args:
        policy: what the user passed.
        in_keys: see :class:`ModulePolicy`.
        output: see :class:`ModulePolicy`.

    Raises:
        TypeError: ``policy`` is not callable (the message lists what is accepted).
        ValueError: ``in_keys``/``output`` given with a policy that declares its own keys.

    Examples:
        >>> import torch
        >>> as_policy(torch.nn.Linear(3, 1))  # doctest: +ELLIPSIS
        ModulePolicy(Linear(...), in_keys=[('observation',)], output='action')
        >>> def my_policy(td):
        ...     return td.set("action", td["observation"].argmax(-1))
        >>> as_policy(my_policy) is my_policy
        True
        >>> as_policy("greedy")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: policy must be one of: a tensordict.nn.TensorDictModule ...; got str
    """
    wrap = in_keys is not None or output is not None
    if policy is None:
        if wrap:
            raise ValueError("in_keys/output need a policy module; got policy=None")
        return None
    if isinstance(policy, ModulePolicy | TensorDictModuleBase):
        if wrap:
            raise ValueError(
                f"in_keys/output apply to a plain module; {type(policy).__name__} declares its "
                "own keys"
            )
        return policy
    if not callable(policy):
        raise TypeError(
            "policy must be one of: a tensordict.nn.TensorDictModule (or any "
            "TensorDictModuleBase), a function or module taking and returning a TensorDict "
            "(first parameter named td or tensordict), a torch.nn.Module or callable mapping the "
            "observation tensor to the action (see splice.policies.as_policy), or None for "
            f"random actions; got {type(policy).__name__}"
        )
    if not wrap and _takes_tensordict(policy):
        return policy
    return ModulePolicy(policy, in_keys=in_keys, output=output or "action")
