"""Running a TensorDict policy step by step inside the rollout loop, with no TensorDict per step.

:class:`PolicyStep` owns ONE step TensorDict whose entries are torch views of numpy buffers, and
the recurrent state carried from step to step. Each :meth:`PolicyStep.step` copies the current
observation, ``is_init`` and state into those buffers, calls the policy, and returns the action
and the other outputs as numpy arrays; the loop writes them into its staging. It never sees the
staging arrays, so it has nothing to rebind when they grow.

The policy protocol it implements (keys, recurrent-state convention) is documented in
:mod:`splice.policies`.

Examples:
    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> from splice.envs.spaces import action_leaf, observation_leaves
    >>> def policy(td):
    ...     td["action"] = (td["observation"][..., 0] > 0).long()
    ...     td["score"] = td["observation"].sum(-1)
    ...     return td
    >>> (obs_leaf,) = observation_leaves(spaces.Box(-1, 1, (3,)))
    >>> step = PolicyStep(
    ...     policy,
    ...     [(("observation",), obs_leaf)],
    ...     action_leaf(spaces.Discrete(2)),
    ...     num_envs=2,
    ...     batched=True,
    ... )
    >>> obs = np.array([[0.5, 0, 0], [-0.5, 0, 0]], np.float32)
    >>> action, outputs = step.step([obs], np.array([True, True]))
    >>> action, [key for key, _, _ in step.output_specs], outputs[0]
    (array([1, 0]), [('score',)], array([ 0.5, -0.5], dtype=float32))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from splice._non_tensor import to_non_tensor
from splice.envs import EnvAdapter
from splice.envs.spaces import Leaf, check_action_dtype
from splice.layout import ACTION, IS_INIT, NEXT, tensor_leaves
from splice.policies import PolicyError

__all__ = ["OutputSpec", "PolicyStep"]

Key = tuple[str, ...]
#: A policy output the batch stores: its key, per-env shape and numpy dtype.
OutputSpec = tuple[Key, tuple[int, ...], np.dtype[Any]]
_UNSET = object()  # no non-tensor value set yet


def _same(a: Any, b: Any) -> bool:
    """Whether two non-tensor values are known equal (plain scalars compared, others by
    identity: comparing arbitrary objects may not give a bool)."""
    return a is b or (type(a) is type(b) and isinstance(a, str | bytes | int | float) and a == b)


def _numpy_dtype(key: Key, dtype: torch.dtype) -> np.dtype[Any]:
    try:
        return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    except TypeError:
        raise PolicyError(
            f"policy output {key!r} has dtype {dtype}, which has no numpy equivalent; cast it "
            "(e.g. to float32) inside the policy"
        ) from None


class PolicyStep:
    """Calls a TensorDict policy on one step of ``B`` envs; carries its recurrent state.

    Args:
        policy: the policy, in the protocol of :mod:`splice.policies` (wrap what a user gave
            with :func:`splice.policies.as_policy` first).
        input_leaves: ``(key, leaf)`` of every value entering a step (observation leaves,
            then info leaves: :attr:`EnvAdapter.input_leaves`), for ONE env. Non-tensor leaves
            reach the policy as tensordict non-tensor entries, rebuilt only when they change.
        action_leaf: the action leaf of ONE env.
        num_envs: ``B``.
        batched: False for a single env: the step TensorDict is unbatched (``[]``).
        device: where the policy runs (``None``: CPU, no copies).

    After the first call, :attr:`output_specs` lists what :meth:`step` returns besides the
    action, in order: the policy's other root outputs, then for each recurrent state key
    ``k`` the state entering the step (``k``) and the state it produced (``("next", k)``).
    """

    def __init__(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        input_leaves: list[tuple[Key, Leaf]],
        action_leaf: Leaf,
        *,
        num_envs: int,
        batched: bool,
        device: torch.device | str | None = None,
    ) -> None:
        self.policy = policy
        self.action_leaf = action_leaf
        self.batch_shape: tuple[int, ...] = (num_envs,) if batched else ()
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cpu":
            self.device = None
        # One numpy buffer per tensor input (the step TensorDict holds torch views of them);
        # ``None`` for a non-tensor input, set into the TensorDict when its value changes.
        self._obs_bufs: list[np.ndarray | None] = []
        self._object_inputs: list[tuple[int, Key]] = []
        entries: dict[NestedKey, Any] = {}
        for i, (key, leaf) in enumerate(input_leaves):
            if leaf.is_tensor:
                buf = np.zeros((*self.batch_shape, *leaf.shape), leaf.dtype)
                self._obs_bufs.append(buf)
                entries[key] = torch.from_numpy(buf)
            else:
                self._obs_bufs.append(None)
                self._object_inputs.append((i, key))
        self._last_objects: list[Any] = [_UNSET] * len(self._object_inputs)
        self._init_buf = np.zeros((*self.batch_shape, 1), np.bool_)
        self._init_flat = self._init_buf.reshape(-1)
        entries[IS_INIT] = torch.from_numpy(self._init_buf)
        self.step_td = TensorDict(entries, batch_size=self.batch_shape)
        self._input_keys: set[Key] = {key for key, _ in input_leaves} | {(IS_INIT,)}
        #: True once the first call has revealed the policy's outputs.
        self.discovered = False
        #: What :meth:`step` returns besides the action (see the class docstring).
        self.output_specs: list[OutputSpec] = []
        self._output_keys: list[Key] = []
        #: Recurrent state keys (root names).
        self.state_keys: list[Key] = []
        self._state_bufs: list[np.ndarray] = []  # the state fed to the policy (step_td views)
        self._carried: list[np.ndarray] | None = None  # the state to feed next, when not there
        self._check_pending = False

    @classmethod
    def for_env(
        cls,
        policy: Callable[[TensorDictBase], TensorDictBase],
        adapter: EnvAdapter,
        device: torch.device | str | None = None,
    ) -> PolicyStep:
        """A policy step for an env adapter's steps: its input leaves (observation, then info:
        make it once the adapter has reset, when the info leaves are known), its action leaf,
        its ``B``."""
        return cls(
            policy,
            adapter.input_leaves,
            adapter.act_leaf,
            num_envs=adapter.num_envs,
            batched=adapter.batched,
            device=device,
        )

    # ---------------------------------------------------------------- discovery
    @property
    def output_keys(self) -> list[Key]:
        """The keys of :attr:`output_specs`, in order: what a batch stores from the policy."""
        return [key for key, _, _ in self.output_specs]

    def discover(self, obs: list[Any], init: np.ndarray) -> list[OutputSpec]:
        """Learn the policy's outputs without stepping the envs: call it once on ``obs`` (as
        :meth:`step`, without gradients), then zero the recurrent state as if it never ran
        (the loop does this before a batch of random actions, which stores the policy's keys).

        Returns:
            :attr:`output_specs`.
        """
        with torch.no_grad():
            self.step(obs, init)
        self.reset_state()
        return self.output_specs

    def _discover(self, out: TensorDictBase) -> None:
        """Learn the policy's output and state keys from its first output."""
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
        own = out.exclude(*self._input_keys)  # the inputs may hold non-tensor entries
        items = list(tensor_leaves(own, context="a policy's output", error=PolicyError))
        keys = {key for key, _ in items}
        if (ACTION,) not in keys:
            raise PolicyError(
                "the policy returned no 'action' entry; it must write td['action'] "
                f"(keys returned: {sorted(keys)})"
            )
        outputs, states = [], []
        for key, value in items:
            if key == (ACTION,):
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
        for key, value in outputs:
            self.output_specs.append(
                (key, tuple(value.shape[feature:]), _numpy_dtype(key, value.dtype))
            )
            self._output_keys.append(key)
        for key, value in states:
            dtype = _numpy_dtype((NEXT, *key), value.dtype)
            shape = tuple(value.shape[feature:])
            buf = np.zeros((*self.batch_shape, *shape), dtype)
            self.state_keys.append(key)
            self._state_bufs.append(buf)
            self.output_specs += [(key, shape, dtype), ((NEXT, *key), shape, dtype)]
            self.step_td.set(key, torch.from_numpy(buf))
            self._input_keys.add(key)
        self.discovered = True

    def _check_action(self, action: torch.Tensor) -> None:
        leaf = self.action_leaf
        expected = (*self.batch_shape, *leaf.shape)
        if tuple(action.shape) != expected or not check_action_dtype(
            leaf, _numpy_dtype((ACTION,), action.dtype)
        ):
            hint = ""
            if isinstance(leaf.space, spaces.Discrete) and tuple(action.shape) == (
                *expected,
                int(leaf.space.n),
            ):
                hint = (
                    "; it looks like scores per action: wrap the module with "
                    "splice.policies.as_policy(module, output='greedy') for Q-values or "
                    "output='sample' for logits"
                )
            raise PolicyError(
                f"policy output 'action' has dtype {action.dtype} and shape {list(action.shape)}; "
                f"the action space {leaf.space!r} needs shape {list(expected)} and a"
                f"{'n integer' if leaf.dtype.kind in 'iu' else ' ' + leaf.dtype.name} dtype "
                f"compatible with {leaf.dtype.name}{hint}"
            )

    def _set_objects(self, obs: list[Any]) -> None:
        """Set the non-tensor inputs whose value changed since the last step."""
        for j, (i, key) in enumerate(self._object_inputs):
            value, last = obs[i], self._last_objects[j]
            if self.batch_shape:
                if last is not _UNSET and all(map(_same, value, last)):
                    continue
                values = np.empty(self.batch_shape, dtype=object)
                values[:] = list(value)
                self.step_td.set(key, to_non_tensor(values))
                self._last_objects[j] = values
            else:
                if last is not _UNSET and _same(value, last):
                    continue
                self.step_td.set_non_tensor(key, value)
                self._last_objects[j] = value

    def check_next_action(self) -> None:
        """Validate the action of the next call (the loop asks once per batch)."""
        self._check_pending = True

    # --------------------------------------------------------------------- step
    def reset_state(self) -> None:
        """Zero the carried recurrent state (all envs)."""
        for buf in self._state_bufs:
            buf.fill(0)
        self._carried = None

    def step(self, obs: list[Any], init: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run the policy on the current step.

        Args:
            obs: the observation leaves entering the step.
            init: bool ``[B]``: the step starts an episode (its recurrent state is zeroed).

        Returns:
            The action (``[*batch, *action_shape]``) and the values of :attr:`output_specs`.
            The returned arrays are only valid until the next call.
        """
        for buf, value in zip(self._obs_bufs, obs, strict=True):
            if buf is not None:
                np.copyto(buf, value, casting="unsafe")
        if self._object_inputs:
            self._set_objects(obs)
        np.copyto(self._init_flat, init)
        if self.state_keys:
            if self._carried is not None:  # the state produced by the previous call
                for buf, value in zip(self._state_bufs, self._carried, strict=True):
                    np.copyto(buf, value)
            if np.count_nonzero(init):
                for buf in self._state_bufs:
                    if self.batch_shape:
                        buf[init] = 0
                    else:
                        buf.fill(0)
        td = self.step_td if self.device is None else self.step_td.to(self.device)
        out = self.policy(td)
        if not self.discovered:
            self._discover(out)  # the state entering this first step: zeros (nothing was fed)
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
        values = [out.get(key).numpy() for key in self._output_keys]
        if self.state_keys:
            nxt = out.get(NEXT)
            produced = [nxt.get(key).numpy() for key in self.state_keys]
            for entering, value in zip(self._state_bufs, produced, strict=True):
                values += [entering, value]
            self._carried = produced
        return out.get(ACTION).numpy(), values
