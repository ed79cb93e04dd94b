"""Gymnasium spaces as flat lists of array *leaves*: what the collector stores per step.

A :class:`Leaf` is one array entry of a step: its key below ``"observation"`` (empty for a
plain Box), its per-env shape and its numpy dtype. Dict and Tuple observation spaces become
several leaves with nested keys (``Dict(pos=..., vel=...)`` gives ``("observation", "pos")``
and ``("observation", "vel")``; Tuple items are named ``"0"``, ``"1"``, ...).

Examples:
    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> from splice.envs.spaces import observation_leaves, flattener
    >>> space = spaces.Dict(
    ...     pos=spaces.Box(-1, 1, (2,), np.float32), flag=spaces.Discrete(3)
    ... )
    >>> [(leaf.key, leaf.shape, leaf.dtype.name) for leaf in observation_leaves(space)]
    [(('pos',), (2,), 'float32'), (('flag',), (), 'int64')]
    >>> flat = flattener(space)
    >>> flat({"pos": np.zeros(2, np.float32), "flag": 1})
    [array([0., 0.], dtype=float32), 1]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = [
    "Leaf",
    "action_leaf",
    "check_action_dtype",
    "flattener",
    "observation_leaves",
]

_SIMPLE = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


@dataclass(frozen=True)
class Leaf:
    """One array entry of a step.

    Args:
        key: the key below the entry's root (``()`` when the space is not a Dict/Tuple).
        shape: shape for one env (without the env or time dims).
        dtype: numpy dtype.
        space: the gymnasium space of this leaf.
    """

    key: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    space: spaces.Space[Any]


def _simple_leaf(space: spaces.Space[Any], key: tuple[str, ...]) -> Leaf:
    if isinstance(space, spaces.Discrete):
        return Leaf(key, (), np.dtype(space.dtype or np.int64), space)
    assert space.shape is not None and space.dtype is not None
    return Leaf(key, tuple(space.shape), np.dtype(space.dtype), space)


def observation_leaves(space: spaces.Space[Any], key: tuple[str, ...] = ()) -> list[Leaf]:
    """The leaves of an observation space, depth first (Dict keys in the space's order).

    Raises:
        TypeError: a space the collector cannot store (Text, Graph, Sequence, ...).

    Examples:
        >>> import numpy as np
        >>> space = spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3)))
        >>> [(leaf.key, leaf.shape) for leaf in observation_leaves(space)]
        [(('0',), ()), (('1',), (3,))]
    """
    if isinstance(space, _SIMPLE):
        return [_simple_leaf(space, key)]
    if isinstance(space, spaces.Dict):
        return [
            leaf
            for k, sub in space.spaces.items()
            for leaf in observation_leaves(sub, (*key, str(k)))
        ]
    if isinstance(space, spaces.Tuple):
        return [
            leaf
            for i, sub in enumerate(space.spaces)
            for leaf in observation_leaves(sub, (*key, str(i)))
        ]
    where = f" at key {key!r}" if key else ""
    raise TypeError(
        f"observation space {space!r}{where} is not supported: use Box, Discrete, MultiDiscrete, "
        "MultiBinary, or Dict/Tuple of those"
    )


def flattener(space: spaces.Space[Any]) -> Callable[[Any], list[Any]]:
    """A function mapping one observation of ``space`` to the list of its leaf values.

    Works for a single env's observation and for a vector env's batched observation alike.
    """
    if isinstance(space, _SIMPLE):
        return lambda obs: [obs]
    if isinstance(space, spaces.Dict):
        parts = [(k, flattener(sub)) for k, sub in space.spaces.items()]
        return lambda obs: [v for k, f in parts for v in f(obs[k])]
    if isinstance(space, spaces.Tuple):
        items = [flattener(sub) for sub in space.spaces]
        return lambda obs: [v for f, o in zip(items, obs, strict=True) for v in f(o)]
    observation_leaves(space)  # raises the explanatory TypeError
    raise AssertionError("unreachable")


def action_leaf(space: spaces.Space[Any]) -> Leaf:
    """The single leaf of an action space.

    Raises:
        TypeError: Dict/Tuple or other composite action spaces (not supported).

    Examples:
        >>> action_leaf(spaces.MultiDiscrete([2, 3])).shape
        (2,)
    """
    if isinstance(space, _SIMPLE):
        return _simple_leaf(space, ())
    raise TypeError(
        f"action space {space!r} is not supported: the collector handles Box, Discrete, "
        "MultiDiscrete and MultiBinary actions"
    )


def check_action_dtype(leaf: Leaf, dtype: np.dtype) -> bool:
    """Whether actions of numpy ``dtype`` can be stored as ``leaf`` without losing meaning.

    Integer spaces (Discrete, MultiDiscrete) need integer actions; MultiBinary accepts integer
    or bool; a floating Box needs floating actions; an integer Box needs integers.

    Examples:
        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> leaf = action_leaf(spaces.Discrete(2))
        >>> check_action_dtype(leaf, np.dtype(np.int64))
        True
        >>> check_action_dtype(leaf, np.dtype(np.float32))
        False
    """
    kind = np.dtype(dtype).kind
    if isinstance(leaf.space, spaces.MultiBinary):
        return kind in "iub"
    want = leaf.dtype.kind
    if want in "iu":
        return kind in "iu"
    if want == "f":
        return kind == "f"
    return kind == want
