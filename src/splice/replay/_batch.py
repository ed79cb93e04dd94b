"""What ``extend`` receives, as flat columns checked against the storage's schema.

Accepted containers: a TensorDict, a plain tensor or a (nested) dict of tensors. Tensors and
dicts are flat batches along their first dim, as in TorchRL; a buffer answers in the kind of
container it was first given (:class:`Kind`).

Accepted TensorDict layouts (all produced by splice's collectors and trajectory ops):

* flat ``[N]`` steps, including the "cat" layout of whole trajectories;
* ``[B, T]`` collector batches (``[..., B, T]`` too): stored env-major, each env row
  contiguous, so that a chunk of one trajectory occupies consecutive rows;
* padded ``[N, T]`` trajectories with a ``("collector", "mask")``: padding is dropped (any
  batch of two or more dims that carries the mask key is treated as padded).

Flattening and checking follow the batch contract (:func:`splice.contract.flatten_steps`):
rows whose trajectory id is ``-1`` (padding) are dropped too, an id below ``-1`` is refused,
and integer ids of any dtype are read as int64. Non-tensor entries (one Python object per
step) become object columns (:attr:`FlatBatch.objects`). One :class:`Flattener` per buffer
does it, and lets a batch laid out as the last checked one skip the checks. Nothing here
mutates a batch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from splice.contract import flatten_steps
from splice.layout import MASK, Key, LayoutError, fmt_key, validate_batch

__all__ = [
    "Arrays",
    "Columns",
    "FlatBatch",
    "Flattener",
    "Kind",
    "Objects",
    "Rows",
    "Schema",
    "as_tensordict",
    "from_tensordict",
    "kind_of",
]

Columns = dict[Key, Tensor]
#: Flat columns as numpy arrays (see :attr:`FlatBatch.arrays`).
Arrays = dict[Key, np.ndarray]
#: Rows to store, as tensors or numpy arrays (what ``Storage.write`` copies from).
Rows = Mapping[Key, Tensor | np.ndarray]
#: Object columns: one numpy object array ``[N]`` per non-tensor key.
Objects = dict[Key, np.ndarray]

#: The key under which a buffer of plain tensors stores them.
TENSOR_KEY: Key = ("_tensor",)


class Kind(enum.Enum):
    """The container a buffer was given, and answers in."""

    TENSORDICT = "tensordict"
    TENSOR = "tensor"
    DICT = "dict"


def as_tensordict(data: object, *, single: bool = False) -> tuple[TensorDictBase, Kind]:
    """``data`` as a TensorDict, and its kind.

    Args:
        data: a TensorDict, a tensor or a (nested) dict of tensors.
        single: ``data`` is one step (``add``): tensors and dicts get no batch dim.

    Raises:
        TypeError: any other type.
        LayoutError: a dict whose tensors do not share their first dim.
    """
    if isinstance(data, TensorDictBase):
        return data, Kind.TENSORDICT
    if isinstance(data, Tensor):
        batch = [] if single else list(data.shape[:1])
        if not single and data.dim() == 0:
            raise LayoutError("extend expects a tensor with a batch dim; use add() for one step")
        return TensorDict({TENSOR_KEY: data}, batch_size=batch), Kind.TENSOR
    if isinstance(data, Mapping):
        first = _first_tensor(data, ())
        if first is None:
            raise LayoutError("a dict given to a replay buffer must hold at least one tensor")
        batch = [] if single else list(first.shape[:1])
        try:
            return TensorDict(dict(data), batch_size=batch), Kind.DICT
        except RuntimeError as err:
            raise LayoutError(
                f"the tensors of a dict must share their first (batch) dim {batch}: {err}"
            ) from err
    raise TypeError(
        "a replay buffer stores TensorDicts, tensors or dicts of tensors, got "
        f"{type(data).__name__}"
    )


def _first_tensor(data: Mapping[str, Any], path: Key) -> Tensor | None:
    """The first tensor leaf of a nested dict; TypeError for a leaf that is not a tensor."""
    first = None
    for key, value in data.items():
        if isinstance(value, Mapping):
            found = _first_tensor(value, (*path, key))
        elif isinstance(value, Tensor):
            found = value
        else:
            raise TypeError(
                f"key {fmt_key((*path, key))} holds {type(value).__name__}: a replay buffer "
                "stores tensors only"
            )
        first = found if first is None else first
    return first


def kind_of(name: str | None) -> Kind | None:
    """The :class:`Kind` saved as ``name`` (None: no data yet).

    Raises:
        ValueError: an unknown name.
    """
    return None if name is None else Kind(name)


def from_tensordict(td: TensorDictBase, kind: Kind) -> Any:
    """A sample or stored rows in the buffer's kind of container."""
    if kind is Kind.TENSOR:
        return td.get(TENSOR_KEY)
    if kind is Kind.DICT:
        return td.exclude("index").to_dict()
    return td


@dataclass(frozen=True)
class Schema:
    """Per tensor key: dtype and per-step shape; and the object (non-tensor) keys. Fixed by
    the first batch a storage receives."""

    entries: dict[Key, tuple[torch.dtype, tuple[int, ...]]]
    objects: tuple[Key, ...] = ()

    @staticmethod
    def of(columns: Columns, objects: Objects | None = None) -> Schema:
        return Schema(
            {k: (v.dtype, tuple(v.shape[1:])) for k, v in columns.items()},
            tuple(objects or ()),
        )

    def check(
        self, columns: Columns, objects: Objects | None = None, *, subset: bool = False
    ) -> None:
        """Raise :class:`LayoutError` naming every missing/extra key or the first mismatch.

        ``subset``: the columns may cover only some keys (in-place writes).
        """
        if not subset and self.matches(columns, objects):
            return
        objects = objects or {}
        missing = [] if subset else [k for k in self.entries if k not in columns]
        missing += [] if subset else [k for k in self.objects if k not in objects]
        extra = [k for k in columns if k not in self.entries]
        extra += [k for k in objects if k not in self.objects]
        for key in set(missing) & set(extra):
            stored = "non-tensor entries" if key in self.objects else "tensors"
            given = "tensors" if key in self.objects else "non-tensor entries"
            raise LayoutError(
                f"key {fmt_key(key)}: the buffer stores {stored} there (fixed by the first "
                f"batch written to the storage), got {given}"
            )
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing keys " + ", ".join(fmt_key(k) for k in missing))
            if extra:
                parts.append("unexpected keys " + ", ".join(fmt_key(k) for k in extra))
            raise LayoutError(
                "batch does not match the buffer's keys: " + "; ".join(parts) + " (the keys "
                "are fixed by the first batch written to the storage)"
            )
        for key, value in columns.items():
            dtype, shape = self.entries[key]
            if value.dtype != dtype or tuple(value.shape[1:]) != shape:
                raise LayoutError(
                    f"key {fmt_key(key)}: expected dtype {dtype} and per-step shape "
                    f"{list(shape)}, got dtype {value.dtype} and per-step shape "
                    f"{list(value.shape[1:])}"
                )

    def matches(self, columns: Columns, objects: Objects | None = None) -> bool:
        """Whether :meth:`check` passes (every key, dtype and per-step shape): the test an
        ``extend`` makes, a few comparisons per key; :meth:`check` says what is wrong."""
        entries = self.entries
        if len(columns) != len(entries):
            return False
        if (objects or self.objects) and set(objects or ()) != set(self.objects):
            return False
        for key, value in columns.items():
            spec = entries.get(key)
            if spec is None or value.dtype != spec[0] or value.shape[1:] != spec[1]:
                return False
        return True

    def to_json(self) -> list[dict[str, object]]:
        """Tensor keys as ``{"key", "dtype", "shape"}``, object keys with dtype ``"object"``."""
        tensors: list[dict[str, object]] = [
            {"key": list(k), "dtype": str(d).removeprefix("torch."), "shape": list(s)}
            for k, (d, s) in self.entries.items()
        ]
        return tensors + [{"key": list(k), "dtype": "object", "shape": []} for k in self.objects]

    @staticmethod
    def from_json(items: object) -> Schema:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: not a schema written by :meth:`to_json`.
        """
        if not isinstance(items, list):
            raise ValueError(f"a schema is a list of entries, got {type(items).__name__}")
        entries: dict[Key, tuple[torch.dtype, tuple[int, ...]]] = {}
        objects: list[Key] = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f"schema entry {i} is not an object: {item!r}")
            key, dtype, shape = item.get("key"), item.get("dtype"), item.get("shape")
            if not isinstance(key, list) or not key or not all(isinstance(p, str) for p in key):
                raise ValueError(f"schema entry {i}: bad key {key!r}")
            if tuple(key) in entries or tuple(key) in objects:
                raise ValueError(f"schema entry {i}: key {fmt_key(tuple(key))} appears twice")
            if dtype == "object" and shape == []:
                objects.append(tuple(key))
                continue
            if not isinstance(dtype, str) or not isinstance(
                getattr(torch, dtype, None), torch.dtype
            ):
                raise ValueError(
                    f"schema entry {i} ({fmt_key(tuple(key))}): unknown dtype {dtype!r}"
                )
            if not isinstance(shape, list) or not all(
                isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape
            ):
                raise ValueError(f"schema entry {i} ({fmt_key(tuple(key))}): bad shape {shape!r}")
            entries[tuple(key)] = (getattr(torch, dtype), tuple(shape))
        return Schema(entries, tuple(objects))


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class FlatBatch:
    """A batch as flat ``[N, ...]`` columns, plus what the index needs to know about it.

    Attributes:
        columns: every stored key, ``[N, *per-step shape]``, env-major, padding dropped.
        ids: ``[N]`` int64 trajectory ids, as a numpy array (when the buffer uses ids),
            else None.
        n_envs: env rows ``B`` the steps came from (1 for flat input); each row's steps are
            consecutive in ``columns`` (``n_envs * steps_per_env == N`` unless ``padded``).
        padded: the input was padded trajectories (one trajectory per row, lengths vary).
        row_lengths: for padded input, the number of kept steps of each input row.
        flat: the input was flat ``[N]`` (no env rows to tell streams apart).
        input_shape: the input's batch shape.
        n: the number of steps kept (``N``).
        source: the flat input position of every kept step (None: all kept, in order).
        objects: every non-tensor key, ``[N]`` numpy object arrays (like ``columns``).
        arrays: the columns as numpy arrays (the same memory), when a batch that skipped
            the checks was flattened for a storage on the CPU (:class:`Flattener`): then
            ``columns`` is empty, and the storage copies from these.
    """

    columns: Columns
    ids: np.ndarray | None
    n_envs: int
    padded: bool
    row_lengths: np.ndarray | None
    flat: bool
    input_shape: torch.Size
    n: int
    source: np.ndarray | None = None
    objects: Objects = field(default_factory=dict)
    arrays: Arrays | None = None

    def flags_array(self, key: Key) -> np.ndarray | None:
        """Column ``key`` as a numpy array (None when the batch lacks it)."""
        if self.arrays is not None:
            return self.arrays.get(key)
        value = self.columns.get(key)
        return None if value is None else value.numpy()


class Flattener:
    """Flattens and checks the batches given to one buffer (see the module docs), and
    remembers the layout of the last batch that passed every check.

    A batch laid out as that one — a plain ``TensorDict`` of tensors with the same batch
    shape and, per leaf in order, the same key, dtype and shape, checked against the same
    schema and ids key — passes the checks too, but for the values of its ids: it skips them
    (one comparison instead of the contract walk and the schema check). Only batches without
    a mask and with int64 ids (what the checks read as they are) are remembered.

    Args:
        as_arrays: the storage is on the CPU: give a batch that skips the checks as numpy
            arrays (:attr:`FlatBatch.arrays`) when every leaf has one (a CPU tensor without
            autograd, of a dtype numpy knows); flattening ``[B, T]`` arrays, and the
            storage's copies from them, cost a fraction of the tensors'.

    Examples:
        >>> flattener = Flattener(as_arrays=True)
        >>> ids = torch.zeros(2, 3, dtype=torch.int64)
        >>> td = TensorDict({"x": torch.zeros(2, 3), "ids": ids}, batch_size=[2, 3])
        >>> batch = flattener.flatten(td, ("ids",), None)  # the first batch: checked
        >>> schema = Schema.of(batch.columns)
        >>> batch.n, batch.n_envs, batch.arrays is None
        (6, 2, True)
        >>> batch = flattener.flatten(td, ("ids",), schema)  # checked, and remembered
        >>> flattener.flatten(td, ("ids",), schema).arrays[("x",)].shape  # alike: no checks
        (6,)
    """

    def __init__(self, *, as_arrays: bool) -> None:
        self.as_arrays = as_arrays
        #: The layout of the last batch that passed every check (replaced whole: the buffer
        #: flattens outside its lock).
        self._known: _Known | None = None

    def flatten(
        self,
        td: TensorDictBase,
        ids_key: Key | None,
        schema: Schema | None,
        *,
        trust: bool = True,
    ) -> FlatBatch:
        """``td`` as flat columns, checked against the batch contract and ``schema``.

        Args:
            td: the batch given to ``extend``.
            ids_key: key of the trajectory ids, if the buffer uses ids.
            schema: the storage's schema; None for the storage's first batch, which is
                also run through the data-contract validator (its columns fix the schema).
            trust: let a batch laid out as the last checked one skip the checks. Its ids
                are then unchecked: the caller checks that none is negative (padding, or
                refused), and flattens a batch that has one again with ``trust=False``,
                which drops or refuses them.

        Raises:
            LayoutError: the batch breaks the batch contract or does not match ``schema``.
        """
        sig = _signature(td)
        known = self._known
        if (
            trust
            and sig is not None
            and known is not None
            and known.schema is schema
            and known.ids_key == ids_key
            and sig[0] == known.signature
        ):
            return _flatten_known(sig[0][0], sig[1], ids_key, as_arrays=self.as_arrays)
        eligible = sig is not None and _known_eligible(sig[1], ids_key)
        batch = _flatten_checked(td, ids_key, first=schema is None)
        if schema is not None:
            schema.check(batch.columns, batch.objects)
            if sig is not None and eligible:
                self._known = _Known(sig[0], schema, ids_key)
        return batch


#: A plain TensorDict's batch shape and, per tensor leaf in order, its key, dtype and shape.
Signature = tuple[torch.Size, list[tuple[Key, torch.dtype, torch.Size]]]


class _Known(NamedTuple):
    """The :data:`Signature` of a batch that passed the checks against ``schema`` with
    ``ids_key``."""

    signature: Signature
    schema: Schema
    ids_key: Key | None


def _flatten_checked(td: TensorDictBase, ids_key: Key | None, *, first: bool) -> FlatBatch:
    """Flatten ``td`` env-major through the batch contract and drop its padding.

    ``first``: this is the storage's first batch: also run the data-contract validator.
    """
    steps = flatten_steps(td, ids_key=ids_key, mask_key=MASK, context="a replay buffer batch")
    if first:
        validate_batch(td, check_done_consistency=False)
    padded = steps.mask is not None and len(steps.batch_shape) >= 2
    row_lengths = None
    if padded:
        T = steps.steps_per_env
        row_lengths = (
            np.full(steps.n_envs, T, dtype=np.int64)
            if steps.real is None
            else steps.real.reshape(steps.n_envs, T).sum(1).numpy().astype(np.int64)
        )
    source = None
    kept = steps
    if steps.real is not None:
        source = steps.real.nonzero().squeeze(1).numpy()
        kept = steps.without_padding()
    leaf = next(iter(kept.columns.values()), None)
    if leaf is not None:
        n = leaf.shape[0]
    else:
        values = next(iter(kept.objects.values()), None)
        n = 0 if values is None else values.shape[0]
    return FlatBatch(
        columns=kept.columns,
        ids=None if kept.ids is None else kept.ids.numpy(),
        n_envs=steps.n_envs,
        padded=padded,
        row_lengths=row_lengths,
        flat=len(steps.batch_shape) == 1,
        input_shape=steps.batch_shape,
        n=n,
        source=source,
        objects=kept.objects,
    )


def _signature(td: TensorDictBase) -> tuple[Signature, Columns] | None:
    """The :data:`Signature` of a plain ``TensorDict`` of tensors (sub-TensorDicts
    included) and its leaves by key; None for anything else (other TensorDict types,
    non-tensor entries)."""
    if type(td) is not TensorDict:
        return None
    leaves: Columns = {}
    shapes: list[tuple[Key, torch.dtype, torch.Size]] = []
    if not _plain_tensors(td, (), leaves, shapes):
        return None
    return (td.batch_size, shapes), leaves


def _plain_tensors(
    td: TensorDict,
    prefix: Key,
    leaves: Columns,
    shapes: list[tuple[Key, torch.dtype, torch.Size]],
) -> bool:
    for name, value in td.items():
        key = (*prefix, name)
        if isinstance(value, Tensor):
            leaves[key] = value
            shapes.append((key, value.dtype, value.shape))
        elif type(value) is not TensorDict or not _plain_tensors(value, key, leaves, shapes):
            return False
    return True


def _known_eligible(leaves: Columns, ids_key: Key | None) -> bool:
    """Whether batches with these leaves may skip the checks: no mask, and int64 ids (what
    :func:`_flatten_checked` would read as they are)."""
    for key, value in leaves.items():
        if key == MASK or (key == ids_key and value.dtype != torch.int64):
            return False
    return True


def _flatten_known(
    batch_shape: torch.Size, leaves: Columns, ids_key: Key | None, *, as_arrays: bool
) -> FlatBatch:
    """:func:`_flatten_checked` of a batch laid out as one that passed it, but for the
    values of its ids (see :meth:`Flattener.flatten`); ``as_arrays``: see
    :class:`Flattener`."""
    ndim = len(batch_shape)
    n = batch_shape[0] if ndim == 1 else batch_shape.numel()
    columns: Columns = {}
    arrays: Arrays | None = None
    if as_arrays:
        try:
            if ndim == 1:
                arrays = {k: v.numpy() for k, v in leaves.items()}
            else:
                arrays = {k: v.numpy().reshape(n, *v.shape[ndim:]) for k, v in leaves.items()}
        except (TypeError, RuntimeError):  # accelerators, autograd, dtypes numpy lacks
            arrays = None
    if arrays is None:
        columns = leaves if ndim == 1 else {k: v.flatten(0, ndim - 1) for k, v in leaves.items()}
    ids = None
    if ids_key is not None:
        ids = arrays[ids_key] if arrays is not None else columns[ids_key].numpy()
    return FlatBatch(
        columns=columns,
        ids=ids,
        n_envs=1 if ndim == 1 else batch_shape[:-1].numel(),
        padded=False,
        row_lengths=None,
        flat=ndim == 1,
        input_shape=batch_shape,
        n=n,
        arrays=arrays,
    )
