"""The data contract: key names, dtypes and shapes of a splice batch, and a validator.

A collector batch is a :class:`tensordict.TensorDict` of shape ``[T]`` (one env) or
``[B, T]`` (``B`` envs, time last). The keys follow TorchRL's conventions so that code
ports by changing imports; see ``docs/data_contract`` for the full table.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from splice import layout
    >>> batch = TensorDict(
    ...     {
    ...         layout.TRAJ_IDS: torch.tensor([0, 0, 1]),
    ...         layout.DONE: torch.tensor([[False], [True], [False]]),
    ...         layout.REWARD: torch.ones(3, 1),
    ...     },
    ...     batch_size=[3],
    ... )
    >>> layout.validate_batch(batch, required=(layout.TRAJ_IDS, layout.DONE))
    >>> batch[layout.DONE] = torch.zeros(3)  # wrong dtype and shape
    >>> layout.validate_batch(batch)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    splice.layout.LayoutError: key ('next', 'done'): expected dtype torch.bool and shape [3, 1], ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

__all__ = [
    "ACTION",
    "CUT",
    "DONE",
    "IS_INIT",
    "MASK",
    "NEXT",
    "NEXT_OBSERVATION",
    "OBSERVATION",
    "PADDING_ID",
    "REWARD",
    "TERMINATED",
    "TRAJ_FORMATS",
    "TRAJ_IDS",
    "TRUNCATED",
    "Key",
    "KeySpec",
    "LayoutError",
    "TrajFormat",
    "check_trajectory_ids",
    "validate_batch",
]

#: A nested key as a flat tuple of strings (what :func:`as_key_tuple` returns).
Key = tuple[str, ...]
#: The two layouts of whole trajectories: ``"padded"`` (``[n, max_len]`` plus a mask) or
#: ``"cat"`` (flat ``[sum of lengths]``, trajectory after trajectory).
TrajFormat = Literal["padded", "cat"]
#: The values :data:`TrajFormat` allows.
TRAJ_FORMATS: tuple[TrajFormat, ...] = ("padded", "cat")


def check_traj_format(traj_format: object) -> None:
    """Refuse a ``traj_format`` that is not one of :data:`TRAJ_FORMATS`.

    Raises:
        ValueError: naming the allowed values.

    Examples:
        >>> check_traj_format("cat")
        >>> check_traj_format("nested")
        Traceback (most recent call last):
        ...
        ValueError: traj_format must be one of ('padded', 'cat'), got 'nested'
    """
    if traj_format not in TRAJ_FORMATS:
        raise ValueError(f"traj_format must be one of {TRAJ_FORMATS}, got {traj_format!r}")


#: The sub-TensorDict holding what the env returned after the step's action.
NEXT = "next"
#: The observation entering the step (env's dtype and shape; nested keys for Dict spaces).
OBSERVATION = "observation"
#: The action taken at the step.
ACTION = "action"
#: bool ``[..., 1]``: the step is the first of an episode.
IS_INIT = "is_init"
#: The observation after the action; at an episode's end the TRUE final one, never a reset.
NEXT_OBSERVATION = (NEXT, OBSERVATION)
#: float ``[..., 1]``: the reward of the transition.
REWARD = (NEXT, "reward")
#: bool ``[..., 1]``: ``terminated | truncated`` (the env ended the episode).
DONE = (NEXT, "done")
#: bool ``[..., 1]``: the MDP ended; do not bootstrap from the next observation.
TERMINATED = (NEXT, "terminated")
#: bool ``[..., 1]``: a time limit ended the episode; bootstrap from the next observation.
TRUNCATED = (NEXT, "truncated")
#: integer ``[...]`` (int64 from collectors; any integer dtype is read as int64): the trajectory
#: id, unique and never reused; ``-1`` only on padding.
TRAJ_IDS = ("collector", "traj_ids")
#: bool ``[...]``: True on real steps, False on padding (padded and nested layouts).
MASK = ("collector", "mask")
#: True on the last step of a trajectory *fragment* that the collector cut at a batch edge:
#: the episode goes on in the next batch under the same id. The environment did not end it,
#: so it is never a reason to stop bootstrapping and never makes a fragment "complete".
CUT = ("collector", "cut")

#: The trajectory id of padding positions. Real ids are ``>= 0``.
PADDING_ID = -1


class LayoutError(ValueError):
    """A batch does not follow the data contract; the message names the key."""


def check_trajectory_ids(ids: Tensor, key: NestedKey = TRAJ_IDS) -> None:
    """Refuse trajectory ids below :data:`PADDING_ID`: ids are ``>= 0``, and ``-1`` marks
    padding. Any other negative id is corrupt data; treating it as padding would silently
    drop the step and join the steps around it into one trajectory.

    Raises:
        LayoutError: naming the key, how many ids are below -1, the first one and its
            (flat) position.

    Examples:
        >>> import torch
        >>> check_trajectory_ids(torch.tensor([0, 0, -1, 1]))
        >>> check_trajectory_ids(torch.tensor([0, 0, -7, 0]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        splice.layout.LayoutError: key ('collector', 'traj_ids'): 1 trajectory id(s) below -1, ...
    """
    if ids.numel() == 0 or int(ids.min()) >= PADDING_ID:
        return
    bad = (ids.reshape(-1) < PADDING_ID).nonzero().squeeze(1)
    first = int(bad[0])
    raise LayoutError(
        f"key {fmt_key(key)}: {bad.numel()} trajectory id(s) below {PADDING_ID}, the first "
        f"{int(ids.reshape(-1)[first])} at flat position {first}; ids are >= 0, and "
        f"{PADDING_ID} marks padding"
    )


@dataclass(frozen=True)
class KeySpec:
    """What the contract says about one key.

    Args:
        dtype: ``"bool"``, ``"integer"`` (any integer dtype, read as int64) or ``"float"``
            (any floating dtype).
        trailing_one: whether the key carries a trailing singleton dim (``[..., 1]``), as
            TorchRL's done/reward entries do.
    """

    dtype: str
    trailing_one: bool

    def expected_shape(self, batch_shape: torch.Size) -> list[int]:
        return [*batch_shape, 1] if self.trailing_one else list(batch_shape)

    def dtype_ok(self, dtype: torch.dtype) -> bool:
        if self.dtype == "float":
            return dtype.is_floating_point
        if self.dtype == "integer":
            return is_integer_dtype(dtype)
        return dtype == getattr(torch, self.dtype)

    def dtype_name(self) -> str:
        if self.dtype in ("float", "integer"):
            return "floating point" if self.dtype == "float" else "an integer dtype"
        return f"torch.{self.dtype}"


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """True for torch's integer dtypes (bool is not an integer here).

    Examples:
        >>> is_integer_dtype(torch.int32), is_integer_dtype(torch.bool)
        (True, False)
    """
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


CONTRACT: dict[NestedKey, KeySpec] = {
    IS_INIT: KeySpec("bool", trailing_one=True),
    REWARD: KeySpec("float", trailing_one=True),
    DONE: KeySpec("bool", trailing_one=True),
    TERMINATED: KeySpec("bool", trailing_one=True),
    TRUNCATED: KeySpec("bool", trailing_one=True),
    TRAJ_IDS: KeySpec("integer", trailing_one=False),
    MASK: KeySpec("bool", trailing_one=False),
    CUT: KeySpec("bool", trailing_one=False),
}


def as_key_tuple(key: NestedKey) -> tuple[str, ...]:
    """Normalise a nested key to a flat tuple of strings.

    Examples:
        >>> as_key_tuple(("next", ("done",)))
        ('next', 'done')
    """
    if isinstance(key, str):
        return (key,)
    out: list[str] = []
    for part in key:
        out.extend(as_key_tuple(part))
    return tuple(out)


def all_leaves(td: TensorDictBase) -> list[tuple[Key, Any]]:
    """Every leaf of ``td`` with its key as a flat tuple: tensors, and non-tensor entries
    (tensordict's ``NonTensorData``/``NonTensorStack``, which tensordict's own leaf listing
    skips).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"x": torch.zeros(2)}, [2])
        >>> _ = td.set_non_tensor(("observation", "mission"), "go")
        >>> [(key, type(value).__name__) for key, value in all_leaves(td)]
        [(('x',), 'Tensor'), (('observation', 'mission'), 'NonTensorData')]
    """
    if type(td) is not TensorDict:  # lazy stacks, sub-tensordicts, ...: tensordict's walk
        return [
            (as_key_tuple(key), value)
            for key, value in td.items(include_nested=True, leaves_only=True, is_leaf=_is_leaf)
        ]
    # A plain TensorDict's own entries, walked here: tensordict's nested listing and the key
    # normalisation cost about 3x this on a CartPole batch, on every extend and split.
    out: list[tuple[Key, Any]] = []
    _plain_leaves(td, (), out)
    return out


def _plain_leaves(td: TensorDict, prefix: Key, out: list[tuple[Key, Any]]) -> None:
    for name, value in td.items():
        key = (*prefix, name)
        if isinstance(value, Tensor) or _is_leaf(type(value)):
            out.append((key, value))
        elif type(value) is TensorDict:
            _plain_leaves(value, key, out)
        else:
            out.extend(((*key, *sub), leaf) for sub, leaf in all_leaves(value))


def tensor_leaves(
    td: TensorDictBase, *, context: str = "a batch", error: type[ValueError] = LayoutError
) -> Iterator[tuple[tuple[str, ...], Tensor]]:
    """Every leaf of ``td`` with its key as a flat tuple; a non-tensor leaf raises ``error``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({("next", "done"): torch.zeros(2, 1, dtype=torch.bool)}, [2])
        >>> [key for key, _ in tensor_leaves(td)]
        [('next', 'done')]
    """
    for key, value in all_leaves(td):
        if not isinstance(value, Tensor):
            raise error(
                f"key {fmt_key(key)} holds {type(value).__name__}, not a tensor: {context} holds "
                "tensor entries only"
            )
        yield key, value


def _is_leaf(cls: type) -> bool:
    # tensordict skips non-tensor entries when it lists leaves; count them, so they are
    # carried or refused instead of silently dropped. (tensordict's is_non_tensor takes an
    # instance: given the NonTensorStack class it says False, which skipped stacks.)
    return not issubclass(cls, TensorDictBase) or issubclass(cls, NonTensorStack)


def fmt_key(key: NestedKey) -> str:
    """A key as error messages show it: ``'observation'`` or ``('next', 'done')``.

    Examples:
        >>> fmt_key(("observation",)), fmt_key(("next", "done"))
        ("'observation'", "('next', 'done')")
    """
    key = as_key_tuple(key)
    return repr(key[0]) if len(key) == 1 else repr(key)


def validate_batch(
    td: TensorDictBase,
    *,
    required: Iterable[NestedKey] = (),
    check_done_consistency: bool = True,
) -> None:
    """Check that ``td`` follows the data contract.

    Every contract key that is present must have the contract's dtype and shape (relative to
    ``td.batch_size``); trajectory ids must be ``>= -1`` (:func:`check_trajectory_ids`); every
    key in ``required`` must be present; and when done, terminated and truncated are all
    present, ``done`` must equal ``terminated | truncated``.

    Args:
        td: the batch to check.
        required: keys that must be present.
        check_done_consistency: verify ``done == terminated | truncated``.

    Raises:
        LayoutError: naming the offending key, the expected and the actual dtype/shape.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"observation": torch.zeros(4, 3)}, batch_size=[4])
        >>> validate_batch(td, required=[("collector", "traj_ids")])
        Traceback (most recent call last):
          ...
        splice.layout.LayoutError: missing key ('collector', 'traj_ids') (batch shape [4])
    """
    batch_shape = td.batch_size
    for key in required:
        if td.get(key, None) is None:
            raise LayoutError(f"missing key {fmt_key(key)} (batch shape {list(batch_shape)})")
    for key, spec in CONTRACT.items():
        value = td.get(key, None)
        if value is None:
            continue
        expected = spec.expected_shape(batch_shape)
        if not spec.dtype_ok(value.dtype) or list(value.shape) != expected:
            raise LayoutError(
                f"key {fmt_key(key)}: expected dtype {spec.dtype_name()} and shape {expected}, "
                f"got dtype {value.dtype} and shape {list(value.shape)}"
            )
    ids = td.get(TRAJ_IDS, None)
    if ids is not None:
        check_trajectory_ids(ids)
    if check_done_consistency:
        done, term, trunc = (td.get(k, None) for k in (DONE, TERMINATED, TRUNCATED))
        if done is not None and term is not None and trunc is not None:
            bad = done != (term | trunc)
            if bad.any():
                raise LayoutError(
                    f"key {fmt_key(DONE)} must equal terminated | truncated; it differs at "
                    f"{int(bad.sum())} of {bad.numel()} positions"
                )
