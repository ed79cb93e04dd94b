"""Turn a sampler's :class:`Draw` into the sample TensorDict (and the ``info`` dict).

Split in three so that the buffer holds its lock only while reading the storage:
:func:`plan` decides which rows (and keys) to read, :func:`read` gathers them (under the
lock), :func:`build` assembles the output from what was read (after).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

from splice._gather import numpy_view, take_rows
from splice._non_tensor import set_objects
from splice.layout import CUT, MASK, Key, LayoutError, fmt_key
from splice.replay._batch import Columns, Objects, Schema
from splice.replay._structures import EMPTY
from splice.replay.samplers._base import Draw, SliceMarks

if TYPE_CHECKING:
    from splice.replay.storage import Storage

__all__ = [
    "BURN_IN",
    "INDEX",
    "PRIORITY_WEIGHT",
    "Plan",
    "Read",
    "build",
    "check_keys",
    "plan",
    "read",
]

#: True on the steps before a slice's training steps (burn-in or context: no loss there).
BURN_IN = ("collector", "burn_in")
#: Storage row of every sampled step (-1 on padding), as TorchRL's ``"index"``.
INDEX = ("index",)
#: Importance weight of every sampled step (prioritised samplers), as TorchRL's.
PRIORITY_WEIGHT = ("priority_weight",)


@dataclass(frozen=True)
class Plan:
    """Which rows to read and how the output is shaped.

    Attributes:
        rows: flat storage rows to read, one per output step (padding replaced by the
            slice's last real row).
        batch: output batch size.
        select: for flat unpadded slices with some short slice, the ``[S, W]`` mask of real
            steps whose flattening gives the output order; else None.
        train_from: with ``burn_in_keys``, each slice's first training column: the
            positions before it (burn-in steps and, right-aligned, the padding before them)
            read only the burn-in keys. None: every position reads every key.
        first: with ``burn_in_keys``, the row of each slice's first step (where
            ``state_keys`` are read); else None.
        full_from: the first training column when it is the same in every row and the
            output has ``W`` positions per row (right-aligned burn-in); else None.
    """

    rows: np.ndarray
    batch: tuple[int, ...]
    select: np.ndarray | None
    train_from: np.ndarray | None = None
    first: np.ndarray | None = None
    full_from: int | None = None

    def before(self) -> np.ndarray:
        """Bool ``[n]``: the output positions before their slice's training steps."""
        assert self.train_from is not None
        W = (
            self.select.shape[1]
            if self.select is not None
            else self.rows.size // self.train_from.size
        )
        mask = np.arange(W) < self.train_from[:, None]
        return mask[self.select] if self.select is not None else mask.reshape(-1)

    def full(self) -> np.ndarray:
        """The output positions from each slice's first training step on."""
        return np.flatnonzero(~self.before())


def slice_lengths(draw: Draw) -> np.ndarray:
    """``[S]`` real steps per slice: ``draw.length``, or each row's steps (rows ``>= 0``)."""
    if draw.length is not None:
        return draw.length
    return np.count_nonzero(draw.rows >= 0, axis=1).astype(np.int64)


def slice_starts(draw: Draw) -> np.ndarray | int:
    """``[S]`` column of each slice's first step: ``draw.start``, or 0 (left-aligned)."""
    return draw.start if draw.start is not None else 0


def plan(draw: Draw, *, shaped: bool, pad: bool, marks: SliceMarks | None = None) -> Plan:
    rows = draw.rows
    if rows.ndim == 1:
        return Plan(rows, (rows.size,), None)
    S, W = rows.shape
    valid = rows >= 0
    select = None
    if valid.all():
        flat, batch = rows.reshape(-1), ((S, W) if shaped else (S * W,))
    elif shaped or pad:
        start = slice_starts(draw)
        last = rows[np.arange(S), start + slice_lengths(draw) - 1]
        flat = np.where(valid, rows, last[:, None]).reshape(-1)
        batch = (S, W) if shaped else (S * W,)
    else:
        flat, batch, select = rows[valid], (int(valid.sum()),), valid
    if marks is None or marks.burn_in_keys is None or draw.burn is None:
        return Plan(flat, batch, select)
    # Burn-in keys: every column left of a slice's first training step reads only them.
    start = slice_starts(draw)
    train_from = start + draw.burn  # each slice's first training column
    if not train_from.any():
        return Plan(flat, batch, select)
    first = rows[np.arange(S), start]
    c0 = int(train_from[0])
    regular = select is None and bool((train_from == c0).all())  # (right-aligned)
    return Plan(flat, batch, select, train_from, first, c0 if regular else None)


def stored_keys(schema: Schema) -> list[Key]:
    """Every stored key: the tensor keys, then the object keys."""
    return [*schema.entries, *schema.objects]


def burn_in_leaves(keys: tuple[Key, ...], schema: Schema) -> set[Key]:
    """The stored keys that ``keys`` name (a key names itself and every key under it)."""
    return {leaf for leaf in stored_keys(schema) if any(leaf[: len(key)] == key for key in keys)}


def check_keys(marks: SliceMarks | None, schema: Schema | None) -> None:
    """Raise, before a draw, if the sampler asks for keys the buffer does not store.

    Raises:
        LayoutError: a ``burn_in_keys`` entry naming no stored key, or a ``state_keys``
            entry that is not a stored key (the message names the argument and the key).
    """
    if marks is None or schema is None or not (marks.burn_in_keys or marks.state_keys):
        return
    stored = stored_keys(schema)
    for key in marks.burn_in_keys or ():
        if not burn_in_leaves((key,), schema):
            raise LayoutError(
                f"burn_in_keys: {fmt_key(key)} is not stored in the buffer (stored keys: "
                f"{', '.join(fmt_key(k) for k in stored)})"
            )
    for key in marks.state_keys:
        if key not in schema.entries and key not in schema.objects:
            raise LayoutError(
                f"state_keys: {fmt_key(key)} is not stored in the buffer (stored keys: "
                f"{', '.join(fmt_key(k) for k in stored)})"
            )


@dataclass(frozen=True)
class Read:
    """What :func:`read` gathered: the output's columns and object columns (one value per
    output step), the rows read as a tensor, and the ``state_keys`` at each slice's first
    step when they were read apart (``burn_in_keys``; else None)."""

    columns: Columns
    objects: Objects
    rows: Tensor
    initial: tuple[Columns, Objects] | None = None


#: Keys of at most this many bytes per step are read at every position of a slice with
#: ``burn_in_keys`` and zeroed before its training steps (reading a few neighbouring rows
#: costs less than a second gather); larger ones are read at the training steps only.
SMALL_STEP_BYTES = 64


def read(storage: Storage, p: Plan, marks: SliceMarks | None) -> Read:
    """Gather the rows of plan ``p`` from ``storage`` (called under the buffer's lock).

    With ``burn_in_keys``, the keys they name are read at every position; the other keys
    are zero (None for object keys) before each slice's training steps, where they are not
    read (keys of up to :data:`SMALL_STEP_BYTES` per step are read with the neighbouring
    rows, then zeroed). Cost: O(output steps) per key either way.
    """
    rows = torch.from_numpy(p.rows)
    if p.train_from is None:
        return Read(storage.gather(rows), storage.gather_objects(rows), rows)
    assert marks is not None and marks.burn_in_keys is not None and storage.schema is not None
    schema = storage.schema
    wanted, small, large = _split_keys(marks.burn_in_keys, schema)
    everywhere = storage.gather(rows, wanted | small)
    everywhere_objects = storage.gather_objects(rows, wanted)
    part: Columns = {}
    part_objects: Objects = {}
    full = p.full() if large else EMPTY
    if large:
        full_rows = torch.from_numpy(p.rows[full])
        part = storage.gather(full_rows, large)
        part_objects = storage.gather_objects(full_rows, large)
    before = p.before() if small and p.full_from is None else None
    n = p.rows.size
    columns: Columns = {}
    for key in schema.entries:
        if key in wanted:
            columns[key] = everywhere[key]
        elif key in small:
            columns[key] = _zero_before(everywhere[key], p, before)
        else:
            columns[key] = _spread(part[key], p, full)
    objects: Objects = {}
    for key in schema.objects:
        if key in wanted:
            objects[key] = everywhere_objects[key]
        else:
            objects[key] = np.full(n, None, dtype=object)
            objects[key][full] = part_objects[key]
    initial = None
    if marks.state_keys and p.first is not None:
        first = torch.from_numpy(p.first)
        state = set(marks.state_keys)
        initial = storage.gather(first, state), storage.gather_objects(first, state)
    return Read(columns, objects, rows, initial)


KeySplit = tuple[frozenset[Key], frozenset[Key], frozenset[Key]]
#: The last split computed, ``(schema, burn_in_keys, split)``: a schema never changes once a
#: storage has one, so a buffer sampled again reuses it (replaced whole: thread safe).
_last_split: tuple[Schema, tuple[Key, ...], KeySplit] | None = None


def _split_keys(keys: tuple[Key, ...], schema: Schema) -> KeySplit:
    """The stored keys ``keys`` name; the other tensor keys of at most
    :data:`SMALL_STEP_BYTES` per step; and the rest."""
    global _last_split
    last = _last_split
    if last is not None and last[0] is schema and last[1] == keys:
        return last[2]
    wanted = frozenset(burn_in_leaves(keys, schema))
    small = frozenset(
        key
        for key, (dtype, shape) in schema.entries.items()
        if key not in wanted and dtype.itemsize * math.prod(shape) <= SMALL_STEP_BYTES
    )
    large = frozenset(k for k in stored_keys(schema) if k not in wanted and k not in small)
    _last_split = schema, keys, (wanted, small, large)
    return wanted, small, large


def _zero_before(out: Tensor, p: Plan, before: np.ndarray | None) -> Tensor:
    """``out`` (a fresh ``[n, ...]`` gather) with its positions before the training steps
    (``before``, or the first ``p.full_from`` columns of every row) zeroed, in place."""
    target = numpy_view(out)
    if p.full_from is not None and target is not None:  # one slice, no index
        _grid(target, p)[:, : p.full_from] = 0
        return out
    if before is None:
        before = p.before()
    if target is None:
        out[torch.from_numpy(before).to(out.device)] = 0
    else:
        target[before] = 0
    return out


def _grid(target: np.ndarray, p: Plan) -> np.ndarray:
    """``target`` (``[n, ...]``) viewed as ``[S, W, -1]``."""
    assert p.train_from is not None
    S = p.train_from.size
    return target.reshape(S, target.shape[0] // S, -1)


def _spread(values: Tensor, p: Plan, full: np.ndarray) -> Tensor:
    """``[n, ...]`` zeros with ``values`` at the output positions ``full``."""
    out = values.new_empty((p.rows.size, *values.shape[1:]))
    target, source = numpy_view(out), numpy_view(values)
    if p.full_from is not None and target is not None and source is not None:
        grid = _grid(target, p)  # the last columns of every row: two slice copies
        grid[:, : p.full_from] = 0
        grid[:, p.full_from :] = source.reshape(grid.shape[0], -1, grid.shape[2])
        return out
    out.zero_()
    if target is not None and source is not None:
        target[full] = source
    else:
        out[torch.from_numpy(full).to(out.device)] = values
    return out


def _nest(flat: dict[Key, Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if len(key) == 1:  # (most keys of a sample: a third of the time of the loop below)
            out[key[0]] = value
            continue
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return out


def to_tensordict(
    flat: dict[Key, Tensor], batch: tuple[int, ...], objects: Objects | None = None
) -> TensorDict:
    """A TensorDict from tuple-keyed tensors that already have the right batch dims, and
    object arrays of the batch shape (as non-tensor entries)."""
    # tensordict's unchecked constructor: the columns were shaped here, so the public
    # constructor's checks only cost time (2 us against 18 us per sample, measured).
    td = TensorDict._new_unsafe(_nest(flat), batch_size=torch.Size(batch))
    return set_objects(td, objects) if objects else td


def _marker(m: np.ndarray, p: Plan, like: Tensor | None = None) -> Tensor:
    """A ``[S, W]`` boolean marker laid out like the output (and like ``like``'s dims)."""
    flat = m[p.select] if p.select is not None else m.reshape(p.batch)
    if not (flat.flags.writeable and flat.flags.c_contiguous):
        flat = flat.copy()
    out = torch.from_numpy(flat)
    if like is not None:
        out = out.view(*out.shape, *([1] * (like.dim() - out.dim())))
    return out


def build(
    got: Read, draw: Draw, p: Plan, marks: SliceMarks | None, *, shaped: bool
) -> tuple[TensorDict, dict[str, object]]:
    """The sample TensorDict and the info dict (see ``ReplayBuffer.sample``).

    ``got``: what :func:`read` gathered for plan ``p``. ``marks`` says how to mark slices (a
    sampler's :attr:`~splice.replay.Sampler.marks`; slices drawn by a sampler without marks
    get the defaults).
    """
    columns, objects = got.columns, got.objects
    shaped_objects = {k: v.reshape(p.batch) for k, v in objects.items()} if objects else None
    rows = draw.rows
    if rows.ndim == 1:  # single steps: the gathered columns are the output as they are
        out = dict(columns)
        index = got.rows if p.rows is rows else torch.from_numpy(rows)
        out[INDEX] = index
        info: dict[str, object] = {"index": index}
        if draw.weight is not None:
            weight = torch.from_numpy(draw.weight.astype(np.float32))
            out[PRIORITY_WEIGHT] = weight
            info["priority_weight"] = weight
        return to_tensordict(out, p.batch, shaped_objects), info
    out = {k: v.view(*p.batch, *v.shape[1:]) for k, v in columns.items()}
    marks = marks if marks is not None else SliceMarks()
    length = slice_lengths(draw)
    burn = draw.burn if draw.burn is not None else np.zeros(length.size, dtype=np.int64)
    start = slice_starts(draw)
    S, W = rows.shape
    n_out = int(np.prod(p.batch))
    # Output position of each slice's first step: rows of W, or real steps back to back.
    first = np.arange(S) * W + start if p.select is None else np.cumsum(length) - length
    last = first + length - 1
    j = np.arange(W) - np.reshape(start, (-1, 1))  # step within each slice
    valid = (j >= 0) & (j < length[:, None])
    padding = None if p.select is not None or bool(valid.all()) else ~valid.reshape(-1)
    if marks.truncated_key is not None:
        _mark_ends(out, last, padding, p.batch, marks.truncated_key)
    if marks.init_key is not None and marks.init_key in out:
        out[marks.init_key].numpy().reshape(n_out, -1)[first] = True
    if shaped or marks.pad_output:
        out[MASK] = _marker(valid, p)
    if marks.burn_in:
        out[BURN_IN] = _marker((j >= 0) & (j < burn[:, None]), p)
    index_rows = torch.from_numpy(rows)
    out[INDEX] = (
        index_rows[torch.from_numpy(p.select)]
        if p.select is not None
        else (index_rows.reshape(p.batch))
    )
    info = {
        "index": index_rows,
        "length": torch.from_numpy(length),
        "burn_in": torch.from_numpy(burn),
    }
    if draw.weight is not None:
        slice_weight = draw.weight.astype(np.float32)
        info["priority_weight"] = torch.from_numpy(slice_weight)
        per_step = np.repeat(slice_weight[:, None], W, axis=1)
        out[PRIORITY_WEIGHT] = torch.from_numpy(
            per_step[p.select] if p.select is not None else per_step
        ).reshape(p.batch)
    if marks.state_keys:
        if got.initial is not None:  # read apart, at each slice's first step
            at_first, objects_at_first = got.initial
            pick = np.arange(S)
        else:
            at_first, objects_at_first, pick = columns, objects, first
        info["initial_state"] = _initial_state(
            at_first, objects_at_first, pick, marks.state_keys, S
        )
    return to_tensordict(out, p.batch, shaped_objects), info


def _mark_ends(
    out: dict[Key, Tensor],
    last: np.ndarray,
    padding: np.ndarray | None,
    batch: tuple[int, ...],
    key: Key,
) -> None:
    """TorchRL's slice-end marks, plus clearing the collector cuts a slice runs through.

    ``last``: output positions of the slices' last real steps; ``padding``: padded positions
    (None: none). Works in place on the freshly gathered flags, through numpy views.
    """
    n = int(np.prod(batch))
    done_key = (*key[:-1], "done")
    terminated_key = (*key[:-1], "terminated")
    inside: np.ndarray | None = None  # collector cuts inside a slice: not an end there
    if CUT in out:
        cut = out[CUT].numpy().reshape(n)
        at_end = cut[last]
        inside = cut.copy()
        inside[last] = False
        cut[:] = False
        cut[last] = at_end
        if padding is not None:
            cut[padding] = False
    for name in (key, done_key):
        if name in out:
            flag = out[name].numpy().reshape(n, -1)
            if inside is not None:
                flag[inside] = False
        else:
            flag = np.zeros((n, 1), dtype=bool)
            out[name] = torch.from_numpy(flag).view(*batch, 1)
        flag[last] = True
        if padding is not None:
            flag[padding] = False
    if terminated_key not in out:
        out[terminated_key] = torch.zeros_like(out[key])
    elif padding is not None:
        out[terminated_key].numpy().reshape(n, -1)[padding] = False


def _initial_state(
    columns: Columns, objects: Objects, first: np.ndarray, keys: tuple[Key, ...], S: int
) -> TensorDict:
    pick = torch.from_numpy(first)
    state: dict[Key, Tensor] = {}
    state_objects: Objects = {}
    for key in keys:
        if key in objects:
            state_objects[key] = objects[key][first]
        elif key in columns:
            state[key] = take_rows(columns[key], pick)
        else:
            raise LayoutError(f"state key {fmt_key(key)} is not stored in the buffer")
    return to_tensordict(state, (S,), state_objects)
