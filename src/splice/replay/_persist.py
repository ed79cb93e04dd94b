"""A replay buffer's whole state as one :class:`Snapshot`, in memory or on disk, no pickle.

``ReplayBuffer.state_dict`` / ``load_state_dict`` exchange a snapshot as a dict of tensors,
numbers, strings and lists (what ``torch.load(weights_only=True)`` accepts);
``ReplayBuffer.dumps`` / ``loads`` write it to a directory: raw tensor bytes per column,
``.npy`` files (loaded with ``allow_pickle=False``) for the index and sampler arrays, and one
JSON document, written last and atomically.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from splice.replay._batch import Schema
from splice.replay._boundaries import Boundaries
from splice.replay._files import (
    load_arrays,
    read_json,
    save_arrays,
    tensor_from_file,
    tensor_to_file,
    write_json_atomic,
)
from splice.replay._state import as_int, flatten, from_tensors, to_tensors, unflatten
from splice.replay.index import IndexState
from splice.replay.samplers._base import SamplerState

__all__ = [
    "FORMAT",
    "Snapshot",
    "check_arrays",
    "from_state_dict",
    "read_dir",
    "to_state_dict",
    "write_dir",
]

FORMAT = "splice.replay/2"


@dataclass
class Snapshot:
    """Everything a replay buffer needs to continue exactly where it was.

    Attributes:
        capacity: the storage size.
        schema: the stored keys (None: nothing was ever written).
        columns: the storage's columns in schema order (``[capacity, ...]`` each).
        boundaries: the boundary state (None: no write yet).
        index: the trajectory index.
        sampler_config: the sampler's constructor settings (must match to restore).
        sampler: the sampler's state.
        batch_size: the buffer's default batch size.
        kind: the container the buffer holds (``"tensordict"``, ``"tensor"``, ``"dict"``).
    """

    capacity: int
    schema: Schema | None
    columns: list[Tensor]
    boundaries: Boundaries | None
    index: IndexState
    sampler_config: dict[str, object]
    sampler: SamplerState
    batch_size: int | None
    kind: str | None


def _header(snap: Snapshot) -> dict[str, object]:
    return {
        "format": FORMAT,
        "capacity": snap.capacity,
        "schema": None if snap.schema is None else snap.schema.to_json(),
        "boundaries": None if snap.boundaries is None else snap.boundaries.to_json(),
        "sampler_config": snap.sampler_config,
        "batch_size": snap.batch_size,
        "kind": snap.kind,
    }


@dataclass(frozen=True)
class _Header:
    capacity: int
    schema: Schema | None
    boundaries: Boundaries | None
    sampler_config: dict[str, object]
    batch_size: int | None
    kind: str | None


def _parse_header(doc: Mapping[str, object], where: str) -> _Header:
    if doc.get("format") != FORMAT:
        raise ValueError(f"{where}: not a saved splice replay buffer (format {FORMAT})")
    capacity = as_int(doc.get("capacity"), f"{where}: capacity")
    schema_doc, bounds_doc = doc.get("schema"), doc.get("boundaries")
    schema = None if schema_doc is None else Schema.from_json(schema_doc)
    bounds = None if bounds_doc is None else Boundaries.from_json(bounds_doc)
    config = doc.get("sampler_config")
    if not isinstance(config, dict):
        raise ValueError(f"{where}: bad sampler_config {config!r}")
    batch = doc.get("batch_size")
    batch_size = None if batch is None else as_int(batch, f"{where}: batch_size")
    kind = doc.get("kind")
    if kind not in (None, "tensordict", "tensor", "dict"):
        raise ValueError(f"{where}: bad kind {kind!r}")
    return _Header(
        capacity, schema, bounds, config, batch_size, None if kind is None else str(kind)
    )


def to_state_dict(snap: Snapshot) -> dict[str, object]:
    """The snapshot as a dict of tensors (copies), numbers, strings, lists and dicts."""
    out = _header(snap)
    out["columns"] = [column.detach().clone() for column in snap.columns]
    out["index"] = to_tensors(flatten(snap.index))
    out["sampler"] = to_tensors(flatten(snap.sampler))
    return out


def from_state_dict(state: Mapping[str, object], sampler_state: type[SamplerState]) -> Snapshot:
    """The inverse of :func:`to_state_dict`.

    Raises:
        ValueError: not a state dict of a splice replay buffer, or a malformed entry.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"a state dict is a mapping, got {type(state).__name__}")
    head = _parse_header(state, "state dict")
    columns, index, sampler = state.get("columns"), state.get("index"), state.get("sampler")
    if not isinstance(columns, list) or not all(isinstance(c, Tensor) for c in columns):
        raise ValueError("state dict: 'columns' must be a list of tensors")
    if not isinstance(index, Mapping) or not isinstance(sampler, Mapping):
        raise ValueError("state dict: 'index' and 'sampler' must be mappings")
    return Snapshot(
        capacity=head.capacity,
        schema=head.schema,
        columns=list(columns),
        boundaries=head.boundaries,
        index=unflatten(IndexState, from_tensors(index)),
        sampler_config=head.sampler_config,
        sampler=unflatten(sampler_state, from_tensors(sampler)),
        batch_size=head.batch_size,
        kind=head.kind,
    )


def write_dir(snap: Snapshot, root: Path) -> None:
    """Write the snapshot under ``root`` (``buffer.json`` last, atomically)."""
    (root / "storage").mkdir(parents=True, exist_ok=True)
    for i, column in enumerate(snap.columns):
        tensor_to_file(column, root / "storage" / f"col_{i:03d}.bin")
    doc = _header(snap)
    doc["index"] = save_arrays(root / "index", flatten(snap.index))
    doc["sampler"] = save_arrays(root / "sampler", flatten(snap.sampler))
    write_json_atomic(root / "buffer.json", doc)


def read_dir(root: Path, sampler_state: type[SamplerState]) -> Snapshot:
    """The inverse of :func:`write_dir`.

    Raises:
        ValueError: not a directory written by :func:`write_dir`, or a malformed file.
    """
    doc = read_json(root / "buffer.json")
    head = _parse_header(doc, str(root))
    columns = []
    if head.schema is not None:
        for i, (dtype, shape) in enumerate(head.schema.entries.values()):
            path = root / "storage" / f"col_{i:03d}.bin"
            columns.append(tensor_from_file(path, dtype, (head.capacity, *shape)))
    index, sampler = doc.get("index"), doc.get("sampler")
    if not isinstance(index, dict) or not isinstance(sampler, dict):
        raise ValueError(f"{root}: 'index' and 'sampler' must be objects")
    return Snapshot(
        capacity=head.capacity,
        schema=head.schema,
        columns=columns,
        boundaries=head.boundaries,
        index=unflatten(IndexState, load_arrays(root / "index", index)),
        sampler_config=head.sampler_config,
        sampler=unflatten(sampler_state, load_arrays(root / "sampler", sampler)),
        batch_size=head.batch_size,
        kind=head.kind,
    )


def check_arrays(snap: Snapshot) -> None:
    """Raise ``ValueError`` if a column does not have the schema's dtype and shape."""
    if snap.schema is None:
        if snap.columns:
            raise ValueError("saved columns without a schema")
        return
    if len(snap.columns) != len(snap.schema.entries):
        raise ValueError(
            f"saved {len(snap.columns)} columns for a schema of {len(snap.schema.entries)} keys"
        )
    for column, (key, (dtype, shape)) in zip(
        snap.columns, snap.schema.entries.items(), strict=True
    ):
        if column.dtype != dtype or tuple(column.shape) != (snap.capacity, *shape):
            raise ValueError(
                f"saved column {key}: expected dtype {dtype} and shape "
                f"{[snap.capacity, *shape]}, got {column.dtype} and {list(column.shape)}"
            )
    index = snap.index
    for name in ("row_slot", "row_step", "row_seg", "row_key"):
        size = np.asarray(getattr(index, name)).size
        if size != snap.capacity:
            raise ValueError(f"saved index: {name} has {size} rows, not {snap.capacity}")
    if not 0 <= index.lo <= index.write_count or index.write_count - index.lo > snap.capacity:
        raise ValueError(f"saved index: bad live range [{index.lo}, {index.write_count})")
