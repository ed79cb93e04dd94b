"""Policies: the protocol the collectors call, its error type, and a random policy.

**The protocol.** A policy is a callable that takes a :class:`tensordict.TensorDict` and returns
one (the same object or a new one) holding ``"action"``. The input holds the observation leaves
(``"observation"``, or nested keys for Dict/Tuple spaces), ``"is_init"`` (bool ``[..., 1]``,
True on the first step of an episode) and the recurrent state entering the step, if any. Its
batch shape is ``[B]`` for a vector env and ``[]`` for a single env. A
``tensordict.nn.TensorDictModule`` works as is. Every other key the policy writes at the root
(logits, log-probabilities, ...) is stored in the batch too.

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

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from tensordict import TensorDictBase

from splice.layout import ACTION

__all__ = ["Policy", "PolicyError", "RandomPolicy"]


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
        seed: seeds the space's sampler.

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
        self._seed = seed
        self.action_space.seed(seed)

    def _space_for(self, batch_shape: torch.Size) -> spaces.Space[Any]:
        if len(batch_shape) == 0:
            return self.action_space
        n = int(np.prod(batch_shape))
        if n not in self._batched:
            space = batch_space(self.action_space, n)
            space.seed(None if self._seed is None else self._seed + n)
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
