"""``ReplayBuffer``: storage + trajectory index + sampler, thread safe, persistent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from splice._gather import take_rows
from splice.layout import TRAJ_IDS, LayoutError
from splice.replay import _output
from splice.replay._batch import Columns, Schema, flatten_batch
from splice.replay._boundaries import Boundaries, resolve_boundaries
from splice.replay._files import (
    load_arrays,
    read_json,
    save_arrays,
    tensor_from_file,
    tensor_to_file,
    write_json_atomic,
)
from splice.replay._structures import I64
from splice.replay.index import ReplayIndex
from splice.replay.samplers import RandomSampler, Sampler, SliceSampler
from splice.replay.storage import LazyTensorStorage, Storage
from splice.trajectories._index import index_by_id

__all__ = ["ReplayBuffer"]

_FORMAT = "splice.replay/1"


class ReplayBuffer:
    """A replay buffer of steps that knows its trajectories; TorchRL's API, fixed and faster.

    ``extend`` accepts every layout splice's collectors produce — flat ``[N]`` (and "cat"
    trajectories), ``[B, T]`` collector batches (stored env-major, so a chunk of one trajectory
    is contiguous), padded ``[N, T]`` trajectories with ``("collector", "mask")`` (padding is
    dropped). Every extend is atomic: a batch with missing or extra keys, or a wrong dtype or
    shape, raises :class:`~splice.layout.LayoutError` and leaves the buffer as it was.

    On every write the buffer updates, in O(batch), an index of which trajectory and step each
    stored row holds (boundaries from ``("collector", "traj_ids")``, else from end flags, see
    :class:`SliceSampler`); samplers use it to draw in O(batch), never scanning the storage.

    The sample is a TensorDict with the stored keys plus ``"index"`` (storage rows) and, for
    slice samplers, TorchRL's slice marks (truncated/done at slice ends, ``is_init`` at slice
    starts), ``("collector", "mask")`` when padded, ``("collector", "burn_in")`` with burn-in,
    and ``"priority_weight"`` for prioritised samplers — what TorchRL's
    ``TensorDictReplayBuffer`` writes into its samples.

    One writer thread (a collector's ``start()``) and sampling threads may use a buffer
    concurrently: ``extend``, ``sample`` and ``update_priority`` hold a lock while they touch
    the storage and index (the tensor bookkeeping of a sample is done outside it), so a sample
    never sees a half-written batch or a stale index.

    Args:
        storage: where steps live (default ``LazyTensorStorage(1000)``, as in TorchRL).
        sampler: how batches are drawn (default :class:`RandomSampler`).
        batch_size: default number of (training) steps per ``sample()``.

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
    """

    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.storage = storage if storage is not None else LazyTensorStorage(1000)
        self.sampler = sampler if sampler is not None else RandomSampler()
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size is not None and isinstance(self.sampler, SliceSampler):
            self.sampler.shape_for(batch_size)  # raises if not divisible
        if self.storage._owner is not None:
            raise ValueError("this storage already belongs to another replay buffer")
        if self.sampler._index is not None:
            raise ValueError("this sampler already belongs to another replay buffer")
        self.storage._owner = self
        self.batch_size = batch_size
        self._lock = threading.RLock()
        self._index = ReplayIndex(self.storage.max_size, row_key=self.storage.row_key)
        self._bounds: Boundaries | None = None
        recovered = self.storage.recovered()
        if recovered is not None:
            bounds = recovered.get("boundaries")
            if bounds is not None:
                self._bounds = Boundaries.from_json(bounds)  # type: ignore[arg-type]
            self._index.rebuild(int(recovered["lo"]), int(recovered["write_count"]))  # type: ignore[call-overload]
        self.sampler._attach(self._index, batch_size)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(storage={self.storage!r}, sampler={self.sampler!r}, "
            f"batch_size={self.batch_size}, len={len(self)})"
        )

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        """Steps currently stored."""
        return len(self._index)

    @property
    def write_count(self) -> int:
        """Steps written since creation (or the last ``empty()``), overwritten ones included."""
        return self._index.write_count

    @property
    def index(self) -> ReplayIndex:
        """The trajectory index (read-only use)."""
        return self._index

    # ------------------------------------------------------------------ writing
    def extend(self, data: TensorDictBase) -> Tensor:
        """Append a batch of steps; returns the storage rows written (write order).

        Raises:
            LayoutError: the batch does not match the buffer's keys, dtypes or shapes, or has
                no trajectory boundaries a slice sampler could use. The buffer is unchanged.
        """
        ids_key = self.sampler.traj_key or TRAJ_IDS
        batch = flatten_batch(data, ids_key, first=self.storage.schema is None)
        with self._lock:
            columns = batch.columns
            schema = self.storage.schema
            if schema is None:
                schema = Schema.of(columns)
            else:
                schema.check(columns)
            bounds = self._bounds or resolve_boundaries(
                columns,
                traj_key=self.sampler.traj_key,
                end_key=self.sampler.end_key,
                needs_trajectories=self.sampler.needs_trajectories,
            )
            n = batch.n
            if n == 0:
                return torch.empty(0, dtype=torch.int64)
            keys, open_keys, next_key = bounds.keys_for(batch)
            if bounds.mode == "ids":
                columns, keys = _group_trajectories(columns, keys)
            capacity = self.storage.max_size
            if n > capacity:
                columns = {k: v[n - capacity :] for k, v in columns.items()}
            columns = _on_device(columns, self.storage.device)
            rows = self._index.rows_for_write(n)
            # Everything is validated: from here on the write cannot fail half-way.
            if self.storage.schema is None:
                self.storage.allocate(schema)
            self.storage.begin_write(rows)
            self.storage.write(int(rows[0]), columns)
            report = self._index.write(np.ascontiguousarray(keys, dtype=I64))
            bounds.commit(open_keys, next_key)
            self._bounds = bounds
            self.sampler._on_write(report)
            self.storage.commit(self._small_state())
        return torch.from_numpy(rows)

    def add(self, data: TensorDictBase) -> int:
        """Append a single step (a TensorDict with an empty batch size); returns its row."""
        return int(self.extend(data.unsqueeze(0))[0])

    def _small_state(self) -> dict[str, object]:
        return {
            "write_count": self._index.write_count,
            "lo": self._index.lo,
            "boundaries": None if self._bounds is None else self._bounds.to_json(),
        }

    def empty(self) -> None:
        """Drop every stored step and reset ``write_count`` (allocations are kept)."""
        with self._lock:
            self._index.reset()
            if self._bounds is not None:
                self._bounds.reset()
            self.sampler._attach(self._index, self.batch_size)
            self.storage.commit(self._small_state())

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        batch_size: int | None = None,
        *,
        return_info: bool = False,
        as_sequences: bool | None = None,
    ) -> TensorDict | tuple[TensorDict, dict[str, object]]:
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
            The sample, or ``(sample, info)``.
        """
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise ValueError("pass batch_size= here or to the ReplayBuffer")
        is_slice = isinstance(self.sampler, SliceSampler)
        shaped = (
            bool(as_sequences)
            if as_sequences is not None
            else (
                is_slice and self.sampler.as_sequences  # type: ignore[attr-defined]
            )
        )
        if shaped and not is_slice:
            raise ValueError(
                f"as_sequences needs a slice sampler, not {type(self.sampler).__name__}"
            )
        pad = is_slice and self.sampler.pad_output  # type: ignore[attr-defined]
        with self._lock:
            draw = self.sampler._draw(size)
            plan = _output.plan(draw, shaped=shaped, pad=pad)
            columns = self.storage.gather(torch.from_numpy(plan.rows))
        data, info = _output.build(columns, draw, plan, self.sampler, shaped=shaped)
        return (data, info) if return_info else data

    def __iter__(self) -> Iterator[TensorDict]:
        """Batches until the sampler runs out (samplers with replacement never do)."""
        if self.batch_size is None:
            raise RuntimeError("iterating needs the buffer's batch_size")
        self.sampler.ran_out = False
        while not self.sampler.ran_out:
            yield self.sample()  # type: ignore[misc]

    def __getitem__(self, index: int | slice | Tensor) -> TensorDict:
        """Stored steps by storage row (as TorchRL's ``rb[index]``)."""
        with self._lock:
            rows = torch.arange(self.storage.max_size)[index]
            flat = rows.reshape(-1)
            if (self._index.row_slot[flat.numpy()] < 0).any():
                raise IndexError(f"row(s) {index} hold no stored step")
            columns = self.storage.gather(flat)
        shape = tuple(rows.shape)
        out = {k: v.reshape(shape + tuple(v.shape[1:])) for k, v in columns.items()}
        return _output.to_tensordict(out, shape)

    def update_priority(
        self, index: Tensor | np.ndarray, priority: Tensor | np.ndarray | float
    ) -> None:
        """Set priorities of sampled steps (prioritised samplers; ignored by the others).

        ``index`` are storage rows (``sample["index"]`` or ``info["index"]``), ``priority``
        has the same shape or broadcasts to it.
        """
        idx = index.detach().cpu().numpy() if isinstance(index, Tensor) else np.asarray(index)
        prio = (
            priority.detach().cpu().double().numpy()
            if isinstance(priority, Tensor)
            else np.asarray(priority, dtype=np.float64)
        )
        with self._lock:
            self.sampler.update_priority(idx, prio)

    # ------------------------------------------------------------------ persistence
    def dumps(self, path: str | Path) -> None:
        """Save the whole buffer — data, cursor, index, sampler state — under ``path``.

        Tensors are written as raw bytes and index/sampler arrays as ``.npy`` (no pickle);
        ``buffer.json`` is written last, atomically. A buffer built with the same storage size
        and sampler settings and restored with :meth:`loads` samples exactly as this one.
        """
        root = Path(path)
        with self._lock:
            (root / "storage").mkdir(parents=True, exist_ok=True)
            schema = self.storage.schema
            if schema is not None:
                for i, key in enumerate(schema.entries):
                    tensor_to_file(self.storage.columns[key], root / "storage" / f"col_{i:03d}.bin")
            doc = {
                "format": _FORMAT,
                "capacity": self.storage.max_size,
                "schema": None if schema is None else schema.to_json(),
                "boundaries": None if self._bounds is None else self._bounds.to_json(),
                "index": save_arrays(root / "index", self._index.state_dict()),  # type: ignore[arg-type]
                "sampler_config": self.sampler.config(),
                "sampler": save_arrays(root / "sampler", self.sampler.state_dict()),  # type: ignore[arg-type]
            }
            write_json_atomic(root / "buffer.json", doc)

    def loads(self, path: str | Path) -> None:
        """Restore a buffer saved with :meth:`dumps` into this (same-sized, same-sampler) one."""
        root = Path(path)
        doc = read_json(root / "buffer.json")
        if doc.get("format") != _FORMAT:
            raise ValueError(f"{root}: not a saved splice replay buffer")
        if doc["capacity"] != self.storage.max_size:
            raise ValueError(
                f"{root} holds a buffer of {doc['capacity']} steps; this storage has "
                f"{self.storage.max_size}"
            )
        if doc["sampler_config"] != self.sampler.config():
            raise ValueError(
                f"{root} was saved with sampler {doc['sampler_config']}, not "
                f"{self.sampler.config()}"
            )
        schema = None if doc["schema"] is None else Schema.from_json(doc["schema"])  # type: ignore[arg-type]
        with self._lock:
            if schema is not None:
                if self.storage.schema is None:
                    self.storage.allocate(schema)
                elif self.storage.schema != schema:
                    raise LayoutError(f"{root} stores other keys than this buffer")
                for i, (key, (dtype, shape)) in enumerate(schema.entries.items()):
                    data = tensor_from_file(
                        root / "storage" / f"col_{i:03d}.bin",
                        dtype,
                        (self.storage.max_size, *shape),
                    )
                    self.storage.columns[key].copy_(data)
            bounds = doc["boundaries"]
            self._bounds = None if bounds is None else Boundaries.from_json(bounds)  # type: ignore[arg-type]
            self._index.load_state_dict(load_arrays(root / "index", doc["index"]))  # type: ignore[arg-type]
            self.sampler._attach(self._index, self.batch_size)
            self.sampler.load_state_dict(load_arrays(root / "sampler", doc["sampler"]))  # type: ignore[arg-type]
            self.storage.commit(self._small_state())


def _group_trajectories(columns: Columns, keys: np.ndarray) -> tuple[Columns, np.ndarray]:
    """Reorder a batch whose trajectories interleave (a trajectory in several runs) so that
    each trajectory's steps are consecutive, in order of first appearance, time order kept."""
    change = np.flatnonzero(keys[1:] != keys[:-1])
    if change.size == 0:
        return columns, keys
    run_keys = np.sort(keys[np.concatenate([[0], change + 1])])
    if not (run_keys[1:] == run_keys[:-1]).any():
        return columns, keys
    order = index_by_id(torch.from_numpy(np.ascontiguousarray(keys))).cat_order()
    return {k: take_rows(v, order) for k, v in columns.items()}, keys[order.numpy()]


def _on_device(columns: Columns, device: torch.device) -> Columns:
    if all(v.device == device for v in columns.values()):
        return columns
    return {k: v if v.device == device else v.to(device) for k, v in columns.items()}
