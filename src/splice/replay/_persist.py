"""A replay buffer's whole state as one :class:`Snapshot`, in memory or on disk, no pickle.

``ReplayBuffer.state_dict`` / ``load_state_dict`` exchange a snapshot as a dict of tensors,
numbers, strings and lists (what ``torch.load(weights_only=True)`` accepts);
``ReplayBuffer.dumps`` / ``loads`` write it to a directory: raw tensor bytes per column,
``.npy`` files (loaded with ``allow_pickle=False``) for the index and sampler arrays, and one
JSON document.

A dump is atomic: the files go to a new subdirectory ``v-<random hex>``, and ``buffer.json``,
which names that subdirectory, is renamed over the previous one last. A process killed at any
moment leaves ``buffer.json`` naming a complete dump (the previous or the new one); the
subdirectories it does not name are deleted by the next ``dumps``. Nothing read back is
trusted before it is checked (:func:`check_snapshot`, with the checks of
:mod:`splice.replay._validate`).

Every tensor key is saved whole (a shared next column rebuilt: the saved form does not depend
on the storage's layout, and a restore stores it again by the storage's own rule). An object
column is saved as text (:func:`~splice.replay._objects.encode_text`): its UTF-8 bytes and
per-row lengths, two tensors in a state dict, two raw files on disk.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from splice.layout import Key, LayoutError
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
from splice.replay._objects import decode_text, encode_text
from splice.replay._state import as_int, flatten, from_tensors, to_tensors, unflatten
from splice.replay._validate import (
    MAX_POSITION,
    Source,
    check_index,
    check_keys,
    int_array,
    int_in,
)
from splice.replay.index import IndexState, ReplayIndex
from splice.replay.samplers._base import SamplerState

__all__ = [
    "FORMAT",
    "Snapshot",
    "check_snapshot",
    "from_state_dict",
    "read_dir",
    "to_state_dict",
    "write_dir",
]

FORMAT = "splice.replay/3"
#: The subdirectories of a dump directory that hold the files of one dump.
_DATA_DIR = re.compile(r"v-[0-9a-f]{32}")


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
        objects: the storage's object columns in schema order (``[capacity]`` object arrays).
        source: where it was read from (names the files in error messages).
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
    objects: list[np.ndarray] = field(default_factory=list)
    source: Source = field(default_factory=Source)


def _encode_objects(snap: Snapshot) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each object column as ``(utf8, lengths)`` (raises before anything is written)."""
    keys = () if snap.schema is None else snap.schema.objects
    return [encode_text(values, key) for key, values in zip(keys, snap.objects, strict=True)]


def _decode_objects(parts: list[tuple[np.ndarray, np.ndarray]], where: str) -> list[np.ndarray]:
    try:
        return [decode_text(utf8, lengths) for utf8, lengths in parts]
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: a text column is not UTF-8: {err}") from err


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


def _parse_header(doc: Mapping[str, object], src: Source) -> _Header:
    if doc.get("format") != FORMAT:
        raise ValueError(
            f"{src.field('format')}: {doc.get('format')!r} is not a saved splice replay "
            f"buffer ({FORMAT!r})"
        )
    capacity = as_int(doc.get("capacity"), src.field("capacity"))
    if capacity < 1:
        raise ValueError(f"{src.field('capacity')}: {capacity} is not a positive int")
    schema_doc, bounds_doc = doc.get("schema"), doc.get("boundaries")
    try:
        schema = None if schema_doc is None else Schema.from_json(schema_doc)
    except ValueError as err:
        raise ValueError(f"{src.field('schema')}: {err}") from err
    try:
        bounds = None if bounds_doc is None else Boundaries.from_json(bounds_doc)
    except ValueError as err:
        raise ValueError(f"{src.field('boundaries')}: {err}") from err
    config = doc.get("sampler_config")
    if not isinstance(config, dict):
        raise ValueError(f"{src.field('sampler_config')}: expected an object, got {config!r}")
    batch = doc.get("batch_size")
    batch_size = None if batch is None else as_int(batch, src.field("batch_size"))
    kind = doc.get("kind")
    if kind not in (None, "tensordict", "tensor", "dict"):
        raise ValueError(f"{src.field('kind')}: unknown kind {kind!r}")
    return _Header(
        capacity, schema, bounds, config, batch_size, None if kind is None else str(kind)
    )


def _unflatten_state(cls: type[Any], flat: Mapping[str, object], where: str) -> Any:
    try:
        return unflatten(cls, flat)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err


def to_state_dict(snap: Snapshot) -> dict[str, object]:
    """The snapshot as a dict of tensors (copies), numbers, strings, lists and dicts."""
    objects = _encode_objects(snap)
    out = _header(snap)
    out["columns"] = [column.detach().clone() for column in snap.columns]
    out["objects"] = [
        {"utf8": torch.from_numpy(utf8), "length": torch.from_numpy(lengths)}
        for utf8, lengths in objects
    ]
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
    src = Source()
    head = _parse_header(state, src)
    columns, index, sampler = state.get("columns"), state.get("index"), state.get("sampler")
    if not isinstance(columns, list) or not all(isinstance(c, Tensor) for c in columns):
        raise ValueError("state dict: 'columns' must be a list of tensors")
    if not isinstance(index, Mapping) or not isinstance(sampler, Mapping):
        raise ValueError("state dict: 'index' and 'sampler' must be mappings")
    return Snapshot(
        objects=_read_objects(state.get("objects", [])),
        capacity=head.capacity,
        schema=head.schema,
        columns=list(columns),
        boundaries=head.boundaries,
        index=_unflatten_state(IndexState, from_tensors(index), src.group("index")),
        sampler_config=head.sampler_config,
        sampler=_unflatten_state(sampler_state, from_tensors(sampler), src.group("sampler")),
        batch_size=head.batch_size,
        kind=head.kind,
        source=src,
    )


def _read_objects(items: object) -> list[np.ndarray]:
    """The object columns of a state dict (``[{"utf8": tensor, "length": tensor}, ...]``)."""
    if not isinstance(items, list):
        raise ValueError("state dict: 'objects' must be a list")
    parts = []
    for item in items:
        utf8 = item.get("utf8") if isinstance(item, Mapping) else None
        lengths = item.get("length") if isinstance(item, Mapping) else None
        if not (
            isinstance(utf8, Tensor)
            and utf8.dtype == torch.uint8
            and isinstance(lengths, Tensor)
            and lengths.dtype == torch.int64
        ):
            raise ValueError("state dict: an object column must be uint8 'utf8' and int64 'length'")
        parts.append((utf8.numpy(), lengths.numpy()))
    return _decode_objects(parts, "state dict")


def write_dir(snap: Snapshot, root: Path) -> None:
    """Write the snapshot under ``root`` atomically (see the module docs).

    Raises:
        OSError: a file cannot be written (a full disk): the previous dump in ``root``, if
            any, is left as it was, and the new files are removed.
    """
    objects = _encode_objects(snap)
    root.mkdir(parents=True, exist_ok=True)
    name = f"v-{uuid.uuid4().hex}"
    data = root / name
    try:
        (data / "storage").mkdir(parents=True)
        for i, column in enumerate(snap.columns):
            tensor_to_file(column, data / "storage" / f"col_{i:03d}.bin")
        for j, (utf8, lengths) in enumerate(objects):
            tensor_to_file(torch.from_numpy(lengths), data / "storage" / f"obj_{j:03d}.length.bin")
            tensor_to_file(torch.from_numpy(utf8), data / "storage" / f"obj_{j:03d}.utf8.bin")
        doc = _header(snap)
        doc["data"] = name
        doc["index"] = save_arrays(data / "index", flatten(snap.index))
        doc["sampler"] = save_arrays(data / "sampler", flatten(snap.sampler))
        write_json_atomic(root / "buffer.json", doc)  # the commit
    except BaseException:
        shutil.rmtree(data, ignore_errors=True)
        raise
    for old in root.iterdir():
        if old.name != name and _DATA_DIR.fullmatch(old.name) and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def read_dir(root: Path, sampler_state: type[SamplerState]) -> Snapshot:
    """The inverse of :func:`write_dir`: reads the files ``buffer.json`` names.

    Raises:
        ValueError: not a directory written by :func:`write_dir`, or a malformed file (the
            message names it). Semantic checks are :mod:`splice.replay._validate`'s.
    """
    doc = read_json(root / "buffer.json")
    name = doc.get("data")
    if not isinstance(name, str) or not _DATA_DIR.fullmatch(name):
        raise ValueError(f"{root / 'buffer.json'}: data: bad data directory {name!r}")
    data = root / name
    src = Source(root, data)
    head = _parse_header(doc, src)
    if not data.is_dir():
        raise ValueError(f"{data}: missing (named by {src.header})")
    columns = []
    if head.schema is not None:
        for i, (dtype, shape) in enumerate(head.schema.entries.values()):
            path = data / "storage" / f"col_{i:03d}.bin"
            try:
                columns.append(tensor_from_file(path, dtype, (head.capacity, *shape)))
            except FileNotFoundError as err:
                raise ValueError(f"{path}: missing (named by {src.header})") from err
    parts = []
    for j in range(0 if head.schema is None else len(head.schema.objects)):
        path = data / "storage" / f"obj_{j:03d}.length.bin"
        try:
            lengths = tensor_from_file(path, torch.int64, (head.capacity,)).numpy()
            path = data / "storage" / f"obj_{j:03d}.utf8.bin"
            utf8 = np.fromfile(path, dtype=np.uint8)
        except FileNotFoundError as err:
            raise ValueError(f"{path}: missing (named by {src.header})") from err
        parts.append((utf8, lengths))
    index = load_arrays(data / "index", doc.get("index"), src.field("index"))
    sampler = load_arrays(data / "sampler", doc.get("sampler"), src.field("sampler"))
    return Snapshot(
        objects=_decode_objects(parts, str(data)),
        capacity=head.capacity,
        schema=head.schema,
        columns=columns,
        boundaries=head.boundaries,
        index=_unflatten_state(IndexState, index, src.group("index")),
        sampler_config=head.sampler_config,
        sampler=_unflatten_state(sampler_state, sampler, src.group("sampler")),
        batch_size=head.batch_size,
        kind=head.kind,
        source=src,
    )


def check_snapshot(
    snap: Snapshot,
    *,
    capacity: int,
    schema: Schema | None,
    sampler_config: Mapping[str, object],
) -> ReplayIndex:
    """Check a snapshot read from a dump or a state dict against a buffer of ``capacity``
    steps, its storage's ``schema`` and its sampler's settings: the columns' dtypes and
    shapes, the index (:func:`check_index`) and the trajectory keys against the stored data
    (:func:`check_keys`). The sampler's own state is the sampler's to check.

    Returns:
        A new index holding the snapshot's (checked) index state.

    Raises:
        ValueError: naming the file (or state-dict entry) and the field.
        LayoutError: the snapshot stores other keys than ``schema``.
    """
    src = snap.source
    if snap.capacity != capacity:
        raise ValueError(
            f"{src.field('capacity')}: the saved buffer holds {snap.capacity} steps; this "
            f"storage has {capacity}"
        )
    if snap.sampler_config != sampler_config:
        raise ValueError(
            f"{src.field('sampler_config')}: saved with sampler {snap.sampler_config}, not "
            f"{dict(sampler_config)}"
        )
    if snap.schema is not None and schema is not None and schema != snap.schema:
        raise LayoutError(f"{src.header} stores other keys than this buffer")
    column_where: dict[Key, str] = {}
    columns: dict[Key, Tensor] = {}
    if snap.schema is None:
        if snap.columns:
            raise ValueError(f"{src.field('columns')}: saved columns without a schema")
    else:
        if len(snap.columns) != len(snap.schema.entries):
            raise ValueError(
                f"{src.field('columns')}: {len(snap.columns)} columns for a schema of "
                f"{len(snap.schema.entries)} keys"
            )
        for i, (column, (key, (dtype, shape))) in enumerate(
            zip(snap.columns, snap.schema.entries.items(), strict=True)
        ):
            column_where[key] = src.column(i, key)
            if column.dtype != dtype or tuple(column.shape) != (capacity, *shape):
                raise ValueError(
                    f"{column_where[key]}: expected dtype {dtype} and shape "
                    f"{[capacity, *shape]}, got {column.dtype} and {list(column.shape)}"
                )
            columns[key] = column.detach().cpu()
        if len(snap.objects) != len(snap.schema.objects) or any(
            values.shape != (capacity,) for values in snap.objects
        ):
            raise ValueError(
                f"{src.field('objects')}: {len(snap.objects)} text columns for "
                f"{len(snap.schema.objects)} object keys, each of {capacity} rows expected"
            )
    # The keys against the stored data first (the most direct diagnosis of garbage keys),
    # then the index against the keys.
    wc = int_in(snap.index.write_count, src.entry("index", "write_count"), 0, MAX_POSITION)
    lo = int_in(snap.index.lo, src.entry("index", "lo"), max(0, wc - capacity), wc)
    if wc > lo and (snap.schema is None or snap.kind is None):
        raise ValueError(f"{src.header}: rows are stored but there is no schema or kind")
    keys_where = src.entry("index", "row_key", array=True)
    check_keys(
        int_array(snap.index.row_key, keys_where, capacity),
        lo,
        wc,
        snap.boundaries,
        columns,
        keys_where=keys_where,
        column_where=column_where,
    )
    index = check_index(snap.index, capacity, src)
    return index
