"""Storages: a ring of ``max_size`` rows, one tensor per key, allocated from the first batch.

* :class:`LazyTensorStorage` keeps the rows in memory (optionally on a device);
* :class:`LazyMemmapStorage` keeps them in memory-mapped files under ``scratch_dir`` and is
  crash safe: a process killed in the middle of ``extend`` leaves a directory that reopens at
  its last completed extend.

A storage only holds data; which trajectory each row belongs to is tracked by the buffer's
index (:mod:`splice.replay.index`), whose per-row trajectory keys the storage keeps so that a
memory-mapped buffer can rebuild it on reopening.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from splice._gather import take_rows
from splice.replay._batch import Columns, Schema
from splice.replay._files import file_tensor, read_json, write_json_atomic
from splice.replay._state import as_int
from splice.replay._structures import I64

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
    def from_json(doc: object) -> CommitState:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: not a document written by :meth:`to_json`.
        """
        if not isinstance(doc, dict):
            raise ValueError(f"commit state: expected an object, got {type(doc).__name__}")
        bounds, kind = doc.get("boundaries"), doc.get("kind")
        if bounds is not None and not isinstance(bounds, dict):
            raise ValueError(f"commit state: bad boundaries {bounds!r}")
        if kind is not None and not isinstance(kind, str):
            raise ValueError(f"commit state: bad kind {kind!r}")
        return CommitState(
            as_int(doc.get("write_count"), "write_count"), as_int(doc.get("lo"), "lo"), bounds, kind
        )


class Storage:
    """Base class of the storages: a ring of ``max_size`` rows with lazily allocated columns.

    Args:
        max_size: capacity in steps (transitions).
        device: where the columns live.
        ndim: accepted for TorchRL compatibility; must be 1 (steps are stored one per row;
            a ``[B, T]`` batch is stored env-major, so no ``ndim=2`` is needed).
    """

    def __init__(self, max_size: int, *, device: torch.device | str = "cpu", ndim: int = 1) -> None:
        if not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be a positive int, got {max_size!r}")
        if ndim != 1:
            raise ValueError(
                f"ndim={ndim!r}: splice storages keep one step per row (ndim=1); a [B, T] "
                "batch is stored env-major and trajectories are tracked by the buffer's index"
            )
        self.max_size = max_size
        self.device = torch.device(device)
        self.schema: Schema | None = None
        self.columns: Columns = {}
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
    def _new_column(self, index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
        return torch.empty((self.max_size, *shape), dtype=dtype, device=self.device)

    def allocate(self, schema: Schema) -> None:
        """Create one column per schema entry (first batch only)."""
        if self.schema is not None:
            raise RuntimeError("storage already allocated")
        self.columns = {
            key: self._new_column(i, dtype, shape)
            for i, (key, (dtype, shape)) in enumerate(schema.entries.items())
        }
        self.schema = schema

    # ------------------------------------------------------------------ data
    def write(self, start_row: int, columns: Columns) -> None:
        """Copy ``columns`` (``n <= max_size`` rows) to rows ``start_row, ...`` (wrapping)."""
        first = next(iter(columns.values()))
        n = first.shape[0]
        head = min(n, self.max_size - start_row)
        for key, dest in self.columns.items():
            src = columns[key]
            if src.device != dest.device:
                src = src.to(dest.device)
            dest[start_row : start_row + head].copy_(src[:head])
            if head < n:
                dest[: n - head].copy_(src[head:])

    def set_rows(self, rows: Tensor, columns: Columns) -> None:
        """Overwrite some keys at some rows in place (``rows``: int64 on the CPU, in range;
        ``columns``: a subset of the keys, ``[len(rows), ...]``)."""
        if self.device.type != "cpu":
            rows = rows.to(self.device)
        for key, value in columns.items():
            self.columns[key][rows] = value.to(self.device)

    def gather(self, rows: Tensor) -> Columns:
        """The given rows of every column (``rows``: int64 on the CPU, values in range)."""
        if self.device.type != "cpu":
            rows = rows.to(self.device)
        return {key: take_rows(col, rows) for key, col in self.columns.items()}

    # ------------------------------------------------------------------ durability hooks
    def begin_write(self, rows: np.ndarray) -> None:
        """Called before rows are overwritten (memory-mapped storages mark them)."""

    def commit(self, state: CommitState) -> None:
        """Called after a complete write with the buffer's small bookkeeping state."""

    def recovered(self) -> CommitState | None:
        """State to reopen from (memory-mapped storages with existing data), else None."""
        return None


class LazyTensorStorage(Storage):
    """In-memory storage of ``max_size`` steps, allocated from the first batch.

    Args:
        max_size: capacity in steps (transitions); the oldest steps are overwritten first.
        device: device of the stored tensors (default CPU).
        ndim: accepted for TorchRL compatibility; must be 1 (see :class:`Storage`).

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
    """


class LazyMemmapStorage(Storage):
    """Storage of ``max_size`` steps in memory-mapped files under ``scratch_dir``.

    One raw file per key (plus the rows' trajectory keys and write sequence numbers) and a
    ``meta.json`` that is rewritten atomically *after* every completed extend. An extend first
    marks the rows it is about to overwrite, then writes the data, then the metadata; so a
    process killed at any point leaves a directory that reopens at its last completed extend.
    The rows an interrupted extend was overwriting (the oldest ones of a full buffer) are
    dropped, as that extend was about to drop them anyway.

    Passing the ``scratch_dir`` of an existing buffer reopens it (same ``max_size``).
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

    FORMAT = "splice.memmap/1"

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: str | Path | None = None,
        auto_cleanup: bool | None = None,
        device: torch.device | str = "cpu",
        ndim: int = 1,
    ) -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"LazyMemmapStorage keeps its data in files on the CPU (device={device!r}); "
                "move samples to the device yourself"
            )
        super().__init__(max_size, device="cpu", ndim=ndim)
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
        self._cleaned = False
        self._maps: list[np.memmap] = []
        if self._meta_path.exists():
            self._open()
        else:
            self.row_key = self._index_file("rows_key.bin", create=True)
            self.row_seq = self._index_file("rows_seq.bin", create=True)
            self.row_seq.fill(0)

    def _map(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], create: bool) -> Tensor:
        tensor, raw = file_tensor(self.scratch_dir / name, dtype, shape, create=create)
        if raw is not None:
            self._maps.append(raw)
        return tensor

    def _index_file(self, name: str, *, create: bool) -> np.ndarray:
        return self._map(name, torch.int64, (self.max_size,), create).numpy()

    def _new_column(self, index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
        return self._map(f"col_{index:03d}.bin", dtype, (self.max_size, *shape), True)

    def _open(self) -> None:
        meta = read_json(self._meta_path)
        if meta.get("format") != self.FORMAT:
            raise ValueError(f"{self._meta_path}: not a splice memmap storage")
        if meta["capacity"] != self.max_size:
            raise ValueError(
                f"{self.scratch_dir} holds a storage of max_size {meta['capacity']}, "
                f"not {self.max_size}"
            )
        self.row_key = self._index_file("rows_key.bin", create=False)
        self.row_seq = self._index_file("rows_seq.bin", create=False)
        schema = meta.get("schema")
        if schema is not None:
            self.schema = Schema.from_json(schema)
            self.columns = {
                key: self._map(f"col_{i:03d}.bin", dtype, (self.max_size, *shape), False)
                for i, (key, (dtype, shape)) in enumerate(self.schema.entries.items())
            }
        self._seq = as_int(meta.get("seq"), f"{self._meta_path}: seq")
        self._commit = CommitState.from_json(meta.get("buffer"))
        self._meta = meta

    def recovered(self) -> CommitState | None:
        """The last committed state, with the rows of an interrupted extend dropped."""
        state = self._commit
        if state is None:
            return None
        rows = np.arange(state.lo, state.write_count, dtype=I64) % self.max_size
        torn = np.flatnonzero(self.row_seq[rows] > self._seq)
        if torn.size:
            # An interrupted extend was overwriting the oldest rows: drop up to the last one.
            lo = state.lo + int(torn[-1]) + 1
            return CommitState(state.write_count, lo, state.boundaries, state.kind)
        return state

    def begin_write(self, rows: np.ndarray) -> None:
        # Mark first: a row whose sequence number is newer than the committed one may hold
        # a torn write and is dropped on reopening.
        self.row_seq[rows] = self._seq + 1

    def commit(self, state: CommitState) -> None:
        self._seq += 1
        meta: dict[str, object] = {
            "format": self.FORMAT,
            "capacity": self.max_size,
            "schema": None if self.schema is None else self.schema.to_json(),
            "seq": self._seq,
            "buffer": state.to_json(),
        }
        write_json_atomic(self._meta_path, meta)
        self._meta = meta
        self._commit = state

    def flush(self) -> None:
        """Force the files to disk (``msync`` + ``fsync``), for durability across power cuts.

        Not needed to survive a killed process: the page cache keeps what was written.
        """
        for raw in self._maps:
            raw.flush()
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
        self.columns = {}
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        shutil.rmtree(self.scratch_dir, ignore_errors=True)
        return had_data

    def _check_usable(self) -> None:
        if self._cleaned:
            raise RuntimeError(f"the storage in {self.scratch_dir} was cleaned up")

    def allocate(self, schema: Schema) -> None:
        self._check_usable()
        super().allocate(schema)

    def write(self, start_row: int, columns: Columns) -> None:
        self._check_usable()
        super().write(start_row, columns)

    def set_rows(self, rows: Tensor, columns: Columns) -> None:
        self._check_usable()
        super().set_rows(rows, columns)

    def gather(self, rows: Tensor) -> Columns:
        self._check_usable()
        return super().gather(rows)
