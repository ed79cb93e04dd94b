"""Gymnasium spaces as flat lists of array *leaves*: what the collector stores per step.

A :class:`Leaf` is one array entry of a step: its key below ``"observation"`` (empty for a
plain Box), its per-env shape and its numpy dtype. Dict and Tuple observation spaces become
several leaves with nested keys (``Dict(pos=..., vel=...)`` gives ``("observation", "pos")``
and ``("observation", "vel")``; Tuple items are named ``"0"``, ``"1"``, ...).

A space without a tensor form (``Text``, MiniGrid's ``MissionSpace``, ``Graph``,
``Sequence``, any other ``Space`` subclass) is a *non-tensor* leaf: dtype ``object``, shape
``()``; the collector carries its values as Python objects and the batch holds them as
tensordict non-tensor entries (see ``docs/design.md``, "Non-tensor entries").

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
    >>> observation_leaves(spaces.Text(8))[0].dtype
    dtype('O')
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = [
    "OBJECT",
    "Leaf",
    "action_leaf",
    "check_action_dtype",
    "flattener",
    "observation_leaves",
    "select_leaves",
]

_SIMPLE = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
#: The dtype of a non-tensor leaf (values are Python objects).
OBJECT = np.dtype(object)


@dataclass(frozen=True)
class Leaf:
    """One array entry of a step.

    Args:
        key: the key below the entry's root (``()`` when the space is not a Dict/Tuple).
        shape: shape for one env (without the env or time dims).
        dtype: numpy dtype.
        space: the gymnasium space of this leaf.
        path: how to reach the leaf's value in one observation (Dict keys, Tuple indices);
            ``key`` is the same path with every part as a string.
    """

    key: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    space: spaces.Space[Any]
    path: tuple[Any, ...] = ()

    @property
    def is_tensor(self) -> bool:
        """False for a non-tensor leaf (Python objects, dtype ``object``)."""
        return self.dtype != OBJECT


def _simple_leaf(
    space: spaces.Space[Any], key: tuple[str, ...], path: tuple[Any, ...] = ()
) -> Leaf:
    if isinstance(space, spaces.Discrete):
        return Leaf(key, (), np.dtype(space.dtype or np.int64), space, path)
    assert space.shape is not None and space.dtype is not None
    return Leaf(key, tuple(space.shape), np.dtype(space.dtype), space, path)


def observation_leaves(
    space: spaces.Space[Any], key: tuple[str, ...] = (), path: tuple[Any, ...] = ()
) -> list[Leaf]:
    """The leaves of an observation space, depth first (Dict keys in the space's order).

    Box, Discrete, MultiDiscrete and MultiBinary are tensor leaves; Dict and Tuple nest; any
    other space is one non-tensor leaf (dtype ``object``).

    Examples:
        >>> import numpy as np
        >>> space = spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3)))
        >>> [(leaf.key, leaf.shape) for leaf in observation_leaves(space)]
        [(('0',), ()), (('1',), (3,))]
    """
    if isinstance(space, _SIMPLE):
        return [_simple_leaf(space, key, path)]
    if isinstance(space, spaces.Dict):
        return [
            leaf
            for k, sub in space.spaces.items()
            for leaf in observation_leaves(sub, (*key, str(k)), (*path, k))
        ]
    if isinstance(space, spaces.Tuple):
        return [
            leaf
            for i, sub in enumerate(space.spaces)
            for leaf in observation_leaves(sub, (*key, str(i)), (*path, i))
        ]
    return [Leaf(key, (), OBJECT, space, path)]


def select_leaves(
    leaves: list[Leaf], exclude: list[tuple[str, ...]], *, root: str = "observation"
) -> list[Leaf]:
    """``leaves`` without those under the excluded keys (full keys, starting with ``root``).

    Raises:
        ValueError: an excluded key matches no leaf, or every leaf is excluded.

    Examples:
        >>> space = spaces.Dict(image=spaces.Box(0, 1, (2,)), mission=spaces.Text(5))
        >>> [leaf.key for leaf in select_leaves(
        ...     observation_leaves(space), [("observation", "mission")])]
        [('image',)]
    """
    kept = list(leaves)
    for key in exclude:
        if key[:1] != (root,):
            raise ValueError(
                f"exclude_keys entry {key!r} is not an observation key: it must start with "
                f"{root!r}; observation keys: {[(root, *leaf.key) for leaf in leaves]}"
            )
        below = key[1:]
        matched = [leaf for leaf in leaves if leaf.key[: len(below)] == below]
        if not matched:
            raise ValueError(
                f"exclude_keys entry {key!r} matches no observation key; observation keys: "
                f"{[(root, *leaf.key) for leaf in leaves]}"
            )
        kept = [leaf for leaf in kept if leaf not in matched]
    if not kept:
        raise ValueError(f"exclude_keys {exclude!r} excludes every observation key")
    return kept


def flattener(
    space: spaces.Space[Any], leaves: list[Leaf] | None = None
) -> Callable[[Any], list[Any]]:
    """A function mapping one observation of ``space`` to the list of its leaf values.

    Works for a single env's observation and for a vector env's batched observation alike.

    Args:
        space: the observation space.
        leaves: the leaves to return (default: all of :func:`observation_leaves`), in order.
    """
    if leaves is None:
        leaves = observation_leaves(space)
    paths = [leaf.path for leaf in leaves]
    if paths == [()]:
        return lambda obs: [obs]
    if all(len(p) == 1 for p in paths):
        if len(paths) == 1:
            (head,) = paths[0]
            return lambda obs: [obs[head]]
        pick = operator.itemgetter(*[p[0] for p in paths])  # one C call for every leaf
        return lambda obs: list(pick(obs))

    def flatten(obs: Any) -> list[Any]:
        values = []
        for path in paths:
            value = obs
            for part in path:
                value = value[part]
            values.append(value)
        return values

    return flatten


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
        "MultiDiscrete and MultiBinary actions (Dict/Tuple action spaces: see "
        "docs/design.md, 'Data layout decisions')"
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
