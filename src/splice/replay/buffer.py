"""``ReplayBuffer``: storage + trajectory index + sampler, thread safe, persistent."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice.replay import _output
from splice.replay._batch import as_tensordict, from_tensordict
from splice.replay._persist import from_state_dict, read_dir, to_state_dict, write_dir
from splice.replay._write import Index, Writer
from splice.replay.index import ReplayIndex
from splice.replay.samplers import RandomSampler, Sampler
from splice.replay.storage import LazyTensorStorage, Storage

__all__ = ["ReplayBuffer"]


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
        #: Every change to the stored steps. It recovers what the storage committed, then
        #: binds the storage and the sampler to this buffer.
        self._writer = Writer(storage, sampler, owner=self, batch_size=batch_size)

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
            return len(self._writer.index)

    @property
    def write_count(self) -> int:
        """Steps written since creation (or the last ``empty()``), overwritten ones included
        (read under the lock, as ``len()``)."""
        with self._lock:
            return self._writer.index.write_count

    @property
    def index(self) -> ReplayIndex:
        """The trajectory index (read-only use)."""
        return self._writer.index

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
        # Preparing (flattening, checking, keying) changes nothing: done before taking the
        # lock, so that a sampling thread waits only for the write itself.
        prepared = self._writer.prepare(data)
        with self._lock:
            return self._writer.store(prepared)

    def add(self, data: TensorDictBase | Tensor | Mapping[str, Any]) -> int:
        """Append a single step (a TensorDict with an empty batch size, a tensor or a dict of
        tensors without a batch dim); returns its row."""
        prepared = self._writer.prepare(data, single=True)
        with self._lock:
            return int(self._writer.store(prepared)[0])

    def empty(self) -> None:
        """Drop every stored step and reset ``write_count`` (allocations are kept).

        Raises:
            OSError: a memory-mapped storage cannot write its metadata (a full disk); the
                buffer is unchanged.
        """
        with self._lock:
            self._writer.clear(self.batch_size)

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
            kind = self._writer.kind
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
    def __getitem__(self, index: Index | NestedKey) -> Any:
        """Stored steps by storage row (``rb[3]``, ``rb[2:]``, ``rb[rows]``), or one key of
        every stored step (``rb["observation"]``), as TorchRL's ``rb[index]``.

        Raises:
            IndexError: a row out of range or holding no step.
            KeyError: a key the buffer does not store.
        """
        if isinstance(index, str) or _is_key(index):
            return self[:][index]
        with self._lock:
            rows = self._writer.rows(index)
            columns = self.storage.gather(rows.reshape(-1))
            objects = self.storage.gather_objects(rows.reshape(-1))
            kind = self._writer.kind
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
        if isinstance(index, str) or _is_key(index):
            self.set_(index, value)
            return
        td, kind = as_tensordict(value, single=True)
        with self._lock:
            self._writer.check_kind(kind)
            self._writer.overwrite(self._writer.rows(index), td)

    def set_at_(self, key: NestedKey, value: Tensor, index: Index) -> ReplayBuffer:
        """Write ``value`` to ``key`` at storage rows ``index`` (TorchRL's ``set_at_``);
        ``value`` is shaped like the rows (plus the key's per-step shape) or broadcasts."""
        with self._lock:
            td = TensorDict({key: torch.as_tensor(value)}, batch_size=[])
            self._writer.overwrite(self._writer.rows(index), td, key)
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
            self._writer.overwrite(self._writer.rows(slice(None)), td)
        return self

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """The whole buffer — data, index, sampler state — as tensors, numbers and strings.

        No pickle is needed for anything: ``torch.save(rb.state_dict(), f)`` loads back with
        ``torch.load(f, weights_only=True)``. Tensors are copies.
        """
        with self._lock:
            return to_state_dict(self._writer.snapshot(self.batch_size))

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
        snap = from_state_dict(state_dict, self.sampler.state_type)
        with self._lock:
            self._writer.restore(snap, self.batch_size)

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
            write_dir(self._writer.snapshot(self.batch_size), Path(path))

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
        snap = read_dir(Path(path), self.sampler.state_type)
        with self._lock:
            self._writer.restore(snap, self.batch_size)


def _is_key(index: object) -> bool:
    """Whether ``index`` (not a str) is a nested key: a non-empty tuple of strs and tuples."""
    return (
        isinstance(index, tuple)
        and len(index) > 0
        and all(isinstance(p, str | tuple) for p in index)
    )


def _as_numpy(x: object, dtype: type[np.generic]) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy().astype(dtype, copy=False)
    return np.asarray(x, dtype=dtype)
