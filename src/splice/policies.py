"""Policies: the protocol, a random policy, and how the collector runs a policy step by step.

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

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from splice.envs.spaces import Leaf, check_action_dtype
from splice.layout import ACTION, IS_INIT, NEXT, tensor_leaves

__all__ = ["Policy", "PolicyError", "PolicyRunner", "RandomPolicy"]

Key = tuple[str, ...]


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


def _leaf_items(td: TensorDictBase) -> list[tuple[Key, torch.Tensor]]:
    return list(tensor_leaves(td, context="a policy's output", error=PolicyError))


def _numpy_dtype(key: Key, dtype: torch.dtype) -> np.dtype:
    try:
        return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    except TypeError:
        raise PolicyError(
            f"policy output {key!r} has dtype {dtype}, which has no numpy equivalent; cast it "
            "(e.g. to float32) inside the policy"
        ) from None


class PolicyRunner:
    """Runs a TensorDict policy inside the collector loop without building a TensorDict per step.

    It owns ONE step TensorDict whose entries are torch views of numpy buffers: each step
    copies the current observation, ``is_init`` and recurrent state into those buffers, calls
    the policy, and writes the action, the other outputs and the state into the collector's
    time-major staging arrays ``[C, B, ...]`` at column ``c``.

    Args:
        policy: the policy (see the module docstring).
        obs_leaves: the observation leaves of ONE env, with keys below ``"observation"``.
        action_leaf: the action leaf of ONE env.
        num_envs: ``B``.
        batched: False for a single env: the step TensorDict is unbatched (``[]``).
        allocate: ``allocate(key, per_env_shape, dtype)`` returns a staging array
            ``[C, B, *per_env_shape]`` the collector owns (called when outputs are discovered).
        device: where the policy runs (``None``: CPU, no copies).

    Examples:
        >>> import numpy as np, torch
        >>> from gymnasium import spaces
        >>> from splice.envs.spaces import action_leaf, observation_leaves
        >>> staged = {}
        >>> def allocate(key, shape, dtype):
        ...     staged[key] = np.zeros((5, 2, *shape), dtype)
        ...     return staged[key]
        >>> def policy(td):
        ...     td["action"] = (td["observation"][..., 0] > 0).long()
        ...     return td
        >>> runner = PolicyRunner(
        ...     policy,
        ...     observation_leaves(spaces.Box(-1, 1, (3,))),
        ...     action_leaf(spaces.Discrete(2)),
        ...     num_envs=2,
        ...     batched=True,
        ...     allocate=allocate,
        ... )
        >>> obs = np.array([[0.5, 0, 0], [-0.5, 0, 0]], np.float32)
        >>> runner.step([obs], np.array([True, True]), 0)
        array([1, 0])
        >>> staged[("action",)][0]
        array([1, 0])
    """

    def __init__(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        obs_leaves: list[Leaf],
        action_leaf: Leaf,
        *,
        num_envs: int,
        batched: bool,
        allocate: Callable[[Key, tuple[int, ...], np.dtype], np.ndarray],
        device: torch.device | str | None = None,
    ) -> None:
        self.policy = policy
        self.action_leaf = action_leaf
        self.num_envs = num_envs
        self.batch_shape: tuple[int, ...] = (num_envs,) if batched else ()
        self._allocate = allocate
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cpu":
            self.device = None
        self._obs_keys: list[Key] = [("observation", *leaf.key) for leaf in obs_leaves]
        self._obs_bufs = [
            np.zeros((*self.batch_shape, *leaf.shape), leaf.dtype) for leaf in obs_leaves
        ]
        self._init_buf = np.zeros((*self.batch_shape, 1), np.bool_)
        self._init_flat = self._init_buf.reshape(-1)
        entries: dict[NestedKey, torch.Tensor] = {
            key: torch.from_numpy(buf)
            for key, buf in zip(self._obs_keys, self._obs_bufs, strict=True)
        }
        entries[IS_INIT] = torch.from_numpy(self._init_buf)
        self.step_td = TensorDict(entries, batch_size=self.batch_shape)
        self._input_keys: set[Key] = {*self._obs_keys, (IS_INIT,)}
        self.discovered = False
        #: Root keys the policy writes (other than the state), with their staging arrays.
        self.outputs: list[tuple[Key, np.ndarray]] = []
        #: Recurrent state keys (root names), their step buffers and staging arrays.
        self.state_keys: list[Key] = []
        self._state_bufs: list[np.ndarray] = []
        self._state_stage: list[np.ndarray] = []
        self._next_state_stage: list[np.ndarray] = []
        self._action_stage: np.ndarray | None = None
        self._check_pending = False

    # ---------------------------------------------------------------- discovery
    def _discover(self, out: TensorDictBase) -> None:
        """Learn the policy's output and state keys from its first output; allocate staging."""
        if not isinstance(out, TensorDictBase):
            raise PolicyError(
                f"the policy returned {type(out).__name__}; it must return a TensorDict holding "
                "'action'"
            )
        if tuple(out.batch_size) != self.batch_shape:
            raise PolicyError(
                f"the policy returned a TensorDict of batch shape {list(out.batch_size)}; "
                f"expected {list(self.batch_shape)} (the step's batch shape)"
            )
        items = _leaf_items(out)
        keys = {key for key, _ in items}
        if (ACTION,) not in keys:
            raise PolicyError(
                "the policy returned no 'action' entry; it must write td['action'] "
                f"(keys returned: {sorted(keys)})"
            )
        outputs, states = [], []
        for key, value in items:
            if key in self._input_keys:
                continue
            if key[0] == NEXT:
                states.append((key[1:], value))
            else:
                outputs.append((key, value))
        for key, value in outputs + states:
            if tuple(value.shape[: len(self.batch_shape)]) != self.batch_shape:
                raise PolicyError(
                    f"policy output {key!r} has shape {list(value.shape)}; its leading dims must "
                    f"be the step's batch shape {list(self.batch_shape)}"
                )
        self._check_action(out.get(ACTION))
        feature = len(self.batch_shape)
        self.outputs = []
        for key, value in outputs:
            arr = self._allocate(key, tuple(value.shape[feature:]), _numpy_dtype(key, value.dtype))
            if key == (ACTION,):
                self._action_stage = arr
            else:
                self.outputs.append((key, arr))
        for key, value in states:
            dtype = _numpy_dtype((NEXT, *key), value.dtype)
            shape = tuple(value.shape[feature:])
            buf = np.zeros((*self.batch_shape, *shape), dtype)
            self.state_keys.append(key)
            self._state_bufs.append(buf)
            self._state_stage.append(self._allocate(key, shape, dtype))
            self._next_state_stage.append(self._allocate((NEXT, *key), shape, dtype))
            self.step_td.set(key, torch.from_numpy(buf))
            self._input_keys.add(key)
        self.discovered = True

    def rebind(self, arrays: dict[Key, np.ndarray]) -> None:
        """Point at new staging arrays (after the collector grew its staging)."""
        self._action_stage = arrays[(ACTION,)]
        self.outputs = [(key, arrays[key]) for key, _ in self.outputs]
        self._state_stage = [arrays[key] for key in self.state_keys]
        self._next_state_stage = [arrays[(NEXT, *key)] for key in self.state_keys]

    def _check_action(self, action: torch.Tensor) -> None:
        leaf = self.action_leaf
        expected = (*self.batch_shape, *leaf.shape)
        if tuple(action.shape) != expected or not check_action_dtype(
            leaf, _numpy_dtype((ACTION,), action.dtype)
        ):
            raise PolicyError(
                f"policy output 'action' has dtype {action.dtype} and shape {list(action.shape)}; "
                f"the action space {leaf.space!r} needs shape {list(expected)} and a "
                f"{'n integer' if leaf.dtype.kind in 'iu' else ' ' + leaf.dtype.name} dtype "
                f"compatible with {leaf.dtype.name}"
            )

    def check_next_action(self) -> None:
        """Validate the action of the next call (the collector asks once per batch)."""
        self._check_pending = True

    # --------------------------------------------------------------------- step
    def reset_state(self) -> None:
        """Zero the carried recurrent state (all envs)."""
        for buf in self._state_bufs:
            buf.fill(0)

    def step(self, obs: list[Any], init: np.ndarray, c: int) -> np.ndarray:
        """Run the policy on the current step; write its outputs at column ``c``.

        Args:
            obs: the observation leaves entering the step.
            init: bool ``[B]``: the step starts an episode.
            c: the staging column.

        Returns:
            The action as a numpy array of shape ``[*batch, *action_shape]``.
        """
        for buf, value in zip(self._obs_bufs, obs, strict=True):
            np.copyto(buf, value, casting="unsafe")
        np.copyto(self._init_flat, init)
        if self.state_keys:
            if np.count_nonzero(init):
                for buf in self._state_bufs:
                    if self.batch_shape:
                        buf[init] = 0
                    else:
                        buf.fill(0)
            for buf, stage in zip(self._state_bufs, self._state_stage, strict=True):
                stage[c] = buf
        td = self.step_td if self.device is None else self.step_td.to(self.device)
        out = self.policy(td)
        if not self.discovered:
            self._discover(out)
            for stage in self._state_stage:
                stage[c] = 0  # the state entering the first step: zeros (nothing was fed)
        elif self._check_pending:
            self._check_pending = False
            action_t = out.get(ACTION, None)
            if action_t is None:
                raise PolicyError(
                    "the policy returned no 'action' entry; it must write td['action']"
                )
            self._check_action(action_t)
        if self.device is not None:
            out = out.to("cpu")
        action = out.get(ACTION).numpy()
        assert self._action_stage is not None
        self._action_stage[c] = action
        for key, stage in self.outputs:
            stage[c] = out.get(key).numpy()
        if self.state_keys:
            nxt = out.get(NEXT)
            for key, buf, stage in zip(
                self.state_keys, self._state_bufs, self._next_state_stage, strict=True
            ):
                value = nxt.get(key).numpy()
                stage[c] = value
                np.copyto(buf, value)
        return action
