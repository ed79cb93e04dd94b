"""The write path of a replay buffer, as one object: :class:`Writer`.

An ``extend`` is two calls, :meth:`Writer.prepare` outside the buffer's lock and
:meth:`Writer.store` under it, so that a sampling thread waits only for the copies and the
bookkeeping:

* **prepare** changes nothing. It takes the batch in (a TensorDict, tensor or dict), finds
  the trajectory boundaries on the buffer's first batch (:func:`resolve_boundaries`),
  flattens and checks it (:class:`~splice.replay._batch.Flattener`), gives every step its
  trajectory key (:meth:`Boundaries.keys_for`) and plans the write
  (:meth:`ReplayIndex.plan`: each trajectory of the batch in one run of rows), with the
  columns in that order.
* **store** copies the rows into the storage, records them in the index, tells the sampler
  (:meth:`Sampler.on_write`) and has the storage commit its state (the storage's durability
  hooks ``stage``, ``begin_write`` and ``commit``). A batch prepared before another thread's
  first write or a restore is prepared again; with end flags, a batch whose keys continue
  trajectories that another write has extended since is keyed again.

The writer makes the buffer's other changes too — in-place writes, ``empty`` and restoring a
snapshot — and owns what a write changes besides the storage and the index: the boundary
state and the kind of container the buffer holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice._gather import take_rows
from splice._non_tensor import non_tensor_values
from splice.layout import CUT, Key, LayoutError, all_leaves, as_key_tuple, fmt_key
from splice.replay._batch import (
    Arrays,
    Columns,
    FlatBatch,
    Flattener,
    Kind,
    Objects,
    Rows,
    Schema,
    as_tensordict,
    kind_of,
)
from splice.replay._boundaries import Boundaries, resolve_boundaries
from splice.replay._persist import Snapshot, check_snapshot
from splice.replay._structures import I64
from splice.replay.index import ReplayIndex, WritePlan
from splice.replay.samplers import Sampler
from splice.replay.storage import CommitState, Storage

__all__ = ["Index", "Placement", "Prepared", "Writer", "place"]

#: Storage rows as ``rb[index]`` addresses them.
Index = int | slice | Sequence[int] | Tensor | np.ndarray


class Writer:
    """Every change to a replay buffer's stored steps (see the module docs).

    Everything but :meth:`prepare` runs under the buffer's lock (the caller takes it).

    Args:
        storage: the buffer's storage: its committed state, if any, is recovered, then it is
            claimed for ``owner``.
        sampler: the buffer's sampler: attached to the index (with ``batch_size``) and told
            of every write; its ``traj_key``, ``end_key`` and ``needs_trajectories`` decide
            the boundaries at the first write.
        owner: the replay buffer.
        batch_size: the buffer's default batch size.

    Attributes:
        index: the trajectory index of the stored rows.
        bounds: the boundary state (None before the first write).
        kind: the kind of container the buffer holds (None before the first write).
    """

    def __init__(
        self, storage: Storage, sampler: Sampler, *, owner: object, batch_size: int | None
    ) -> None:
        self.storage = storage
        self.sampler = sampler
        self.index = ReplayIndex(storage.max_size, row_key=storage.row_key)
        self.bounds: Boundaries | None = None
        self.kind: Kind | None = None
        self._cpu_storage = storage.device.type == "cpu"
        self._flattener = Flattener(as_arrays=self._cpu_storage)
        #: Whether the storage's durability hooks (``stage``, ``begin_write``, ``commit``)
        #: may do anything: a write skips building their arguments when the storage has the
        #: base class's no-op for all three (an override in a subclass or on the instance
        #: counts).
        self._durable = any(
            getattr(getattr(storage, hook), "__func__", None) is not getattr(Storage, hook)
            for hook in ("stage", "begin_write", "commit")
        )
        recovered = storage.recovered()
        if recovered is not None:
            if recovered.boundaries is not None:
                self.bounds = Boundaries.from_json(recovered.boundaries)
            self.index.rebuild(recovered.lo, recovered.write_count)
            self.kind = kind_of(recovered.kind)
        storage.claim(owner)
        try:
            sampler.attach(self.index, batch_size)
        except BaseException:
            storage.release(owner)
            raise

    # ------------------------------------------------------------------ extend
    def prepare(self, data: object, *, single: bool = False) -> Prepared:
        """Take ``data`` in, flatten and check it, key and order its steps (changes nothing).

        Args:
            data: what ``extend`` (or, ``single``, ``add``) was given.
            single: ``data`` is one step, without a batch dim.

        Raises:
            TypeError: not a TensorDict, tensor or dict, or not the buffer's kind.
            LayoutError: the batch breaks the batch contract or does not match the buffer.
        """
        td, kind = as_tensordict(data, single=single)
        if single:
            td = td.unsqueeze(0)
        if self.kind is not None and kind is not self.kind:
            raise TypeError(
                f"this buffer holds {self.kind.value} data; got a {kind.value} "
                f"({type(td).__name__ if kind is Kind.TENSORDICT else kind.value})"
            )
        seen_bounds, seen_schema = self.bounds, self.storage.schema
        bounds = seen_bounds
        if bounds is None:
            sampler = self.sampler
            bounds = resolve_boundaries(
                td,
                traj_key=_key(sampler.traj_key),
                end_key=_key(sampler.end_key),
                needs_trajectories=sampler.needs_trajectories,
            )
        batch = self._flattener.flatten(td, bounds.ids_key, seen_schema)
        placement = place(bounds, batch)
        if placement is not None and placement.plan.min_key() < 0:
            # Ids are the keys: a batch that skipped the checks (laid out as the last one)
            # has padding or refused ids; the checks drop or refuse them.
            batch = self._flattener.flatten(td, bounds.ids_key, seen_schema, trust=False)
            placement = place(bounds, batch)
        schema = seen_schema if seen_schema is not None else Schema.of(batch.columns, batch.objects)
        return Prepared(
            data, single, kind, seen_bounds, seen_schema, bounds, schema, batch, placement
        )

    def store(self, prepared: Prepared) -> Tensor:
        """Write a prepared batch.

        Returns:
            For every input step (the input's batch shape), the storage row it was written
            to, or -1 for padding.

        Raises:
            LayoutError, TypeError: prepared again (see :meth:`prepare`), the batch no longer
                fits.
            ValueError, LayoutError: the storage cannot hold the batch
                (``Storage.check_write``).
            OSError: no space for a memory-mapped storage. Nothing changed.
        """
        if (
            prepared.seen_bounds is not self.bounds
            or prepared.seen_schema is not self.storage.schema
        ):
            # Prepared before another thread's first write or a restore: prepare again.
            prepared = self.prepare(prepared.data, single=prepared.single)
        bounds, batch, schema, kind = (
            prepared.bounds,
            prepared.batch,
            prepared.schema,
            prepared.kind,
        )
        storage, index = self.storage, self.index
        storage.check_write(schema, batch.objects)
        placement = prepared.placement
        if placement is None:  # no steps
            return torch.full(batch.input_shape, -1, dtype=torch.int64)
        if not placement.current(bounds):  # keys that another write's commit changed
            placement = place(bounds, batch)
            assert placement is not None
        n, capacity = batch.n, storage.max_size
        written: Rows = placement.columns
        objects = placement.objects
        if placement.arrays is not None:  # (made for a storage on the CPU only)
            written = placement.arrays
        elif not self._cpu_storage:  # (a CPU storage copies from any device itself)
            written = _on_device(placement.columns, storage.device)
        if n > capacity:
            written = {k: v[n - capacity :] for k, v in written.items()}
            objects = {k: v[n - capacity :] for k, v in objects.items()}
        start_row = (index.write_count + max(n - capacity, 0)) % capacity
        after = None
        if self._durable:  # the storage's durability hooks do something: give them their state
            wc = index.write_count + n
            after = CommitState(
                wc,
                max(index.lo, wc - capacity),
                bounds.json_with(placement.open_keys, placement.next_key),
                kind.value,
            )
        # Everything is validated. A full disk fails in allocate or stage, before anything
        # changed; from there on the write cannot fail half-way.
        if prepared.seen_schema is None:
            storage.allocate(schema)
        if after is not None:
            storage.stage(after)
            storage.begin_write(index.rows_for_write(n))
        storage.write(start_row, written, objects)
        report = index.write_plan(placement.plan)
        bounds.commit(placement.open_keys, placement.next_key)  # (the object prepare saw)
        self.bounds = bounds
        self.kind = kind
        self.sampler.on_write(report)
        if after is not None:
            storage.commit(after)
        order = placement.plan.order
        return _input_rows(report.new_rows, batch, order, index.write_count, capacity)

    # ------------------------------------------------------------------ other changes
    def rows(self, where: Index) -> Tensor:
        """Storage rows addressed like TorchRL's ``rb[index]`` (an int, slice, sequence,
        tensor or array): positions in the written part of the storage (all rows once the
        ring has been filled).

        Raises:
            IndexError: a position out of range, or a row that holds no stored step.
        """
        extent = min(self.index.write_count, self.storage.max_size)
        if isinstance(where, np.ndarray):
            where = torch.from_numpy(where)
        elif isinstance(where, list | tuple):
            where = torch.as_tensor(where)
        try:
            rows = torch.arange(extent)[where]
        except IndexError as err:
            raise IndexError(f"index {where!r} is out of range for {extent} rows") from err
        if (self.index.row_slot[rows.reshape(-1).numpy()] < 0).any():
            raise IndexError(f"row(s) {where!r} hold no stored step")
        return rows

    def check_kind(self, kind: Kind) -> None:
        """Raise ``TypeError`` if the buffer holds another kind of container."""
        if self.kind is not None and kind is not self.kind:
            raise TypeError(f"this buffer holds {self.kind.value} data; got a {kind.value}")

    def overwrite(self, rows: Tensor, td: TensorDictBase, key: NestedKey | None = None) -> None:
        """Validate, then write ``td`` (some or all of the stored keys) at storage ``rows``
        in place; ``td`` is shaped like ``rows``, or one step that expands to them (``key``:
        the one key of ``td``, whose tensor may carry the rows' dims already).

        Raises:
            IndexError: nothing is stored yet.
            LayoutError: unknown keys, wrong dtypes or shapes, or a change of the trajectory
                ids or end flags (boundaries cannot change in place). Nothing is written.
        """
        td = _expand(td, rows.shape, key).reshape(-1)
        rows = rows.reshape(-1)
        schema = self.storage.schema
        if schema is None:
            raise IndexError("the buffer holds no data to overwrite")
        if td.batch_size != rows.shape:
            raise LayoutError(
                f"in-place write: {rows.numel()} rows addressed, data has batch shape "
                f"{list(td.batch_size)}"
            )
        columns: Columns = {}
        objects: Objects = {}
        for leaf_key, value in all_leaves(td):
            if isinstance(value, Tensor):
                columns[leaf_key] = value
            elif value.batch_size == td.batch_size:
                objects[leaf_key] = non_tensor_values(value)
            else:
                raise LayoutError(
                    f"in-place write: key {fmt_key(leaf_key)} holds a non-tensor entry of batch "
                    f"shape {list(value.batch_size)}, not one object per row "
                    f"({list(td.batch_size)})"
                )
        schema.check(columns, objects, subset=True)
        self.storage.check_write(schema, objects)
        for bound in self._boundary_keys():
            if bound in columns:
                stored = self.storage.gather(rows)[bound]
                if not torch.equal(stored, columns[bound].to(stored.device)):
                    raise LayoutError(
                        f"key {fmt_key(bound)} delimits trajectories: it cannot change in place "
                        "(extend with the new data instead)"
                    )
        self.storage.set_rows(rows, columns, objects)

    def _boundary_keys(self) -> list[Key]:
        if self.bounds is None or self.bounds.key is None:
            return []
        keys = [self.bounds.key]
        if self.bounds.mode == "flags":
            keys.append(CUT)
        return keys

    def clear(self, batch_size: int | None) -> None:
        """Drop every stored step and reset the write count (the sampler is attached again
        with ``batch_size``)."""
        bounds = self.bounds
        after_bounds = None if bounds is None else Boundaries(bounds.mode, bounds.key)
        after = CommitState(
            0,
            0,
            None if after_bounds is None else after_bounds.to_json(),
            None if self.kind is None else self.kind.value,
        )
        self.storage.stage(after)
        self.index.reset()
        self.bounds = after_bounds
        self.sampler.attach(self.index, batch_size)
        self.storage.commit(after)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, batch_size: int | None) -> Snapshot:
        """Everything stored, as a :class:`~splice.replay._persist.Snapshot` (arrays not
        copied)."""
        storage, schema = self.storage, self.storage.schema
        return Snapshot(
            capacity=storage.max_size,
            schema=schema,
            columns=[] if schema is None else [storage.column(k) for k in schema.entries],
            objects=[] if schema is None else [storage.objects[k] for k in schema.objects],
            boundaries=self.bounds,
            index=self.index.state(),
            sampler_config=self.sampler.config(),
            sampler=self.sampler.state(),
            batch_size=batch_size,
            kind=None if self.kind is None else self.kind.value,
        )

    def restore(self, snap: Snapshot, batch_size: int | None) -> None:
        """Check everything in ``snap`` against this buffer, then make it the buffer's state:
        all or nothing (the sampler is attached again with ``batch_size``)."""
        storage, sampler = self.storage, self.sampler
        checked = check_snapshot(
            snap,
            capacity=storage.max_size,
            schema=storage.schema,
            sampler_config=sampler.config(),
        )
        try:
            sampler.check_restore(checked, snap.sampler)
        except (ValueError, TypeError) as err:
            raise type(err)(f"{snap.source.group('sampler')}: {err}") from err
        live = np.arange(checked.lo, checked.write_count, dtype=I64) % snap.capacity
        saved: Objects = {}
        if snap.schema is not None:
            saved = dict(zip(snap.schema.objects, snap.objects, strict=True))
            storage.check_write(snap.schema, {k: v[live] for k, v in saved.items()})
        after = CommitState(
            checked.write_count,
            checked.lo,
            None if snap.boundaries is None else snap.boundaries.to_json(),
            snap.kind,
        )
        # Everything is checked. A full disk fails in allocate or stage, before anything
        # changed; from there on nothing can fail. The storage marks every row first, so
        # that a process killed while the columns are copied reopens empty, not mixed.
        if snap.schema is not None and storage.schema is None:
            storage.allocate(snap.schema)
        storage.stage(after)
        storage.begin_write(np.arange(storage.max_size, dtype=I64))
        if snap.schema is not None:
            columns = dict(zip(snap.schema.entries, snap.columns, strict=True))
            storage.load(columns, saved, live)
        self.index.restore(checked.state())
        self.bounds = snap.boundaries
        sampler.attach(self.index, batch_size)
        sampler.restore(snap.sampler)
        self.kind = kind_of(snap.kind)
        storage.commit(after)


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class Prepared:
    """A batch ready to store (:meth:`Writer.prepare`), and the buffer state it was prepared
    against (``seen_*``: still the buffer's when it is stored, or it is prepared again).

    Attributes:
        data, single: what :meth:`Writer.prepare` was given; kind: the container it is.
        bounds: the boundaries its keys come from (``seen_bounds``, or found in it).
        schema: the storage's schema, or the one it fixes (the first batch).
        batch: its flat, checked columns.
        placement: where its steps go (None: it has none).
    """

    data: object
    single: bool
    kind: Kind
    seen_bounds: Boundaries | None
    seen_schema: Schema | None
    bounds: Boundaries
    schema: Schema
    batch: FlatBatch
    placement: Placement | None


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class Placement:
    """Where a batch's steps go (:func:`place`): the write plan (the trajectory key of every
    step, each trajectory of the batch in one run), the columns in that order, the boundary
    state to commit after the write, and the state it was derived from (``seen_open``,
    ``seen_next``: with end flags, keys continue the trajectories still open, which another
    write's commit changes; then the batch is placed again under the lock)."""

    plan: WritePlan
    open_keys: np.ndarray
    next_key: int
    columns: Columns
    objects: Objects
    seen_open: np.ndarray
    seen_next: int
    arrays: Arrays | None = None  # the batch's arrays, in that order (``FlatBatch.arrays``)

    def current(self, bounds: Boundaries) -> bool:
        return bounds.open_keys is self.seen_open and bounds.next_key == self.seen_next


def place(bounds: Boundaries, batch: FlatBatch) -> Placement | None:
    """The :class:`Placement` of ``batch`` under ``bounds`` (None when it has no steps);
    changes nothing."""
    if batch.n == 0:
        return None
    keys, open_keys, next_key = bounds.keys_for(batch)
    plan = ReplayIndex.plan(keys)
    columns, objects, arrays = batch.columns, batch.objects, batch.arrays
    if plan.order is not None:
        order = torch.from_numpy(plan.order)
        columns = {k: take_rows(v, order) for k, v in columns.items()}
        objects = {k: v[plan.order] for k, v in objects.items()}
        if arrays is not None:
            arrays = {k: v.take(plan.order, axis=0) for k, v in arrays.items()}
    return Placement(
        plan, open_keys, next_key, columns, objects, bounds.open_keys, bounds.next_key, arrays
    )


def _input_rows(
    written: np.ndarray,
    batch: FlatBatch,
    order: np.ndarray | None,
    write_count: int,
    capacity: int,
) -> Tensor:
    """The storage row of every input step (-1 for padding), from the rows ``written`` in
    write order (``order``: the input position of each) and the write count after it."""
    n = batch.n
    per_step = written
    if n > capacity:  # the first steps were overwritten at once by the last ones
        per_step = (write_count - n + np.arange(n, dtype=I64)) % capacity
    if order is not None:
        unsorted = np.empty_like(per_step)
        unsorted[order] = per_step
        per_step = unsorted
    if batch.source is None:  # every input step was written
        # (numpy's reshape: torch's view of a numpy array costs several times more)
        return torch.from_numpy(per_step.reshape(batch.input_shape))
    rows = np.full(batch.input_shape.numel(), -1, dtype=I64)
    rows[batch.source] = per_step
    return torch.from_numpy(rows.reshape(batch.input_shape))


def _key(key: NestedKey | None) -> Key | None:
    return None if key is None else as_key_tuple(key)


def _expand(td: TensorDictBase, shape: torch.Size, key: NestedKey | None = None) -> TensorDictBase:
    """``td`` with batch shape ``shape`` (expanded from a single step, or with its leading
    dims reinterpreted as the batch when ``key``'s tensor already has them).

    Raises:
        LayoutError: the shapes do not fit.
    """
    if tuple(td.batch_size) == tuple(shape):
        return td
    if key is not None:
        value = td.get(key)
        if tuple(value.shape[: len(shape)]) == tuple(shape):
            return TensorDict({key: value}, batch_size=shape)
    try:
        return td.expand(shape)
    except RuntimeError as err:
        raise LayoutError(
            f"in-place write: data of batch shape {list(td.batch_size)} does not fit "
            f"{list(shape)} rows: {err}"
        ) from err


def _on_device(columns: Columns, device: torch.device) -> Columns:
    if device.type == "cpu":
        if all(v.is_cpu for v in columns.values()):
            return columns
    elif all(v.device == device for v in columns.values()):
        return columns
    return {k: v if v.device == device else v.to(device) for k, v in columns.items()}
