"""``ReplayBuffer``: storage + trajectory index + sampler, thread safe, persistent."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice._gather import take_rows
from splice._non_tensor import non_tensor_values
from splice.layout import CUT, Key, LayoutError, all_leaves, as_key_tuple, fmt_key
from splice.replay import _output
from splice.replay._batch import (
    Arrays,
    Columns,
    FlatBatch,
    Kind,
    Objects,
    Rows,
    Schema,
    Signature,
    as_tensordict,
    flatten_batch,
    flatten_known,
    from_tensordict,
    kind_of,
    known_eligible,
    signature,
)
from splice.replay._boundaries import Boundaries, resolve_boundaries
from splice.replay._persist import Snapshot, from_state_dict, read_dir, to_state_dict, write_dir
from splice.replay._structures import I64
from splice.replay._validate import check_snapshot
from splice.replay.index import ReplayIndex, WritePlan
from splice.replay.samplers import RandomSampler, Sampler
from splice.replay.storage import CommitState, LazyTensorStorage, Storage

__all__ = ["ReplayBuffer"]

Index = int | slice | Sequence[int] | Tensor | np.ndarray


class ReplayBuffer:
    """A replay buffer of steps that knows its trajectories; TorchRL's API, fixed and faster.

    ``extend`` accepts every layout splice's collectors produce — flat ``[N]`` (and "cat"
    trajectories), ``[B, T]`` collector batches (stored env-major, so a chunk of one trajectory
    is contiguous), padded ``[N, T]`` trajectories with ``("collector", "mask")`` (padding is
    dropped) — and, as TorchRL's buffer, plain tensors and (nested) dicts of tensors, which
    are flat batches along their first dim; samples come back in the kind of container the
    buffer was first given. It returns, for every input step, the storage row it went to.
    Every extend is atomic: a batch with missing or extra keys, or a wrong dtype or shape,
    raises :class:`~splice.layout.LayoutError` and leaves the buffer as it was.

    On every write the buffer updates, in O(batch), an index of which trajectory and step each
    stored row holds (boundaries from trajectory ids, else from end flags, see
    :class:`SliceSampler`); samplers use it to draw in O(batch), never scanning the storage.
    A sampler implements the public contract of :class:`~splice.replay.Sampler`.

    The sample is a TensorDict with the stored keys plus ``"index"`` (storage rows) and, for
    slice samplers, TorchRL's slice marks (truncated/done at slice ends, ``is_init`` at slice
    starts), ``("collector", "mask")`` when padded, ``("collector", "burn_in")`` with burn-in,
    and ``"priority_weight"`` for prioritised samplers — what TorchRL's
    ``TensorDictReplayBuffer`` writes into its samples.

    Stored data can be read and changed in place by storage row, as in TorchRL: ``rb[i]``,
    ``rb[2:]``, ``rb["key"]``, ``rb[i] = data``, :meth:`set_at_`, :meth:`set_` and
    :meth:`update_`. In-place writes may not change trajectory boundaries (the ids or end
    flags the index was built from): that raises :class:`~splice.layout.LayoutError`.

    One writer thread (a collector's ``start()``) and sampling threads may use a buffer
    concurrently: every method that touches the storage or index holds a lock (the flattening
    and checking of a batch and the tensor bookkeeping of a sample are done outside it), so a
    sample never sees a half-written batch or a stale index.

    Args:
        storage: where steps live (default ``LazyTensorStorage(1000)``, as in TorchRL).
        sampler: how batches are drawn (default :class:`RandomSampler`).
        batch_size: default number of (training) steps per ``sample()``.
        generator: the random generator the sampler draws from (it replaces the
            sampler's), as TorchRL's ``ReplayBuffer(generator=...)``.

    Examples:
        R2D2-style recurrent replay: slices of 40 training steps, each preceded by up to 20
        burn-in steps, with the recurrent state stored at each slice's first step:

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> from splice.testing import synthetic_rollout
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(10_000),
        ...     sampler=SliceSampler(
        ...         slice_len=40,
        ...         burn_in=20,
        ...         strict_length=False,
        ...         as_sequences=True,
        ...         weighting="transition",
        ...         state_keys=["recurrent_state"],
        ...         seed=0,
        ...     ),
        ...     batch_size=8 * 40,
        ... )
        >>> for i in range(4):  # four [B=4, T=50] collector batches; episodes span batches
        ...     batch = synthetic_rollout(4, 50, mean_len=60.0, seed=i, first_id=1000 * i)
        ...     batch["recurrent_state"] = torch.randn(4, 50, 16)  # what the policy carried
        ...     _ = rb.extend(batch)
        >>> data, info = rb.sample(return_info=True)
        >>> data.batch_size  # [num_slices, burn_in + slice_len]
        torch.Size([8, 60])
        >>> h0 = info["initial_state"]["recurrent_state"]  # stored state entering column 0
        >>> h0.shape, bool((h0 == data["recurrent_state"][:, 0]).all())
        (torch.Size([8, 16]), True)
        >>> real = data["collector", "mask"]  # False on padding (slices cut short)
        >>> train = real & ~data["collector", "burn_in"]  # where the loss applies
        >>> # q = net.unroll(data["observation"], h0)  ->  loss = (td_error**2)[train].mean()
        >>> bool((train.sum(1) <= 40).all()), bool((data["index"][~real] == -1).all())
        (True, True)

        Plain tensors, and rows addressed by what ``extend`` returned:

        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> rows = rb.extend(torch.arange(6) * 10)  # 6 steps into 4 rows: the ring wraps
        >>> rows.tolist(), rb[rows[-4:]].tolist()
        ([0, 1, 2, 3, 0, 1], [20, 30, 40, 50])
    """

    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        storage = storage if storage is not None else LazyTensorStorage(1000)
        sampler = sampler if sampler is not None else RandomSampler()
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a splice Storage, got {type(storage).__name__}")
        if not isinstance(sampler, Sampler):
            raise TypeError(f"sampler must be a splice Sampler, got {type(sampler).__name__}")
        if batch_size is not None:
            sampler.check_batch_size(batch_size)
        if storage.owner is not None:
            raise ValueError("this storage already belongs to another replay buffer")
        if sampler.attached:
            raise ValueError("this sampler already belongs to another replay buffer")
        if generator is not None:
            if not isinstance(generator, torch.Generator):
                raise TypeError(
                    f"generator must be a torch.Generator, got {type(generator).__name__}"
                )
            sampler.generator = generator
        self.storage = storage
        self.sampler = sampler
        self.batch_size = batch_size
        self._lock = threading.RLock()
        self._index = ReplayIndex(storage.max_size, row_key=storage.row_key)
        self._bounds: Boundaries | None = None
        self._kind: Kind | None = None
        #: The layout of the last batch that passed every check, for the next ones (set
        #: without the lock: it is replaced whole, and used only while the schema and
        #: boundaries it was checked against are the buffer's).
        self._known: _Known | None = None
        #: Whether the storage's durability hooks (``stage``, ``begin_write``, ``commit``)
        #: may do anything: an extend skips building their arguments when the storage has
        #: the base class's no-op for all three (an override in a subclass or on the
        #: instance counts).
        self._durable = any(
            getattr(getattr(storage, hook), "__func__", None) is not getattr(Storage, hook)
            for hook in ("stage", "begin_write", "commit")
        )
        self._cpu_storage = storage.device.type == "cpu"
        recovered = storage.recovered()
        if recovered is not None:
            if recovered.boundaries is not None:
                self._bounds = Boundaries.from_json(recovered.boundaries)
            self._index.rebuild(recovered.lo, recovered.write_count)
            self._kind = kind_of(recovered.kind)
        storage.claim(self)
        try:
            sampler.attach(self._index, batch_size)
        except BaseException:
            storage.release(self)
            raise

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(storage={self.storage!r}, sampler={self.sampler!r}, "
            f"batch_size={self.batch_size}, len={len(self)})"
        )

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        """Steps currently stored (read under the lock: a concurrent ``extend`` is seen
        entirely or not at all)."""
        with self._lock:
            return len(self._index)

    @property
    def write_count(self) -> int:
        """Steps written since creation (or the last ``empty()``), overwritten ones included
        (read under the lock, as ``len()``)."""
        with self._lock:
            return self._index.write_count

    @property
    def index(self) -> ReplayIndex:
        """The trajectory index (read-only use)."""
        return self._index

    # ------------------------------------------------------------------ writing
    def extend(self, data: TensorDictBase | Tensor | Mapping[str, Any]) -> Tensor:
        """Append a batch of steps.

        Args:
            data: a TensorDict (flat ``[N]``, ``[B, T]`` or padded ``[N, T]`` with a mask),
                a tensor or a dict of tensors (flat along their first dim).

        Returns:
            For every input step (the input's batch shape), the storage row it was written
            to, or -1 for padding (not stored). With more steps than the capacity, the first
            ones share rows with the last (as in TorchRL: they were overwritten at once).

        Raises:
            TypeError: ``data`` is not a TensorDict, tensor or dict, or not the kind of
                container the buffer holds.
            LayoutError: the batch does not match the buffer's keys, dtypes or shapes, or has
                no trajectory boundaries a slice sampler could use. The buffer is unchanged.
            OSError: a memory-mapped storage found no space on its disk (the message names
                the file). The buffer is unchanged.
        """
        td, kind = as_tensordict(data)
        # Flattening and checking change nothing: done before taking the lock, so that a
        # sampling thread waits only for the write itself.
        staged = self._stage(td, kind)
        with self._lock:
            return self._extend(td, kind, staged)

    def _stage(self, td: TensorDictBase, kind: Kind) -> _Staged:
        """Flatten and check a batch against the buffer as it is now (changes nothing)."""
        if self._kind is not None and kind is not self._kind:
            raise TypeError(
                f"this buffer holds {self._kind.value} data; got a {kind.value} "
                f"({type(td).__name__ if kind is Kind.TENSORDICT else kind.value})"
            )
        seen_bounds, seen_schema = self._bounds, self.storage.schema
        # The common case: a batch laid out as the last one that passed every check (same
        # keys, dtypes and shapes): one comparison, and the ids' values.
        sig = signature(td)
        known = self._known
        if (
            sig is not None
            and known is not None
            and known.schema is seen_schema
            and known.bounds is seen_bounds
            and sig[0] == known.signature
        ):
            ids_key = seen_bounds.ids_key
            batch = flatten_known(sig[0][0], sig[1], ids_key, as_arrays=self._cpu_storage)
            layout = _layout(seen_bounds, batch)
            # Ids are the keys: a negative one (padding, or refused) sends the batch down
            # the checked path, which drops or refuses it as before.
            if layout is None or ids_key is None or layout.plan.min_key() >= 0:
                return _Staged(seen_bounds, seen_schema, seen_bounds, batch, seen_schema, layout)
        bounds = seen_bounds
        if bounds is None:
            bounds = resolve_boundaries(
                td,
                traj_key=_key(self.sampler.traj_key),
                end_key=_key(self.sampler.end_key),
                needs_trajectories=self.sampler.needs_trajectories,
            )
        batch = flatten_batch(td, bounds.ids_key, first=seen_schema is None)
        schema = Schema.of(batch.columns, batch.objects) if seen_schema is None else seen_schema
        if seen_schema is not None:
            schema.check(batch.columns, batch.objects)
            if (
                sig is not None
                and seen_bounds is not None
                and known_eligible(sig[1], seen_bounds.ids_key)
            ):
                self._known = _Known(sig[0], seen_schema, seen_bounds)
        return _Staged(seen_bounds, seen_schema, bounds, batch, schema, _layout(bounds, batch))

    def _extend(self, td: TensorDictBase, kind: Kind, staged: _Staged | None = None) -> Tensor:
        if (
            staged is None
            or staged.seen_bounds is not self._bounds
            or staged.seen_schema is not self.storage.schema
        ):  # staged before a first write or a restore by another thread: stage again
            staged = self._stage(td, kind)
        bounds, batch, schema = staged.bounds, staged.batch, staged.schema
        first = staged.seen_schema is None
        storage, index = self.storage, self._index
        storage.check_write(schema, batch.objects)
        n = batch.n
        if n == 0:
            return torch.full(batch.input_shape, -1, dtype=torch.int64)
        layout = staged.layout
        if layout is None or not layout.current(bounds):  # another writer committed since
            layout = _layout(bounds, batch)
        assert layout is not None
        plan, open_keys, next_key = layout.plan, layout.open_keys, layout.next_key
        columns, objects, order = layout.columns, layout.objects, plan.order
        capacity = storage.max_size
        written: Rows = columns
        if layout.arrays is not None:  # (made for a storage on the CPU only)
            written = layout.arrays
        elif not self._cpu_storage:  # (a CPU storage copies from any device itself)
            written = _on_device(columns, storage.device)
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
                bounds.json_with(open_keys, next_key),
                kind.value,
            )
        # Everything is validated. A full disk fails in allocate or stage, before anything
        # changed; from there on the write cannot fail half-way.
        if first:
            storage.allocate(schema)
        if after is not None:
            storage.stage(after)
            storage.begin_write(index.rows_for_write(n))
        storage.write(start_row, written, objects)
        report = index.write_plan(plan)
        bounds.commit(open_keys, next_key)  # the same object a staged batch saw: no restage
        self._bounds = bounds
        self._kind = kind
        self.sampler.on_write(report)
        if after is not None:
            storage.commit(after)
        # The row of every input step: write order -> batch order -> input positions.
        per_step = report.new_rows
        if n > capacity:  # the first steps were overwritten at once by the last ones
            per_step = (index.write_count - n + np.arange(n, dtype=I64)) % capacity
        if order is not None:
            unsorted = np.empty_like(per_step)
            unsorted[order] = per_step
            per_step = unsorted
        if batch.source is None:  # every input step was written
            # (numpy's reshape: torch's view of a numpy array costs several times more)
            return torch.from_numpy(per_step.reshape(batch.input_shape))
        rows_out = np.full(batch.input_shape.numel(), -1, dtype=I64)
        rows_out[batch.source] = per_step
        return torch.from_numpy(rows_out.reshape(batch.input_shape))

    def add(self, data: TensorDictBase | Tensor | Mapping[str, Any]) -> int:
        """Append a single step (a TensorDict with an empty batch size, a tensor or a dict of
        tensors without a batch dim); returns its row."""
        td, kind = as_tensordict(data, single=True)
        with self._lock:
            return int(self._extend(td.unsqueeze(0), kind)[0])

    def empty(self) -> None:
        """Drop every stored step and reset ``write_count`` (allocations are kept).

        Raises:
            OSError: a memory-mapped storage cannot write its metadata (a full disk); the
                buffer is unchanged.
        """
        with self._lock:
            bounds = self._bounds
            after_bounds = None if bounds is None else Boundaries(bounds.mode, bounds.key)
            after = CommitState(
                0,
                0,
                None if after_bounds is None else after_bounds.to_json(),
                None if self._kind is None else self._kind.value,
            )
            self.storage.stage(after)
            self._index.reset()
            self._bounds = after_bounds
            self.sampler.attach(self._index, self.batch_size)
            self.storage.commit(after)

    # ------------------------------------------------------------------ sampling
    @overload
    def sample(
        self,
        batch_size: int | None = None,
        *,
        return_info: Literal[False] = False,
        as_sequences: bool | None = None,
    ) -> Any: ...

    @overload
    def sample(
        self,
        batch_size: int | None = None,
        *,
        return_info: Literal[True],
        as_sequences: bool | None = None,
    ) -> tuple[Any, dict[str, Any]]: ...

    def sample(
        self,
        batch_size: int | None = None,
        *,
        return_info: bool = False,
        as_sequences: bool | None = None,
    ) -> Any:
        """Draw a batch.

        Args:
            batch_size: steps to draw (training steps for slice samplers); default: the
                buffer's ``batch_size``.
            return_info: also return a dict with ``"index"`` (storage rows, ``[S, W]`` for
                slices with -1 on padding) and, for slices, ``"length"`` and ``"burn_in"``
                (real and burn-in steps per slice), ``"initial_state"`` (the sampler's
                ``state_keys`` at each slice's first step) and ``"priority_weight"``.
            as_sequences: override the slice sampler's ``as_sequences`` (``[S, W]`` output).

        Returns:
            The sample (a TensorDict; a tensor or dict for buffers of tensors or dicts), or
            ``(sample, info)``.

        Raises:
            RuntimeError: no batch size (here or at construction), or nothing to draw from.
            ValueError: a batch size the sampler cannot draw (e.g. not a multiple of the
                slice length).
        """
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise RuntimeError(
                "batch_size not specified: pass it to sample() or to the ReplayBuffer"
            )
        self.sampler.check_batch_size(size)
        marks = self.sampler.marks
        shaped = (
            bool(as_sequences) if as_sequences is not None else bool(marks and marks.as_sequences)
        )
        with self._lock:
            _output.check_keys(marks, self.storage.schema)
            draw = self.sampler.draw(size)
            if shaped and draw.rows.ndim != 2:
                raise ValueError(
                    f"as_sequences needs a slice sampler; {type(self.sampler).__name__} draws "
                    "single steps"
                )
            pad = bool(marks and marks.pad_output)
            plan = _output.plan(draw, shaped=shaped, pad=pad, marks=marks)
            got = _output.read(self.storage, plan, marks)
            kind = self._kind
        data, info = _output.build(got, draw, plan, marks, shaped=shaped)
        out = data if kind is None else from_tensordict(data, kind)
        return (out, info) if return_info else out

    def __iter__(self) -> Iterator[Any]:
        """Batches until the sampler runs out (samplers with replacement never do)."""
        if self.batch_size is None:
            raise RuntimeError(
                "Cannot iterate over the replay buffer. Batch_size was not specified during "
                "construction of the replay buffer"
            )
        self.sampler.ran_out = False
        while not self.sampler.ran_out:
            yield self.sample()

    def update_priority(
        self,
        index: Tensor | np.ndarray | Sequence[int] | int,
        priority: Tensor | np.ndarray | Sequence[float] | float,
    ) -> None:
        """Set priorities of stored steps (prioritised samplers; ignored by the others).

        ``index`` are storage rows (``sample["index"]``, ``info["index"]`` or what
        ``extend`` returned; -1 is ignored), ``priority`` has the same shape or broadcasts
        to it.
        """
        idx = _as_numpy(index, np.int64)
        prio = _as_numpy(priority, np.float64)
        with self._lock:
            self.sampler.update_priority(idx, prio)

    # ------------------------------------------------------------------ stored data
    def _rows(self, index: Index) -> Tensor:
        """Storage rows addressed like TorchRL's ``rb[index]``: positions in the written
        part of the storage (all rows once the ring has been filled)."""
        extent = min(self._index.write_count, self.storage.max_size)
        if isinstance(index, np.ndarray):
            index = torch.from_numpy(index)
        elif isinstance(index, list | tuple):
            index = torch.as_tensor(index)
        try:
            rows = torch.arange(extent)[index]
        except IndexError as err:
            raise IndexError(f"index {index!r} is out of range for {extent} rows") from err
        if (self._index.row_slot[rows.reshape(-1).numpy()] < 0).any():
            raise IndexError(f"row(s) {index!r} hold no stored step")
        return rows

    def __getitem__(self, index: Index | NestedKey) -> Any:
        """Stored steps by storage row (``rb[3]``, ``rb[2:]``, ``rb[rows]``), or one key of
        every stored step (``rb["observation"]``), as TorchRL's ``rb[index]``.

        Raises:
            IndexError: a row out of range or holding no step.
            KeyError: a key the buffer does not store.
        """
        if isinstance(index, str):
            return self[:][index]
        if isinstance(index, tuple):
            if _is_key(index):
                return self[:][index]
            index = list(index)
        with self._lock:
            rows = self._rows(index)
            columns = self.storage.gather(rows.reshape(-1))
            objects = self.storage.gather_objects(rows.reshape(-1))
            kind = self._kind
        shape = tuple(rows.shape)
        out = {k: v.reshape(shape + tuple(v.shape[1:])) for k, v in columns.items()}
        td = _output.to_tensordict(out, shape, {k: v.reshape(shape) for k, v in objects.items()})
        return td if kind is None else from_tensordict(td, kind)

    def __setitem__(self, index: Index | NestedKey, value: Any) -> None:
        """Overwrite stored steps in place: ``rb[rows] = data`` (data shaped like the rows,
        with some or all of the stored keys), or ``rb["key"] = values`` for every row.

        Raises:
            IndexError: a row out of range or holding no step.
            LayoutError: unknown keys, wrong dtypes or shapes, or a change of the trajectory
                ids or end flags (boundaries cannot change in place). Nothing is written.
        """
        if isinstance(index, str):
            self.set_(index, value)
            return
        if isinstance(index, tuple):
            if _is_key(index):
                self.set_(index, value)
                return
            index = list(index)
        td, kind = as_tensordict(value, single=True)
        with self._lock:
            self._check_kind(kind)
            rows = self._rows(index)
            self._write_rows(rows.reshape(-1), _expand(td, rows.shape).reshape(-1))

    def set_at_(self, key: NestedKey, value: Tensor, index: Index) -> ReplayBuffer:
        """Write ``value`` to ``key`` at storage rows ``index`` (TorchRL's ``set_at_``);
        ``value`` is shaped like the rows (plus the key's per-step shape) or broadcasts."""
        with self._lock:
            rows = self._rows(index)
            td = TensorDict({key: torch.as_tensor(value)}, batch_size=[])
            self._write_rows(rows.reshape(-1), _expand(td, rows.shape, key).reshape(-1))
        return self

    def set_(self, key: NestedKey, value: Tensor) -> ReplayBuffer:
        """Write ``value`` (one entry per stored row, in storage order) to ``key``."""
        return self.set_at_(key, value, slice(None))

    def update_(
        self,
        data: TensorDictBase | Mapping[str, Any],
        *,
        keys_to_update: Sequence[NestedKey] | None = None,
    ) -> ReplayBuffer:
        """Write every key of ``data`` (batch shape: one entry per stored row, in storage
        order) in place; with ``keys_to_update``, only those keys."""
        td, _ = as_tensordict(data)
        if keys_to_update is not None:
            td = td.select(*keys_to_update)
        with self._lock:
            rows = self._rows(slice(None))
            self._write_rows(rows, _expand(td, rows.shape).reshape(-1))
        return self

    def _check_kind(self, kind: Kind) -> None:
        if self._kind is not None and kind is not self._kind:
            raise TypeError(f"this buffer holds {self._kind.value} data; got a {kind.value}")

    def _write_rows(self, rows: Tensor, td: TensorDictBase) -> None:
        """Validate, then write ``td`` (``[len(rows)]``, a subset of the keys) at ``rows``."""
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
        for key, value in all_leaves(td):
            if isinstance(value, Tensor):
                columns[key] = value
            elif value.batch_size == td.batch_size:
                objects[key] = non_tensor_values(value)
            else:
                raise LayoutError(
                    f"in-place write: key {fmt_key(key)} holds a non-tensor entry of batch "
                    f"shape {list(value.batch_size)}, not one object per row "
                    f"({list(td.batch_size)})"
                )
        schema.check(columns, objects, subset=True)
        self.storage.check_write(schema, objects)
        for key in self._boundary_keys():
            if key in columns:
                stored = self.storage.gather(rows)[key]
                if not torch.equal(stored, columns[key].to(stored.device)):
                    raise LayoutError(
                        f"key {fmt_key(key)} delimits trajectories: it cannot change in place "
                        "(extend with the new data instead)"
                    )
        self.storage.set_rows(rows, columns, objects)

    def _boundary_keys(self) -> list[Key]:
        if self._bounds is None or self._bounds.key is None:
            return []
        keys = [self._bounds.key]
        if self._bounds.mode == "flags":
            keys.append(CUT)
        return keys

    # ------------------------------------------------------------------ persistence
    def _snapshot(self) -> Snapshot:
        schema = self.storage.schema
        return Snapshot(
            capacity=self.storage.max_size,
            schema=schema,
            columns=[] if schema is None else [self.storage.column(k) for k in schema.entries],
            objects=[] if schema is None else [self.storage.objects[k] for k in schema.objects],
            boundaries=self._bounds,
            index=self._index.state(),
            sampler_config=self.sampler.config(),
            sampler=self.sampler.state(),
            batch_size=self.batch_size,
            kind=None if self._kind is None else self._kind.value,
        )

    def _install(self, snap: Snapshot) -> None:
        """Check everything in ``snap`` against this buffer, then make it this buffer's state:
        all or nothing."""
        with self._lock:
            checked = check_snapshot(
                snap,
                capacity=self.storage.max_size,
                schema=self.storage.schema,
                sampler_config=self.sampler.config(),
            )
            try:
                self.sampler.check_restore(checked, snap.sampler)
            except (ValueError, TypeError) as err:
                raise type(err)(f"{snap.source.group('sampler')}: {err}") from err
            live = np.arange(checked.lo, checked.write_count, dtype=I64) % snap.capacity
            saved: Objects = {}
            if snap.schema is not None:
                saved = dict(zip(snap.schema.objects, snap.objects, strict=True))
                self.storage.check_write(snap.schema, {k: v[live] for k, v in saved.items()})
            after = CommitState(
                checked.write_count,
                checked.lo,
                None if snap.boundaries is None else snap.boundaries.to_json(),
                snap.kind,
            )
            # Everything is checked. A full disk fails in allocate or stage, before anything
            # changed; from there on nothing can fail. The storage marks every row first, so
            # that a process killed while the columns are copied reopens empty, not mixed.
            if snap.schema is not None and self.storage.schema is None:
                self.storage.allocate(snap.schema)
            self.storage.stage(after)
            self.storage.begin_write(np.arange(self.storage.max_size, dtype=I64))
            if snap.schema is not None:
                columns = dict(zip(snap.schema.entries, snap.columns, strict=True))
                self.storage.load(columns, saved, live)
            self._index.restore(checked.state())
            self._bounds = snap.boundaries
            self.sampler.attach(self._index, self.batch_size)
            self.sampler.restore(snap.sampler)
            self._kind = kind_of(snap.kind)
            self.storage.commit(after)

    def state_dict(self) -> dict[str, Any]:
        """The whole buffer — data, index, sampler state — as tensors, numbers and strings.

        No pickle is needed for anything: ``torch.save(rb.state_dict(), f)`` loads back with
        ``torch.load(f, weights_only=True)``. Tensors are copies.
        """
        with self._lock:
            return to_state_dict(self._snapshot())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into this buffer (same storage size and sampler
        settings); it then samples exactly as the saved buffer would have.

        Everything is checked before anything changes (as for :meth:`loads`).

        Raises:
            TypeError: not a mapping.
            ValueError: not a replay buffer state, a different size or sampler, or an entry
                that is malformed or inconsistent (named in the message). The buffer is
                unchanged.
            LayoutError: other keys than this buffer's.
        """
        self._install(from_state_dict(state_dict, self.sampler.state_type))

    def dumps(self, path: str | Path) -> None:
        """Save the whole buffer — data, cursor, index, sampler state — under ``path``.

        Tensors are written as raw bytes and index/sampler arrays as ``.npy`` (no pickle).
        The dump is atomic: the files go to a new subdirectory of ``path`` and
        ``buffer.json``, which names it, replaces the previous one last; a process killed at
        any moment leaves the previous dump or the new one, never a mix, and the next
        ``dumps`` deletes what an interrupted one left. (Against a power cut, ``sync`` the
        directory afterwards.) One process at a time may write to ``path``. A buffer built
        with the same storage size and sampler settings and restored with :meth:`loads`
        samples exactly as this one.

        Raises:
            OSError: a file cannot be written (a full disk); the previous dump is kept.
        """
        with self._lock:
            write_dir(self._snapshot(), Path(path))

    def loads(self, path: str | Path) -> None:
        """Restore a buffer saved with :meth:`dumps` into this (same-sized, same-sampler) one.

        Nothing read is trusted: the files' sizes, dtypes and every field of ``buffer.json``
        are checked, the saved index against the stored trajectory keys and those against the
        stored ids (or end flags), the sampler's saved sets, trees and epochs against the
        index — all before anything changes.

        Raises:
            ValueError: not a dump, a different size or sampler, or a file or field that is
                malformed or inconsistent (the message names the file and the field). The
                buffer is unchanged.
            LayoutError: other keys than this buffer's.
            OSError: a missing ``buffer.json``, or no space to allocate a memory-mapped
                storage.
        """
        self._install(read_dir(Path(path), self.sampler.state_type))


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class _Known:
    """A batch :func:`~splice.replay._batch.signature` that passed ``extend``'s checks
    against ``schema`` with ``bounds`` (the buffer's objects at the time)."""

    signature: Signature
    schema: Schema
    bounds: Boundaries


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class _Staged:
    """A batch flattened and checked outside the lock, and the buffer state it was checked
    against (``seen_*``: still current when the lock is taken, or it is staged again)."""

    seen_bounds: Boundaries | None
    seen_schema: Schema | None
    bounds: Boundaries
    batch: FlatBatch
    schema: Schema
    layout: _Layout | None


@dataclass(slots=True)  # (not frozen: a frozen init costs ~5x, once per extend)
class _Layout:
    """Where a batch's steps go, decided outside the lock: the trajectory key of every step,
    their write order (each trajectory of the batch in one run of rows) and the columns in
    that order; and the boundary state it was derived from (``seen_open``, ``seen_next``:
    with end flags, keys continue the trajectories still open, which another writer's commit
    changes; then the layout is made again under the lock)."""

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


def _layout(bounds: Boundaries, batch: FlatBatch) -> _Layout | None:
    """The :class:`_Layout` of a non-empty ``batch`` (None for an empty one); changes
    nothing."""
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
    return _Layout(
        plan, open_keys, next_key, columns, objects, bounds.open_keys, bounds.next_key, arrays
    )


def _key(key: NestedKey | None) -> Key | None:
    return None if key is None else as_key_tuple(key)


def _is_key(index: tuple[Any, ...]) -> bool:
    return len(index) > 0 and all(isinstance(p, str | tuple) for p in index)


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


def _as_numpy(x: object, dtype: type[np.generic]) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy().astype(dtype, copy=False)
    return np.asarray(x, dtype=dtype)


def _on_device(columns: Columns, device: torch.device) -> Columns:
    if device.type == "cpu":
        if all(v.is_cpu for v in columns.values()):
            return columns
    elif all(v.device == device for v in columns.values()):
        return columns
    return {k: v if v.device == device else v.to(device) for k, v in columns.items()}
