"""Storages: a ring of ``max_size`` rows, one column per key, allocated from the first batch.

* :class:`LazyTensorStorage` keeps the rows in memory (optionally on a device);
* :class:`~splice.replay.memmap.LazyMemmapStorage` keeps them in memory-mapped files, crash
  safe, through the durability hooks of :class:`Storage` (``stage``, ``begin_write``,
  ``commit``, ``recovered``).

A storage holds three kinds of column:

* a **tensor column** ``[max_size, *per-step shape]`` per tensor key;
* an **object column** per non-tensor key (one Python object per row, e.g. a text
  observation): a numpy object array in memory; text on disk (:mod:`splice.replay._objects`);
* a **shared next column** for each pair ``(k, ("next", *k))`` stored once (``dedup_next``,
  the default): ``("next", *k)`` is kept only where it is not the next row's ``k`` and
  rebuilt on reads, exactly (:mod:`splice.replay._dedup`).

Reads (:meth:`Storage.gather`) always give every key, as if every column were stored whole.
Which trajectory each row belongs to is tracked by the buffer's index
(:mod:`splice.replay.index`), whose per-row trajectory keys the storage keeps so that a
memory-mapped buffer can rebuild it on reopening.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tensordict.utils import NestedKey
from torch import Tensor

from splice._args import positive_int, require_int
from splice._gather import as_tensor, numpy_view, put_rows, take_rows_of
from splice.layout import NEXT, Key, LayoutError, as_key_tuple, fmt_key
from splice.replay._batch import Columns, Objects, Rows, Schema, kind_of
from splice.replay._boundaries import Boundaries
from splice.replay._dedup import NO_VALUE, SharedNext, resize_in_memory
from splice.replay._state import as_int
from splice.replay._structures import I64

__all__ = ["DEDUP_MIN_BYTES", "CommitState", "DedupNext", "LazyTensorStorage", "Storage"]


@dataclass(frozen=True)
class CommitState:
    """The buffer's small bookkeeping state, committed by a storage after every write.

    Attributes:
        write_count: steps written so far.
        lo: global position of the oldest live step.
        boundaries: the buffer's boundary state (``Boundaries.to_json()``), if any.
        kind: the kind of container the buffer holds (``"tensordict"``, ``"tensor"``,
            ``"dict"``; None before the first write).
    """

    write_count: int
    lo: int
    boundaries: dict[str, object] | None
    kind: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "write_count": self.write_count,
            "lo": self.lo,
            "boundaries": self.boundaries,
            "kind": self.kind,
        }

    @staticmethod
    def from_json(doc: object, where: str = "commit state") -> CommitState:
        """The inverse of :meth:`to_json` (types checked; ranges are the caller's).

        Raises:
            ValueError: not a document written by :meth:`to_json` (named by ``where``).
        """
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: expected an object, got {type(doc).__name__}")
        bounds, kind = doc.get("boundaries"), doc.get("kind")
        if bounds is not None:
            try:
                Boundaries.from_json(bounds)
            except ValueError as err:
                raise ValueError(f"{where}.boundaries: {err}") from err
        try:
            kind_of(kind if kind is None or isinstance(kind, str) else repr(kind))
        except ValueError as err:
            raise ValueError(f"{where}.kind: unknown kind {kind!r}") from err
        return CommitState(
            as_int(doc.get("write_count"), f"{where}.write_count"),
            as_int(doc.get("lo"), f"{where}.lo"),
            bounds,
            kind,
        )


#: ``dedup_next`` values: True (every pair of at least :data:`DEDUP_MIN_BYTES` per step),
#: False, or the root keys ``k`` whose ``("next", *k)`` is stored once.
DedupNext = bool | Sequence[NestedKey]
#: With ``dedup_next=True``, pairs whose per-step value is smaller than this are stored whole:
#: a row's slot (8 bytes) and the extra gather would cost about what they save.
DEDUP_MIN_BYTES = 64


def _check_dedup(value: object) -> bool | tuple[Key, ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            "dedup_next must be a bool or a list of keys (e.g. ['observation']), got "
            f"{type(value).__name__} {value!r}"
        )
    keys = tuple(as_key_tuple(k) for k in value)
    for key in keys:
        if key[0] == NEXT:
            raise ValueError(
                f"dedup_next names the keys k whose ('next', *k) is stored once; got "
                f"{fmt_key(key)}, which starts with 'next'"
            )
    return keys


class Storage:
    """Base class of the storages: a ring of ``max_size`` rows with lazily allocated columns.

    Args:
        max_size: capacity in steps (transitions).
        device: where the columns live.
        ndim: accepted for TorchRL compatibility; must be 1 (steps are stored one per row;
            a ``[B, T]`` batch is stored env-major, so no ``ndim=2`` is needed).
        dedup_next: store ``("next", *k)`` only where it is not the next row's ``k``, and
            rebuild it on reads (bit-identical: see :mod:`splice.replay._dedup` for the rule
            and why it is exact). ``True`` (default): every pair ``(k, ("next", *k))`` of the
            same dtype and shape whose per-step size is at least :data:`DEDUP_MIN_BYTES`
            (observations of 16 floats and up, pixels); a list of keys ``k``: exactly those
            pairs (each must be in the data); ``False``: every key stored whole.
    """

    def __init__(
        self,
        max_size: int,
        *,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        dedup_next: DedupNext = True,
    ) -> None:
        max_size = positive_int("max_size", max_size)
        if require_int("ndim", ndim) != 1:
            raise ValueError(
                f"ndim={ndim!r}: splice storages keep one step per row (ndim=1); a [B, T] "
                "batch is stored env-major and trajectories are tracked by the buffer's index"
            )
        self.max_size = max_size
        self.device = torch.device(device)
        self.dedup_next = _check_dedup(dedup_next)
        self.schema: Schema | None = None
        #: Tensor columns ``[max_size, ...]`` (a shared next key has none: see ``shared``).
        self.columns: Columns = {}
        #: Object columns: numpy object arrays ``[max_size]``.
        self.objects: Objects = {}
        #: Shared next columns, by next key.
        self.shared: dict[Key, SharedNext] = {}
        # numpy views of ``columns`` (None: numpy cannot view it), for the row copies.
        self._views: dict[Key, np.ndarray | None] = {}
        self.row_key = np.full(max_size, -1, dtype=I64)
        self._owner: object | None = None

    def __repr__(self) -> str:
        keys = "unallocated" if self.schema is None else f"{len(self.schema.entries)} keys"
        return f"{type(self).__name__}(max_size={self.max_size}, {keys})"

    # ------------------------------------------------------------------ ownership
    @property
    def owner(self) -> object | None:
        """The replay buffer this storage belongs to (None: free)."""
        return self._owner

    def claim(self, owner: object) -> None:
        """Make ``owner`` (a replay buffer) the storage's only user.

        Raises:
            ValueError: the storage already belongs to another buffer.
        """
        if self._owner is not None and self._owner is not owner:
            raise ValueError("this storage already belongs to another replay buffer")
        self._owner = owner

    def release(self, owner: object) -> None:
        """Undo :meth:`claim` (a buffer whose construction failed)."""
        if self._owner is owner:
            self._owner = None

    # ------------------------------------------------------------------ allocation
    def shared_pairs(self, schema: Schema) -> list[tuple[Key, Key]]:
        """The ``(k, ("next", *k))`` pairs this storage stores once for ``schema``, in schema
        order of the next keys (see ``dedup_next``).

        Raises:
            LayoutError: ``dedup_next`` names a key without a ``("next", *k)`` of the same
                dtype and shape in ``schema``.
        """
        entries = schema.entries
        if self.dedup_next is False:
            return []
        if self.dedup_next is True:
            pairs = []
            for key, (dtype, shape) in entries.items():
                if key[0] != NEXT or len(key) < 2 or entries.get(key[1:]) != (dtype, shape):
                    continue
                size = math.prod(shape) * dtype.itemsize
                if size >= DEDUP_MIN_BYTES:
                    pairs.append((key[1:], key))
            return pairs
        wanted = set(self.dedup_next)
        for key in self.dedup_next:
            nxt = (NEXT, *key)
            if key not in entries or entries.get(nxt) != entries[key]:
                raise LayoutError(
                    f"dedup_next names {fmt_key(key)}, but the data has no {fmt_key(nxt)} of "
                    f"its dtype and shape next to it (keys: "
                    f"{', '.join(fmt_key(k) for k in entries)})"
                )
        return [(key[1:], key) for key in entries if key[0] == NEXT and key[1:] in wanted]

    def _new_column(self, index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
        return torch.empty((self.max_size, *shape), dtype=dtype, device=self.device)

    def _new_shared(
        self, index: int, obs_key: Key, next_key: Key, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> SharedNext:
        slots = np.full(self.max_size, NO_VALUE, dtype=I64)
        pool = torch.empty((0, *shape), dtype=dtype, device=self.device)
        return SharedNext(obs_key, next_key, slots, pool, resize_in_memory)

    def _new_objects(self, index: int, key: Key) -> np.ndarray:
        return np.empty(self.max_size, dtype=object)

    def allocate(self, schema: Schema) -> None:
        """Create the columns of ``schema`` (first batch only)."""
        if self.schema is not None:
            raise RuntimeError("storage already allocated")
        shared = dict((nxt, obs) for obs, nxt in self.shared_pairs(schema))
        entries = list(schema.entries.items())
        self.columns = {
            key: self._new_column(i, dtype, shape)
            for i, (key, (dtype, shape)) in enumerate(entries)
            if key not in shared
        }
        self.shared = {
            key: self._new_shared(i, shared[key], key, dtype, shape)
            for i, (key, (dtype, shape)) in enumerate(entries)
            if key in shared
        }
        self.objects = {key: self._new_objects(j, key) for j, key in enumerate(schema.objects)}
        self._views = {key: numpy_view(column) for key, column in self.columns.items()}
        self.schema = schema

    def check_write(self, schema: Schema, objects: Objects) -> None:
        """Raise, before anything is written, if this storage cannot hold the batch (a
        ``dedup_next`` key without its pair; memory-mapped storages: objects that are not
        text)."""
        if schema is not self.schema:  # the storage's own schema was checked when allocated
            self.shared_pairs(schema)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the stored steps: tensor columns, shared next columns (pool
        and slots) and object columns (their pointers; the objects themselves not counted)."""
        total = sum(c.numel() * c.element_size() for c in self.columns.values())
        total += sum(pair.nbytes for pair in self.shared.values())
        return total + sum(values.nbytes for values in self.objects.values())

    # ------------------------------------------------------------------ data
    def _ring_rows(self, start_row: int, n: int) -> np.ndarray:
        rows = np.arange(start_row, start_row + n, dtype=I64)
        rows[rows >= self.max_size] -= self.max_size
        return rows

    def write(self, start_row: int, columns: Rows, objects: Objects | None = None) -> None:
        """Copy ``columns`` (tensors, or numpy arrays of the same dtypes) and ``objects``
        (``n <= max_size`` rows, every key of the schema) to rows ``start_row, ...``
        (wrapping)."""
        first = next(iter(columns.values()), None)
        n = first.shape[0] if first is not None else next(iter((objects or {}).values())).size
        head = min(n, self.max_size - start_row)
        views = self._views
        for key, dest in self.columns.items():
            src, view = columns[key], views[key]
            if head < n:
                put_rows(dest, start_row, src[:head], view)
                put_rows(dest, 0, src[head:], view)
            elif view is not None and isinstance(src, np.ndarray):  # (put_rows, inlined)
                view[start_row : start_row + n] = src
            else:
                put_rows(dest, start_row, src, view)
        if not (self.shared or objects):
            return
        rows = self._ring_rows(start_row, n)
        for key, pair in self.shared.items():
            obs, nxt = as_tensor(columns[pair.obs_key]), as_tensor(columns[key])
            pair.write(rows, obs.to(self.device), nxt.to(self.device))
        for key, values in (objects or {}).items():
            self._write_objects(key, rows, values)

    def _write_objects(self, key: Key, rows: np.ndarray, values: np.ndarray) -> None:
        self.objects[key][rows] = values

    def set_rows(self, rows: Tensor, columns: Columns, objects: Objects | None = None) -> None:
        """Overwrite some keys at some rows in place (``rows``: int64 on the CPU, in range;
        ``columns``/``objects``: a subset of the keys, ``[len(rows), ...]``)."""
        r = rows.numpy()
        for pair in self.shared.values():  # before k changes, keep what reads it as next
            if pair.obs_key in columns:
                pair.before_obs_write(r, self.columns[pair.obs_key])
        for key, pair in self.shared.items():
            if key in columns:
                pair.set_next(r, columns[key])
        on_device = rows.to(self.device) if self.device.type != "cpu" else rows
        for key, value in columns.items():
            if key in self.columns:
                self.columns[key][on_device] = value.to(self.device)
        for key, values in (objects or {}).items():
            self._write_objects(key, r, values)

    def gather(self, rows: Tensor, keys: Collection[Key] | None = None) -> Columns:
        """The given rows of every tensor key, in schema order (``rows``: int64 on the CPU,
        values in range, rows holding data); ``keys``: only these stored keys."""
        on_device = rows.to(self.device) if self.device.type != "cpu" else rows
        columns = self.columns
        if keys is not None:
            columns = {key: column for key, column in columns.items() if key in keys}
        plain = take_rows_of(columns, on_device, self._views)
        if not self.shared or self.schema is None:
            return plain
        out: Columns = {}
        for key in self.schema.entries:
            if keys is not None and key not in keys:
                continue
            pair = self.shared.get(key)
            if pair is None:
                out[key] = plain[key]
            else:
                out[key] = pair.gather(rows, self.columns[pair.obs_key])
        return out

    def gather_objects(self, rows: Tensor, keys: Collection[Key] | None = None) -> Objects:
        """The given rows of every object key (``[len(rows)]`` object arrays); ``keys``:
        only these stored keys."""
        if not self.objects:
            return {}
        picks = rows.numpy()
        return {
            key: np.take(values, picks)
            for key, values in self.objects.items()
            if keys is None or key in keys
        }

    def column(self, key: Key) -> Tensor:
        """The whole ``[max_size, ...]`` column of tensor key ``key`` (rebuilt for a shared
        next key; rows holding nothing are arbitrary)."""
        pair = self.shared.get(key)
        if pair is None:
            return self.columns[key]
        return pair.column(self.columns[pair.obs_key])

    def load(self, columns: Columns, objects: Objects, live_rows: np.ndarray) -> None:
        """Replace the stored data by whole columns (``[max_size, ...]`` per tensor key,
        ``[max_size]`` object arrays per object key); ``live_rows`` are the rows holding data,
        oldest first (a buffer's restore)."""
        for key, dest in self.columns.items():
            dest.copy_(columns[key])
        for key, pair in self.shared.items():
            pair.load(live_rows, self.columns[pair.obs_key], columns[key].to(self.device))
        for key, values in objects.items():
            self._load_objects(key, values, live_rows)

    def _load_objects(self, key: Key, values: np.ndarray, live_rows: np.ndarray) -> None:
        self.objects[key][:] = values

    # ------------------------------------------------------------------ durability hooks
    def stage(self, state: CommitState) -> None:
        """Called before a write changes anything, with the state :meth:`commit` will receive
        after it. Memory-mapped storages write their metadata here (to a temporary file), so
        that a full disk fails (``OSError``) while the buffer is still unchanged."""

    def begin_write(self, rows: np.ndarray) -> None:
        """Called before rows are overwritten (memory-mapped storages mark them)."""

    def commit(self, state: CommitState) -> None:
        """Called after a complete write with the buffer's small bookkeeping state (the one
        given to :meth:`stage`)."""

    def recovered(self) -> CommitState | None:
        """State to reopen from (memory-mapped storages with existing data), else None."""
        return None


class LazyTensorStorage(Storage):
    """In-memory storage of ``max_size`` steps, allocated from the first batch.

    Args:
        max_size: capacity in steps (transitions); the oldest steps are overwritten first.
        device: device of the stored tensors (default CPU).
        ndim: accepted for TorchRL compatibility; must be 1 (see :class:`Storage`).
        dedup_next: store each next observation once (default True; see :class:`Storage`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2)
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(6.0)}, batch_size=[6]))
        >>> len(rb), rb.write_count  # the ring keeps the 4 newest steps
        (4, 6)
        >>> rb.storage.columns[("observation",)]
        tensor([4., 5., 2., 3.])

        Pixels are stored once: ``("next", "pixels")`` only where it is not the next step's
        ``"pixels"`` (here the last step of the episode and of the batch), rebuilt on reads:

        >>> pixels = torch.randint(0, 255, (9, 84, 84), dtype=torch.uint8)
        >>> steps = TensorDict(
        ...     {"pixels": pixels[:8], ("next", "pixels"): pixels[1:].clone()}, batch_size=[8]
        ... )
        >>> steps["next", "pixels"][3] = 0  # an episode ends at step 3: a final observation
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> rows = rb.extend(steps)
        >>> rb.storage.shared[("next", "pixels")].pool_rows_used  # steps 3 and 7
        2
        >>> torch.equal(rb[rows]["next", "pixels"], steps["next", "pixels"])
        True
        >>> rb.storage.nbytes < 0.6 * 2 * 100 * 84 * 84  # vs storing both columns
        True
    """
