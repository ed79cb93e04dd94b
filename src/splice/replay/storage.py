"""Storages: a ring of ``max_size`` rows, one column per key, allocated from the first batch.

* :class:`LazyTensorStorage` keeps the rows in memory (optionally on a device);
* :class:`LazyMemmapStorage` keeps them in memory-mapped files under ``scratch_dir`` and is
  crash safe: a process killed in the middle of ``extend`` leaves a directory that reopens at
  its last completed extend. Its files are preallocated, so a full disk is an ``OSError``
  before anything changed (never a ``SIGBUS``), and a directory is checked before it is
  trusted on reopening.

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
import os
import shutil
import tempfile
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from splice.replay._files import file_tensor, read_json, stage_json, write_json_atomic
from splice.replay._objects import TextLog, check_text
from splice.replay._state import as_int
from splice.replay._structures import I64
from splice.replay._validate import check_keys, recover_commit

__all__ = ["CommitState", "LazyMemmapStorage", "LazyTensorStorage", "Storage"]


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


class LazyMemmapStorage(Storage):
    """Storage of ``max_size`` steps in memory-mapped files under ``scratch_dir``.

    One raw file per tensor key (a shared next key: its slots and its pool), a text log per
    object key (plus the rows' trajectory keys and write sequence numbers) and a ``meta.json``
    that is rewritten atomically *after* every completed extend. An extend first marks the rows
    it is about to overwrite, then writes the data, then the metadata; so a process killed at
    any point leaves a directory that reopens at its last completed extend. The rows an
    interrupted extend was overwriting (the oldest ones of a full buffer) are dropped, as that
    extend was about to drop them anyway.

    Passing the ``scratch_dir`` of an existing buffer reopens it (same ``max_size``, and the
    same ``dedup_next`` if given; left out, the directory's layout is used). The
    directory is checked first: ``meta.json`` (every field's type and range), each file's
    size, the write sequence numbers of the rows against the committed state, and the rows'
    trajectory keys against the stored ids or end flags; anything inconsistent is a
    ``ValueError`` that names the file and the field.

    The files are preallocated when they are created (and their blocks reserved when they are
    reopened): on a full disk, the constructor or the first ``extend`` raises an ``OSError``
    naming the file, and the metadata of every extend is written to a temporary file before
    the extend changes anything, so a disk that fills up later makes an ``extend`` raise
    ``OSError`` with the buffer unchanged, instead of killing the process with ``SIGBUS``.

    Non-tensor entries are stored as text (``str`` or ``None`` values; anything else is
    refused by name, before anything is written): no pickle is used.

    In-place writes (``rb[i] = ...``, ``set_at_``, ``update_``) go straight to the files and
    are not crash atomic: a process killed in the middle may leave those rows half updated.

    Args:
        max_size: capacity in steps.
        scratch_dir: directory of the files; a fresh temporary directory when None.
        auto_cleanup: delete the directory (the whole ``scratch_dir``) when the storage is
            garbage collected or the interpreter exits normally (also after Ctrl-C; not on
            SIGTERM or SIGKILL). Default: True for a temporary directory, False for a given
            ``scratch_dir`` (whose point is to outlive the process). :meth:`cleanup` deletes
            it on demand.
        device: accepted for TorchRL compatibility; must be the CPU.
        ndim: accepted for TorchRL compatibility; must be 1 (see :class:`Storage`).
        dedup_next: store each next observation once (default True for a new directory;
            see :class:`Storage`).

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyMemmapStorage, ReplayBuffer
        >>> path = tempfile.mkdtemp()
        >>> rb = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=path))
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(3.0)}, batch_size=[3]))
        >>> del rb
        >>> again = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=path))
        >>> len(again), again[1]["observation"]
        (3, tensor(1.))
        >>> again.storage.cleanup()  # the files are deleted
        True
    """

    FORMAT = "splice.memmap/2"
    FORMATS = ("splice.memmap/1", FORMAT)  # /1: no shared next columns, no object columns

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: str | Path | None = None,
        auto_cleanup: bool | None = None,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        dedup_next: DedupNext | None = None,
    ) -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"LazyMemmapStorage keeps its data in files on the CPU (device={device!r}); "
                "move samples to the device yourself"
            )
        super().__init__(
            max_size, device="cpu", ndim=ndim, dedup_next=True if dedup_next is None else dedup_next
        )
        self._dedup_given = dedup_next is not None
        if auto_cleanup is not None and not isinstance(auto_cleanup, bool):
            raise TypeError(f"auto_cleanup must be a bool, got {type(auto_cleanup).__name__}")
        if scratch_dir is None:
            scratch_dir = tempfile.mkdtemp(prefix="splice-memmap-")
            auto_cleanup = True if auto_cleanup is None else auto_cleanup
        self.scratch_dir = Path(scratch_dir)
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        self.auto_cleanup = bool(auto_cleanup)
        self._finalizer = (
            weakref.finalize(self, shutil.rmtree, str(self.scratch_dir), True)
            if self.auto_cleanup
            else None
        )
        self._meta_path = self.scratch_dir / "meta.json"
        self._seq = 0
        self._meta: dict[str, object] | None = None
        self._commit: CommitState | None = None
        self._staged: tuple[CommitState, dict[str, object], Path] | None = None
        self._cleaned = False
        self._maps: dict[str, np.memmap] = {}
        self._logs: dict[Key, TextLog] = {}
        self._opening = False
        if self._meta_path.exists():
            self._open()
        else:
            self.row_key = self._index_file("rows_key.bin", create=True)
            self.row_seq = self._index_file("rows_seq.bin", create=True)
            self.row_seq.fill(0)

    # ------------------------------------------------------------------ files
    def _map(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], create: bool) -> Tensor:
        tensor, raw = file_tensor(self.scratch_dir / name, dtype, shape, create=create)
        if raw is not None:
            self._maps[name] = raw
        return tensor

    def _index_file(self, name: str, *, create: bool) -> np.ndarray:
        return self._map(name, torch.int64, (self.max_size,), create).numpy()

    def _new_column(self, index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
        return self._map(f"col_{index:03d}.bin", dtype, (self.max_size, *shape), not self._opening)

    def _new_shared(
        self, index: int, obs_key: Key, next_key: Key, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> SharedNext:
        create = not self._opening
        slots = self._index_file(f"col_{index:03d}.slot.bin", create=create)
        if create:
            slots.fill(NO_VALUE)
        name = f"col_{index:03d}.pool.bin"
        row_bytes = math.prod(shape) * dtype.itemsize
        path = self.scratch_dir / name
        rows = path.stat().st_size // row_bytes if path.exists() and row_bytes else 0
        pool = self._map(name, dtype, (rows, *shape), create=rows == 0)

        def resize(old: Tensor, new_rows: int) -> Tensor:
            with open(path, "ab") as f:  # grow the file; its contents stay
                f.truncate(new_rows * row_bytes)
            return self._map(name, dtype, (new_rows, *shape), create=False)

        return SharedNext(obs_key, next_key, slots, pool, resize)

    def _new_objects(self, index: int, key: Key) -> np.ndarray:
        def refs(path: Path, create: bool) -> np.ndarray:
            return self._map(path.name, torch.int64, (self.max_size, 2), create).numpy()

        state = self._text_state(index) if self._opening else {"gen": 0, "size": 0}
        log = TextLog(
            self.scratch_dir,
            f"obj_{index:03d}",
            refs,
            gen=state["gen"],
            size=state["size"],
            create=not self._opening,
        )
        self._logs[key] = log
        return log.values

    def _text_state(self, index: int) -> dict[str, int]:
        assert self._meta is not None
        states = self._meta.get("text")
        if not isinstance(states, list) or index >= len(states):
            raise ValueError(f"{self._meta_path}: no text log state for object column {index}")
        state = states[index]
        if not isinstance(state, dict):
            raise ValueError(f"{self._meta_path}: bad text log state {state!r}")
        where = f"{self._meta_path}: text log {index}"
        return {"gen": as_int(state.get("gen"), where), "size": as_int(state.get("size"), where)}

    def _open(self) -> None:
        """Map the files of an existing directory and check them (see the class docs)."""
        where = str(self._meta_path)
        meta = read_json(self._meta_path)
        if meta.get("format") not in self.FORMATS:
            raise ValueError(
                f"{where}: format {meta.get('format')!r} is not a splice memmap storage "
                f"({self.FORMAT!r})"
            )
        capacity = as_int(meta.get("capacity"), f"{where}: capacity")
        if capacity != self.max_size:
            raise ValueError(
                f"{self.scratch_dir} holds a storage of max_size {capacity}, not {self.max_size}"
            )
        schema_json = meta.get("schema")
        schema = None
        if schema_json is not None:
            try:
                schema = Schema.from_json(schema_json)
            except ValueError as err:
                raise ValueError(f"{where}: schema: {err}") from err
        commit = CommitState.from_json(meta.get("buffer"), f"{where}: buffer")
        self._meta = meta  # the text logs' states, read while the columns are mapped
        self.row_key = self._index_file("rows_key.bin", create=False)
        self.row_seq = self._index_file("rows_seq.bin", create=False)
        if schema is not None:
            self._open_columns(schema, meta.get("shared", []))
        write_count, lo, self._seq = recover_commit(
            commit.write_count,
            commit.lo,
            meta.get("seq"),
            np.asarray(self.row_seq),
            meta_where=where,
            seq_where=str(self.scratch_dir / "rows_seq.bin"),
        )
        bounds = None if commit.boundaries is None else Boundaries.from_json(commit.boundaries)
        if write_count > lo and (self.schema is None or commit.kind is None):
            raise ValueError(f"{where}: rows are stored but there is no schema or kind")
        check_keys(
            np.asarray(self.row_key),
            lo,
            write_count,
            bounds,
            self.columns,
            keys_where=str(self.scratch_dir / "rows_key.bin"),
            column_where=self._column_files(),
        )
        self._commit = CommitState(write_count, lo, commit.boundaries, commit.kind)

    def _open_columns(self, schema: Schema, stored: object) -> None:
        if not isinstance(stored, list) or not all(isinstance(k, list) for k in stored):
            raise ValueError(f"{self._meta_path}: bad shared next keys {stored!r}")
        stored_keys = [tuple(k) for k in stored]
        if not self._dedup_given:  # the directory's layout
            self.dedup_next = tuple(k[1:] for k in stored_keys)
        wanted = [nxt for _, nxt in self.shared_pairs(schema)]
        if wanted != stored_keys:
            raise ValueError(
                f"{self.scratch_dir} stores the next value once for "
                f"[{', '.join(fmt_key(k) for k in stored_keys)}]; dedup_next="
                f"{self.dedup_next!r} asks for [{', '.join(fmt_key(k) for k in wanted)}] (leave "
                "dedup_next out to reopen the directory as it is)"
            )
        self._opening = True
        try:
            self.allocate(schema)
        finally:
            self._opening = False

    def _column_files(self) -> dict[tuple[str, ...], str]:
        if self.schema is None:
            return {}
        return {
            key: str(self.scratch_dir / f"col_{i:03d}.bin")
            for i, key in enumerate(self.schema.entries)
        }

    def recovered(self) -> CommitState | None:
        """The last committed state (checked on opening), with the rows of an interrupted
        extend dropped; the storage's own bookkeeping (text logs, free pool slots) is rebuilt
        to match it."""
        state = self._commit
        if state is None:
            return None
        live = np.arange(state.lo, state.write_count, dtype=I64) % self.max_size
        for pair in self.shared.values():
            pair.recover(live)
        for log in self._logs.values():
            log.reopen(live)
            log.remove_stale()
        return state

    def _live_rows(self) -> np.ndarray:
        """Rows holding data at the last commit (oldest first)."""
        state = self._commit
        if state is None:
            return np.empty(0, dtype=I64)
        return np.arange(state.lo, state.write_count, dtype=I64) % self.max_size

    def begin_write(self, rows: np.ndarray) -> None:
        # Mark first: a row whose sequence number is newer than the committed one may hold
        # a torn write and is dropped on reopening.
        self.row_seq[rows] = self._seq + 1

    def _meta_doc(self, state: CommitState, seq: int) -> dict[str, object]:
        return {
            "format": self.FORMAT,
            "capacity": self.max_size,
            "schema": None if self.schema is None else self.schema.to_json(),
            "shared": [list(k) for k in self.shared],
            "text": [log.committed() for log in self._logs.values()],
            "seq": seq,
            "buffer": state.to_json(),
        }

    def stage(self, state: CommitState) -> None:
        self._check_usable()
        doc = self._meta_doc(state, self._seq + 1)
        self._staged = (state, doc, stage_json(self._meta_path, doc))

    def commit(self, state: CommitState) -> None:
        staged, self._staged = self._staged, None
        if staged is not None and staged[0] == state and not self._logs:
            doc, tmp = staged[1], staged[2]
        else:
            doc = self._meta_doc(state, self._seq + 1)
            tmp = stage_json(self._meta_path, doc)
        self._install_meta(doc, tmp)
        self._seq += 1
        self._commit = state

    def _install_meta(self, doc: dict[str, object], staged: Path) -> None:
        """Make the staged ``meta.json`` (``doc``, written to ``staged``) the committed one;
        text written since the previous one becomes the logs' committed text."""
        os.replace(staged, self._meta_path)
        self._meta = doc
        for log in self._logs.values():
            log.remove_stale()

    def flush(self) -> None:
        """Force the files to disk (``msync`` + ``fsync``), for durability across power cuts.

        Not needed to survive a killed process: the page cache keeps what was written.
        """
        for raw in self._maps.values():
            raw.flush()
        for log in self._logs.values():
            log.sync()
        if self._meta is not None:
            write_json_atomic(self._meta_path, self._meta, fsync=True)

    def cleanup(self) -> bool:
        """Delete ``scratch_dir`` and everything in it now; the storage cannot be used
        afterwards (``RuntimeError``).

        Returns:
            True if stored data was deleted; False if there was none (never written, the
            directory already gone, or cleaned up before).
        """
        if self._cleaned:
            return False
        self._cleaned = True
        had_data = self._meta_path.exists()
        self._maps.clear()
        self.columns, self.objects, self.shared, self._logs, self._views = {}, {}, {}, {}, {}
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        shutil.rmtree(self.scratch_dir, ignore_errors=True)
        return had_data

    def _check_usable(self) -> None:
        if self._cleaned:
            raise RuntimeError(f"the storage in {self.scratch_dir} was cleaned up")

    def allocate(self, schema: Schema) -> None:
        """Create (and preallocate) one file per key; on failure (a full disk: ``OSError``
        naming the file) the files created are removed and the storage stays unallocated."""
        self._check_usable()
        before = set(self._maps)
        try:
            super().allocate(schema)
        except BaseException:
            created = set(self._maps) - before
            for name in created:
                del self._maps[name]
            if not self._opening:  # remove what this call created (never a reopened file)
                for name in created | {f"col_{i:03d}.bin" for i in range(len(schema.entries))}:
                    (self.scratch_dir / name).unlink(missing_ok=True)
            raise

    def check_write(self, schema: Schema, objects: Objects) -> None:
        super().check_write(schema, objects)
        for key, values in objects.items():
            check_text(values, key, "LazyMemmapStorage")

    def write(self, start_row: int, columns: Rows, objects: Objects | None = None) -> None:
        self._check_usable()
        super().write(start_row, columns, objects)

    def _write_objects(self, key: Key, rows: np.ndarray, values: np.ndarray) -> None:
        self._logs[key].write(rows, values, self._live_rows)

    def _load_objects(self, key: Key, values: np.ndarray, live_rows: np.ndarray) -> None:
        check_text(values[live_rows], key, "LazyMemmapStorage")
        self.objects[key][:] = None
        self._logs[key].write(live_rows, values[live_rows], self._live_rows)

    def set_rows(self, rows: Tensor, columns: Columns, objects: Objects | None = None) -> None:
        self._check_usable()
        for key, values in (objects or {}).items():
            check_text(values, key, "LazyMemmapStorage")
        super().set_rows(rows, columns, objects)
        if objects and self._commit is not None:
            self._record_text_logs()

    def _record_text_logs(self) -> None:
        """Rewrite ``meta.json`` with the text logs' new sizes after an in-place write (the
        same commit and write sequence number: no rows were appended)."""
        assert self._commit is not None
        doc = self._meta_doc(self._commit, self._seq)
        self._install_meta(doc, stage_json(self._meta_path, doc))

    def gather(self, rows: Tensor, keys: Collection[Key] | None = None) -> Columns:
        self._check_usable()
        return super().gather(rows, keys)
