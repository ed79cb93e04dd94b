"""Named ``info`` entries as step leaves: what ``Collector(info_keys=...)`` stores.

An info key is a path into the env's ``info`` dict (``"lives"``, or ``("episode", "r")`` for a
nested dict) and is stored under the same key in the batch, like an observation:

* ``key`` at step ``t`` holds the info that came with the observation entering ``t`` (the
  reset info at an episode's first step, else the previous step's info). The policy sees it
  there, so an entry it needs to act (Taxi's ``action_mask``) is in its input;
* ``("next", key)`` holds the info returned by step ``t`` (at an episode's end the info of
  the final step, never the reset's: gymnasium's ``final_info`` in SAME_STEP autoreset).

**Required and optional keys.** A key given without a layout is *required*: it must be in
every info (reset and step, every env; for a vector env its ``_key`` mask must be all True),
and its layout (shape, dtype) is read from the first reset. A key given with a gymnasium space
(``{("episode", "r"): spaces.Box(-np.inf, np.inf, (), np.float64)}``) is *optional*: stored
as zero where an info lacks it. Use that for entries that only some steps carry, such as
``RecordEpisodeStatistics``' ``episode`` (see :data:`EPISODE_STATISTICS`).

Examples:
    >>> import numpy as np
    >>> reader = InfoReader(parse_info_keys(["lives"]), num_envs=2, batched=True)
    >>> leaves = reader.discover({"lives": np.array([3, 3]), "_lives": np.array([True, True])})
    >>> [(leaf.key, leaf.shape, leaf.dtype.name) for leaf in leaves]
    [(('lives',), (), 'int64')]
    >>> reader.read({"lives": np.array([3, 2]), "_lives": np.array([True, True])}, "step()")
    [array([3, 2])]
    >>> reader.read({}, "step()")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    splice.envs.errors.EnvError: info key 'lives' is missing from the info of step() ...
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from splice.envs.errors import EnvError
from splice.envs.spaces import OBJECT, Leaf, observation_leaves

__all__ = [
    "EPISODE_STATISTICS",
    "InfoKey",
    "InfoKeysLike",
    "InfoReader",
    "parse_info_keys",
]

Key = tuple[str, ...]
InfoKeysLike = Iterable[Any] | Mapping[str | tuple[str, ...], spaces.Space[Any] | None]

#: The layout of ``gymnasium.wrappers.RecordEpisodeStatistics``' ``info["episode"]``, present
#: only at an episode's last step: ``info_keys={"episode": EPISODE_STATISTICS}`` stores
#: ``("next", "episode", "r")`` (return), ``"l"`` (length) and ``"t"`` (seconds), zero on the
#: other steps.
EPISODE_STATISTICS = spaces.Dict(
    r=spaces.Box(-np.inf, np.inf, (), np.float64),
    l=spaces.Box(0, np.iinfo(np.int64).max, (), np.int64),
    t=spaces.Box(0, np.inf, (), np.float64),
)

#: Keys a collector batch already uses at its root: an info key may not start with them.
RESERVED = frozenset(
    {"observation", "action", "is_init", "next", "collector", "reward", "done", "terminated",
     "truncated"}
)  # fmt: skip


@dataclass(frozen=True)
class InfoKey:
    """One requested info entry.

    Args:
        key: its path in the info dict, and its key in the batch.
        space: the declared layout (an *optional* key), or ``None`` (*required*; its layout
            is read from the first reset info).
    """

    key: Key
    space: spaces.Space[Any] | None


def _as_key(key: Any) -> Key:
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    raise TypeError(
        f"info_keys entries must be str or non-empty tuples of str, got {key!r} "
        f"({type(key).__name__})"
    )


def parse_info_keys(info_keys: InfoKeysLike | None) -> list[InfoKey]:
    """Check and normalize the ``info_keys`` argument of a collector.

    Raises:
        TypeError: not an iterable/mapping of keys; a key that is not a str or tuple of str;
            a declared layout that is not a gymnasium space.
        ValueError: a key repeated, or starting with a key the batch already uses.

    Examples:
        >>> parse_info_keys({"lives": None, ("episode", "r"): None})
        [InfoKey(key=('lives',), space=None), InfoKey(key=('episode', 'r'), space=None)]
        >>> parse_info_keys(["next"])
        Traceback (most recent call last):
        ...
        ValueError: info_keys entry ('next',) collides with the batch's own key 'next'; ...
    """
    if info_keys is None:
        return []
    if isinstance(info_keys, str | bytes) or not isinstance(info_keys, Iterable):
        raise TypeError(
            "info_keys must be a list of info keys (str or tuple of str) or a mapping "
            f"key -> gymnasium space or None; got {type(info_keys).__name__}"
        )
    items = (
        list(info_keys.items())
        if isinstance(info_keys, Mapping)
        else [(key, None) for key in info_keys]
    )
    out: list[InfoKey] = []
    for raw, space in items:
        if isinstance(raw, InfoKey):  # already parsed
            raw, space = raw.key, raw.space  # type: ignore[attr-defined]
        key = _as_key(raw)
        if key[0] in RESERVED:
            raise ValueError(
                f"info_keys entry {key!r} collides with the batch's own key {key[0]!r}; "
                f"info keys may not start with {sorted(RESERVED)}"
            )
        if space is not None and not isinstance(space, spaces.Space):
            raise TypeError(
                f"the layout of info key {key!r} must be a gymnasium space (or None), got "
                f"{type(space).__name__}"
            )
        if any(k.key[: len(key)] == key or key[: len(k.key)] == k.key for k in out):
            raise ValueError(f"info_keys entry {key!r} repeats or nests inside another entry")
        out.append(InfoKey(key, space))
    return out


def _lookup(info: Mapping[str, Any], key: Key) -> tuple[Any, Any]:
    """The value at ``key`` and its gymnasium ``_name`` mask (``None`` when absent)."""
    node: Any = info
    for part in key[:-1]:
        if not isinstance(node, Mapping) or part not in node:
            return None, None
        node = node[part]
    if not isinstance(node, Mapping):
        return None, None
    return node.get(key[-1]), node.get("_" + key[-1])


_REQUIRED = object()  # a required leaf has no zero


class _StepGroup(NamedTuple):
    """Consecutive leaves of an :class:`InfoReader` under one parent dict (one env)."""

    parents: Key
    required: bool
    lasts: list[str]
    #: a vector env's required leaves: the names of their ``_key`` masks (else None)
    masks: list[str] | None
    #: the values of absent optional leaves (empty when required)
    zeros: list[Any]


class InfoReader:
    """Reads the requested entries of an env's info dicts (one env, or ``B`` batched envs).

    Args:
        keys: the requested keys (:func:`parse_info_keys`).
        num_envs: ``B``.
        batched: True for a vector env (info values are ``[B, ...]`` arrays, with gymnasium's
            ``_key`` masks when some envs lack the entry).

    After :meth:`discover`, :attr:`leaves` holds one :class:`~splice.envs.spaces.Leaf` per
    stored entry (a declared Dict space gives several), with its full batch key.
    """

    def __init__(self, keys: list[InfoKey], *, num_envs: int, batched: bool) -> None:
        self.keys = keys
        self.num_envs = num_envs
        self.batched = batched
        self.leaves: list[Leaf] = []
        #: Per leaf: required (True) or optional (False).
        self._required: list[bool] = []
        self._plan: list[tuple[Leaf, Key, str, bool]] = []
        #: read_step's plan (one env): plain keys when every entry is required at the top
        #: of the info dict, else groups of entries by parent dict
        self._flat_pick: Callable[[Mapping[str, Any]], Any] | None = None
        self._flat_single = False
        self._step_groups: list[_StepGroup] | None = None
        self._step_zeros: list[Any] = []
        self._checked: list[tuple[int, Leaf]] = []
        self._zero_values: dict[Key, np.ndarray] = {}
        self.discovered = not keys
        for info_key in keys:
            if info_key.space is not None:
                for leaf in observation_leaves(info_key.space, info_key.key):
                    if not leaf.is_tensor:
                        raise TypeError(
                            f"the declared layout of info key {leaf.key!r} is {leaf.space!r}; "
                            "declare Box, Discrete, MultiDiscrete or MultiBinary layouts"
                        )
        self._lead = (num_envs,) if batched else ()
        self._all_set = b"\x01" * num_envs  # the bytes of a ``_key`` mask of B True bools

    def discover(self, reset_info: Mapping[str, Any]) -> list[Leaf]:
        """Fix the layouts: declared ones from their spaces, the others from ``reset_info``.

        Raises:
            EnvError: a required key is not in the reset info, or its value has no array form.
        """
        if self.discovered:
            return self.leaves
        leaves, required = [], []
        for info_key in self.keys:
            if info_key.space is not None:
                declared = observation_leaves(info_key.space, info_key.key)
                leaves += declared
                required += [False] * len(declared)
                continue
            value, mask = _lookup(reset_info, info_key.key)
            if value is None:
                raise EnvError(
                    f"info key {_fmt(info_key.key)} is not in the env's reset info (keys there: "
                    f"{_keys_of(reset_info)}); a required info key must be in every info. If "
                    "only some steps carry it, declare its layout to store zero elsewhere: "
                    f"info_keys={{{_fmt(info_key.key)}: gymnasium.spaces.Box(...)}}"
                )
            if mask is not None and not np.all(mask):
                self._missing(info_key.key, "reset()", np.flatnonzero(~np.asarray(mask)))
            leaves.append(self._leaf_of(info_key.key, value))
            required.append(True)
        self.leaves, self._required = leaves, required
        #: per leaf: the leaf, its parent dict keys, its own key, whether it is required
        self._plan = [
            (leaf, leaf.key[:-1], leaf.key[-1], req)
            for leaf, req in zip(leaves, required, strict=True)
        ]
        #: (index, leaf) of the tensor leaves: the ones :meth:`read` checks
        self._checked = [(i, leaf) for i, leaf in enumerate(leaves) if leaf.is_tensor]
        if not self.batched or len(self._checked) == len(leaves):
            self._plan_step()
        self.discovered = True
        return leaves

    def _plan_step(self) -> None:
        """Plan :meth:`read_step`: the leaves grouped by parent dict, in order (plain lookups
        for one env whose entries are all required at the top of the info dict)."""
        self._step_zeros = [_REQUIRED] * len(self._plan)
        if not self.batched and all(req and not parents for _, parents, _, req in self._plan):
            keys = [last for _, _, last, _ in self._plan]
            self._flat_pick = operator.itemgetter(*keys)  # a value, or a tuple of them
            self._flat_single = len(keys) == 1
            return
        groups: list[_StepGroup] = []
        for i, (leaf, parents, last, required) in enumerate(self._plan):
            if groups and groups[-1].parents == parents and groups[-1].required == required:
                group = groups[-1]
            else:
                masks: list[str] | None = [] if required and self.batched else None
                group = _StepGroup(parents, required, [], masks, [])
                groups.append(group)
            group.lasts.append(last)
            if group.masks is not None:
                group.masks.append("_" + last)
            if not required:
                zero = self._zeros(leaf)
                zero = zero[()] if zero.ndim == 0 else zero  # a scalar writes faster
                group.zeros.append(zero)
                self._step_zeros[i] = zero
        self._step_groups = groups

    def _leaf_of(self, key: Key, value: Any) -> Leaf:
        try:
            arr = np.asarray(value)
        except ValueError:
            raise EnvError(
                f"info key {_fmt(key)} holds ragged values ({type(value).__name__}) that do not "
                "form an array"
            ) from None
        if self.batched:
            if arr.ndim == 0 or arr.shape[0] != self.num_envs:
                raise EnvError(
                    f"info key {_fmt(key)} has shape {list(arr.shape)} in the vector env's info; "
                    f"expected a leading dim of {self.num_envs} (one entry per env)"
                )
            shape = arr.shape[1:]
        else:
            shape = arr.shape
        if arr.dtype.kind in "OUS":
            if shape:
                raise EnvError(
                    f"info key {_fmt(key)} holds an array of {arr.dtype} values of shape "
                    f"{list(shape)}; non-tensor info entries are stored one object per env"
                )
            return Leaf(key, (), OBJECT, spaces.Space(), key)
        return Leaf(key, tuple(shape), arr.dtype, spaces.Space(tuple(shape), arr.dtype), key)

    def read(self, info: Mapping[str, Any], what: str, check: bool = True) -> list[Any]:
        """The values of every leaf in ``info`` (``[B, ...]`` arrays for a vector env); zero
        for an optional entry the info lacks.

        Args:
            info: the info dict of a reset or step.
            what: where it comes from (for messages).
            check: also check every value's shape (the adapters do it at the first step of
                each batch; a value numpy cannot write is caught at any step, see
                :meth:`raise_bad_values`).

        Raises:
            EnvError: a required entry is missing (for some env), or has the wrong shape.
        """
        fast = self.read_step(info)
        if fast is not None:
            if check:
                for i, leaf in self._checked:
                    value = fast[i]
                    if value is not self._step_zeros[i]:  # the zero of an absent entry fits
                        self._check(leaf, value, what)
            return fast
        values = []
        batched = self.batched
        for leaf, parents, last, required in self._plan:
            try:
                node = info
                for part in parents:
                    node = node[part]
                value = node[last]
            except (KeyError, TypeError, IndexError):
                if required:
                    self._missing(leaf.key, what, np.arange(self.num_envs))
                values.append(self._zeros(leaf))
                continue
            if batched:
                mask = node.get("_" + last)
                if mask is not None and required and not mask.all():
                    self._missing(leaf.key, what, np.flatnonzero(~np.asarray(mask)))
                if not leaf.is_tensor:
                    value = self._objects(value)
            if check and leaf.is_tensor:
                self._check(leaf, value, what)
            values.append(value)
        return values

    def read_step(self, info: Mapping[str, Any]) -> list[Any] | None:
        """:meth:`read` without the shape checks, for the steps between two checked ones: one
        dict lookup per entry, and one per parent dict of nested entries (an absent parent
        gives zeros for its optional entries at once), no exception where entries are absent.
        None where :meth:`read` must do it (non-tensor entries of a vector env, a required
        entry missing (for some env) or an optional one absent from a present parent, a parent
        that is not a dict: its error or its zero comes from :meth:`read`)."""
        pick = self._flat_pick
        if pick is not None:
            try:
                return [pick(info)] if self._flat_single else list(pick(info))
            except (KeyError, TypeError):
                return None
        groups = self._step_groups
        if groups is None:
            return None
        values: list[Any] = []
        all_set = self._all_set
        try:
            for parents, required, lasts, masks, zeros in groups:
                node: Any = info
                for part in parents:
                    node = node.get(part)
                    if node is None:
                        break
                if node is None:
                    if required:
                        return None
                    values += zeros
                    continue
                for last in lasts:
                    values.append(node[last])
                if masks is not None:  # every env must have a required entry
                    for name in masks:
                        mask = node.get(name)
                        # B True bools compare as bytes (a numpy reduction costs ~10x more)
                        if mask is not None and mask.tobytes() != all_set and not mask.all():
                            return None
        except (KeyError, TypeError, AttributeError, IndexError):
            return None
        return values

    def single_top_level_key(self) -> str | None:
        """The name of the one entry a single env reads, when it is required and at the top
        of the info dict (``info[name]``, one lookup per step: :meth:`read_step`'s plain case);
        else None (a vector env, several entries, optional or nested ones, not discovered)."""
        if self._flat_pick is None or not self._flat_single:
            return None
        return self._plan[0][2]

    def raise_bad_values(self, values: list[Any], what: str) -> None:
        """Raise the :class:`EnvError` that names the entry of ``values`` (from :meth:`read`)
        whose shape differs from its layout (called when writing them failed)."""
        for leaf, value in zip(self.leaves, values, strict=True):
            if leaf.is_tensor:
                self._check(leaf, value, what)
        raise EnvError(f"the info entries {[leaf.key for leaf in self.leaves]} of {what} could "
                       "not be stored")  # fmt: skip

    def read_rows(self, info: Mapping[str, Any], rows: np.ndarray, what: str) -> list[Any]:
        """Like :meth:`read`, for the envs ``rows`` only (values ``[len(rows), ...]``)."""
        values = []
        for leaf, required in zip(self.leaves, self._required, strict=True):
            value, mask = _lookup(info, leaf.key)
            present = None if value is None else (None if mask is None else np.asarray(mask))
            if value is None or (present is not None and not present[rows].all()):
                if required:
                    gone = rows if value is None or present is None else rows[~present[rows]]
                    self._missing(leaf.key, what, gone)
                if value is None:
                    values.append(self._zeros(leaf, len(rows)))
                    continue
            if leaf.is_tensor:
                self._check(leaf, value, what)
            else:
                value = self._objects(value) if self.batched else value
            values.append(value[rows])
        return values

    def _objects(self, value: Any) -> np.ndarray:
        """A vector env's non-tensor entry as an object array ``[B]``."""
        arr = np.empty(self.num_envs, OBJECT)
        arr[:] = list(value)
        return arr

    def _check(self, leaf: Leaf, value: Any, what: str) -> None:
        shape = np.shape(value)
        expected = (*self._lead, *leaf.shape)
        if shape != expected:
            raise EnvError(
                f"info key {_fmt(leaf.key)} has shape {list(shape)} in the info of {what}; "
                f"expected {list(expected)} (as in the first reset info)"
            )

    def _zeros(self, leaf: Leaf, rows: int | None = None) -> np.ndarray:
        if rows is None:  # every env: one read-only array per leaf, made once
            zeros = self._zero_values.get(leaf.key)
            if zeros is None:
                zeros = np.zeros((*self._lead, *leaf.shape), leaf.dtype)
                zeros.flags.writeable = False
                self._zero_values[leaf.key] = zeros
            return zeros
        return np.zeros((rows, *leaf.shape), leaf.dtype)

    def _missing(self, key: Key, what: str, rows: np.ndarray) -> None:
        where = f" (env rows {rows.tolist()})" if self.batched else ""
        raise EnvError(
            f"info key {_fmt(key)} is missing from the info of {what}{where}; a required info "
            "key must be in every info. If only some steps carry it, declare its layout to "
            f"store zero elsewhere: info_keys={{{_fmt(key)}: gymnasium.spaces.Box(...)}}"
        )


def _fmt(key: Key) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


def _keys_of(info: Mapping[str, Any], prefix: Key = ()) -> list[Key | str]:
    out: list[Key | str] = []
    for k, v in info.items():
        if isinstance(k, str) and k.startswith("_"):
            continue
        if isinstance(v, Mapping):
            out += _keys_of(v, (*prefix, k))
        else:
            out.append(k if not prefix else (*prefix, k))
    return out
