"""``LazyMemmapStorage``: a storage in memory-mapped files, crash safe.

A process killed in the middle of ``extend`` leaves a directory that reopens at its last
completed extend. The files are preallocated, so a full disk is an ``OSError`` before anything
changed (never a ``SIGBUS``), and a directory is checked before it is trusted on reopening
(:mod:`splice.replay._validate`). Object columns are kept as text logs
(:mod:`splice.replay._objects`).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Collection
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from splice.layout import Key, fmt_key
from splice.replay._batch import Columns, Objects, Rows, Schema
from splice.replay._boundaries import Boundaries
from splice.replay._dedup import NO_VALUE, SharedNext
from splice.replay._files import file_tensor, read_json, stage_json, write_json_atomic
from splice.replay._objects import TextLog, check_text
from splice.replay._state import as_int
from splice.replay._structures import I64
from splice.replay._validate import check_keys, recover_commit
from splice.replay.storage import CommitState, DedupNext, Storage

__all__ = ["LazyMemmapStorage"]


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
        ndim: accepted for TorchRL compatibility; must be 1 (see :class:`~splice.replay.Storage`).
        dedup_next: store each next observation once (default True for a new directory;
            see :class:`~splice.replay.Storage`).

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
