"""The batch contract in code: one function flattens and checks a batch of steps.

Every layer that reads batches of steps — :func:`~splice.split_trajectories` and
:func:`~splice.cat_trajectories`, :class:`~splice.TrajectoryAssembler` and
:meth:`ReplayBuffer.extend <splice.ReplayBuffer.extend>` — goes through
:func:`flatten_steps`, so a batch that one layer accepts is accepted by the next, with the same
errors for the same faults:

* the batch is a :class:`~tensordict.TensorDictBase` (anything else: ``TypeError``) with at
  least one batch dim;
* its leaves are tensors (``[*batch, *per-step shape]``) or tensordict *non-tensor entries*
  (``NonTensorData``/``NonTensorStack`` of the batch shape: one Python object per step, e.g. a
  text observation), read as numpy object arrays (:attr:`Steps.objects`); the ids, the mask
  and the contract's flags must be tensors;
* it is flattened **env-major**: ``[..., B, T] -> [N]``, each env row's ``T`` steps
  consecutive and in time order;
* trajectory ids (at the caller's key): any integer dtype, shape equal to the batch shape,
  cast **once** to int64; ``-1`` marks padding and an id below ``-1`` is refused
  (:func:`~splice.layout.check_trajectory_ids`);
* the mask (at the caller's key): bool, shape equal to the batch shape; False marks padding;
* step flags (done, terminated, truncated, the collector's cut): bool, shape ``[*batch]`` or
  ``[*batch, ...]`` (reduced with ``any`` over the trailing dims);
* a batch without steps (``[0]``, ``[B, 0]``) is valid: it flattens to ``N = 0``.

Faults raise :class:`~splice.layout.LayoutError` (a ``ValueError``) naming the key, the
expected and the actual dtype and shape. Nothing is mutated.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from splice.contract import flatten_steps
    >>> batch = TensorDict(
    ...     {
    ...         ("collector", "traj_ids"): torch.tensor([[0, 0, -1], [1, 1, 1]], dtype=torch.int32),
    ...         ("next", "done"): torch.tensor([[[False], [True], [False]]] * 2),
    ...     },
    ...     batch_size=[2, 3],
    ... )
    >>> steps = flatten_steps(batch, ids_key=("collector", "traj_ids"))
    >>> steps.n, steps.n_envs, steps.ids.dtype
    (6, 2, torch.int64)
    >>> steps.real.tolist()  # the -1 id is padding
    [True, True, False, True, True, True]
    >>> steps.flag(("next", "done")).tolist()
    [False, True, False, False, True, False]
    >>> flatten_steps({"observation": torch.zeros(3)})
    Traceback (most recent call last):
      ...
    TypeError: a batch must be a TensorDict, got dict
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice._gather import take_rows
from splice._non_tensor import non_tensor_values
from splice.layout import (
    CONTRACT,
    PADDING_ID,
    Key,
    LayoutError,
    all_leaves,
    as_key_tuple,
    check_trajectory_ids,
    fmt_key,
    is_integer_dtype,
)

__all__ = ["Steps", "flatten_steps", "read_ids"]


@dataclass(frozen=True)
class Steps:
    """A batch of steps, flattened env-major and checked (see the module docs).

    Attributes:
        columns: every tensor leaf except the mask, ``[N, *per-step shape]``.
        batch_shape: the input's batch shape (``[N]``, ``[B, T]``, ``[..., B, T]``).
        ids_key: where the ids were read (None: the batch has none, or none were asked for).
        ids: ``[N]`` int64 trajectory ids, or None.
        mask: ``[N]`` bool, the input's mask (None: the batch has no mask).
        real: ``[N]`` bool, True on real steps (mask True and id ``>= 0``); None when every
            step is real.
        objects: every non-tensor entry, as a ``[N]`` numpy object array (one Python object
            per step).
    """

    columns: dict[Key, Tensor]
    batch_shape: torch.Size
    ids_key: Key | None = None
    ids: Tensor | None = None
    mask: Tensor | None = None
    real: Tensor | None = None
    objects: dict[Key, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Steps in the batch, padding included (until :meth:`without_padding`)."""
        return self.batch_shape.numel()

    @property
    def n_envs(self) -> int:
        """Env rows: the product of all batch dims but the last (1 for a flat batch)."""
        return self.batch_shape[:-1].numel()

    @property
    def steps_per_env(self) -> int:
        """``T``, the last batch dim."""
        return self.batch_shape[-1]

    @property
    def has_padding(self) -> bool:
        return self.real is not None

    def flag(self, key: NestedKey) -> Tensor | None:
        """The bool ``[N]`` step flag at ``key`` (any over trailing dims), or None if absent.

        Raises:
            LayoutError: the flag is not bool.
        """
        key = as_key_tuple(key)
        value = self.columns.get(key)
        if value is None:
            return None
        if value.dtype != torch.bool:
            raise LayoutError(
                f"key {fmt_key(key)}: expected a bool flag of shape {list(self.batch_shape)} or "
                f"{[*self.batch_shape, 1]}, got dtype {value.dtype} and shape "
                f"{[*self.batch_shape, *value.shape[1:]]}"
            )
        if value.dim() == 1:
            return value
        # Not reshape(n, -1): -1 is ambiguous when the batch has no steps.
        return value.reshape(value.shape[0], math.prod(value.shape[1:])).any(1)

    def take(self, rows: Tensor) -> Steps:
        """The steps at flat positions ``rows`` (int64), as a flat batch."""
        objects = {}
        if self.objects:
            picks = rows.cpu().numpy()
            objects = {k: np.take(v, picks) for k, v in self.objects.items()}
        return Steps(
            columns={k: take_rows(v, rows) for k, v in self.columns.items()},
            batch_shape=torch.Size([rows.numel()]),
            ids_key=self.ids_key,
            ids=None if self.ids is None else self.ids[rows],
            mask=None if self.mask is None else self.mask[rows],
            real=None,
            objects=objects,
        )

    def without_padding(self) -> Steps:
        """The real steps only, as a flat batch (``self`` when there is no padding)."""
        if self.real is None:
            return self
        out = self.take(self.real.nonzero().squeeze(1))
        return replace(out, mask=None)


def read_ids(value: Tensor, key: NestedKey, batch_shape: torch.Size) -> Tensor:
    """Trajectory ids as int64 (cast once), after checking their dtype, shape and values
    (``>= -1``: :func:`~splice.layout.check_trajectory_ids`).

    Args:
        value: the ids as stored in the batch.
        key: their key (for messages).
        batch_shape: the batch shape they must have.

    Raises:
        LayoutError: not an integer dtype (float, bool or complex), not the batch shape, or
            an id below ``-1``.

    Examples:
        >>> import torch
        >>> read_ids(torch.tensor([3, 3, 4], dtype=torch.int16), "traj", torch.Size([3]))
        tensor([3, 3, 4])
        >>> read_ids(torch.tensor([3.0]), "traj", torch.Size([1]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        splice.layout.LayoutError: key 'traj': trajectory ids must have an integer dtype ...
    """
    return _read_ids(value, key, batch_shape)[0]


def _read_ids(value: Tensor, key: NestedKey, batch_shape: torch.Size) -> tuple[Tensor, bool]:
    """:func:`read_ids`, and whether any id is ``-1`` (padding)."""
    if not is_integer_dtype(value.dtype) or value.shape != batch_shape:
        raise LayoutError(
            f"key {fmt_key(key)}: trajectory ids must have an integer dtype and shape "
            f"{list(batch_shape)}, got dtype {value.dtype} and shape {list(value.shape)}"
        )
    lowest = int(value.min()) if value.numel() else 0
    if lowest < PADDING_ID:
        check_trajectory_ids(value, key)  # raises, naming the first bad id
    ids = value if value.dtype == torch.int64 else value.to(torch.int64)
    return ids, lowest == PADDING_ID


def flatten_steps(
    td: TensorDictBase,
    *,
    ids_key: NestedKey | None = None,
    mask_key: NestedKey | None = None,
    context: str = "a batch",
) -> Steps:
    """Flatten ``td`` env-major and check it against the batch contract (module docs).

    Args:
        td: the batch.
        ids_key: key of the trajectory ids, if the caller uses ids (absent: ``ids`` is None).
        mask_key: key of the mask, if the caller honours one (absent: no mask).
        context: what the batch is for, in error messages.

    Returns:
        The flat columns (the mask excluded), the flat non-tensor entries, the int64 ids and
        which steps are real.

    Raises:
        TypeError: ``td`` is not a TensorDict.
        LayoutError: no batch dim, ids or mask of the wrong dtype or shape, a non-tensor entry
            that is not one object per step, or at the ids, mask or a contract flag.
    """
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"{context} must be a TensorDict, got {type(td).__name__}")
    batch = td.batch_size
    n, ndim = batch.numel(), len(batch)
    if ndim == 0:
        raise LayoutError(
            f"{context} needs at least one batch dimension ([N], [B, T] or padded [N, T]), got "
            "batch shape []"
        )
    mkey = None if mask_key is None else as_key_tuple(mask_key)
    ikey = None if ids_key is None else as_key_tuple(ids_key)
    columns: dict[Key, Tensor] = {}
    objects: dict[Key, np.ndarray] = {}
    mask: Tensor | None = None
    given_ids: Tensor | None = None
    for key, value in all_leaves(td):
        if not isinstance(value, Tensor):
            objects[key] = _object_column(key, value, batch, n, (ikey, mkey), context)
            continue
        if key == mkey:
            if value.dtype != torch.bool or value.shape != batch:
                raise LayoutError(
                    f"key {fmt_key(key)}: the mask must have dtype torch.bool and shape "
                    f"{list(batch)}, got dtype {value.dtype} and shape {list(value.shape)}"
                )
            mask = value.reshape(n)
            continue
        if key == ikey:
            given_ids = value
        # (flatten: cheaper per call than the equivalent reshape)
        columns[key] = value if ndim == 1 else value.flatten(0, ndim - 1)
    ids = real = None
    if given_ids is not None and ikey is not None:
        ids, padded = _read_ids(given_ids, ikey, batch)
        ids = ids if ndim == 1 else ids.reshape(n)
        if padded:  # else every id is real: no per-step test
            real = ids >= 0
    else:
        ikey = None
    if mask is not None:
        real = mask if real is None else real & mask
    if real is not None and bool(real.all()):
        real = None
    return Steps(columns, batch, ikey, ids, mask, real, objects)


def _object_column(
    key: Key,
    entry: object,
    batch: torch.Size,
    n: int,
    tensor_keys: tuple[Key | None, ...],
    context: str,
) -> np.ndarray:
    """A non-tensor entry as a flat ``[N]`` object array, checked (see :func:`flatten_steps`)."""
    if key in tensor_keys or key in _CONTRACT_KEYS:
        raise LayoutError(
            f"key {fmt_key(key)} holds {type(entry).__name__}, not a tensor: in {context} the "
            "trajectory ids, the mask and the step flags must be tensors"
        )
    shape = getattr(entry, "batch_size", None)
    if shape != batch:
        raise LayoutError(
            f"key {fmt_key(key)}: a non-tensor entry must hold one object per step (batch "
            f"shape {list(batch)}), got {type(entry).__name__} of batch shape "
            f"{None if shape is None else list(shape)}"
        )
    return non_tensor_values(entry).reshape(n)


_CONTRACT_KEYS = frozenset(as_key_tuple(k) for k in CONTRACT)
