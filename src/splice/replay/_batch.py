"""Normalise what ``extend`` receives into flat columns, and check it against the schema.

Accepted layouts (all produced by splice's collectors and trajectory ops):

* flat ``[N]`` steps, including the "cat" layout of whole trajectories;
* ``[B, T]`` collector batches (``[..., B, T]`` too): stored env-major, each env row
  contiguous, so that a chunk of one trajectory occupies consecutive rows;
* padded ``[N, T]`` trajectories with a ``("collector", "mask")``: padding is dropped (any
  batch of two or more dims that carries the mask key is treated as padded).

Rows whose trajectory id is negative (``-1`` marks padding) are dropped too. Nothing here
mutates anything: a batch either normalises completely or raises :class:`LayoutError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDictBase
from torch import Tensor

from splice._gather import take_rows
from splice.layout import CUT, MASK, LayoutError, tensor_leaves, validate_batch

__all__ = ["Columns", "FlatBatch", "Schema", "flatten_batch", "fmt_key"]

Key = tuple[str, ...]
Columns = dict[Key, Tensor]


def fmt_key(key: Key) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


@dataclass(frozen=True)
class Schema:
    """Per key: dtype and per-step shape. Fixed by the first batch a storage receives."""

    entries: dict[Key, tuple[torch.dtype, tuple[int, ...]]]

    @staticmethod
    def of(columns: Columns) -> Schema:
        return Schema({k: (v.dtype, tuple(v.shape[1:])) for k, v in columns.items()})

    def check(self, columns: Columns) -> None:
        """Raise :class:`LayoutError` naming every missing/extra key or the first mismatch."""
        missing = [k for k in self.entries if k not in columns]
        extra = [k for k in columns if k not in self.entries]
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing keys " + ", ".join(fmt_key(k) for k in missing))
            if extra:
                parts.append("unexpected keys " + ", ".join(fmt_key(k) for k in extra))
            raise LayoutError(
                "batch does not match the buffer's keys: " + "; ".join(parts) + " (the keys "
                "are fixed by the first batch written to the storage)"
            )
        for key, (dtype, shape) in self.entries.items():
            value = columns[key]
            if value.dtype != dtype or tuple(value.shape[1:]) != shape:
                raise LayoutError(
                    f"key {fmt_key(key)}: expected dtype {dtype} and per-step shape "
                    f"{list(shape)}, got dtype {value.dtype} and per-step shape "
                    f"{list(value.shape[1:])}"
                )

    def to_json(self) -> list[dict[str, object]]:
        return [
            {"key": list(k), "dtype": str(d).removeprefix("torch."), "shape": list(s)}
            for k, (d, s) in self.entries.items()
        ]

    @staticmethod
    def from_json(items: list[dict[str, object]]) -> Schema:
        entries: dict[Key, tuple[torch.dtype, tuple[int, ...]]] = {}
        for item in items:
            dtype = getattr(torch, str(item["dtype"]))
            shape = tuple(int(s) for s in item["shape"])  # type: ignore[attr-defined]
            entries[tuple(item["key"])] = (dtype, shape)  # type: ignore[arg-type]
        return Schema(entries)


@dataclass(frozen=True)
class FlatBatch:
    """A batch as flat ``[N, ...]`` columns, plus what the index needs to know about it.

    Attributes:
        columns: every stored key, ``[N, *per-step shape]``, env-major.
        n_envs: env rows ``B`` the steps came from (1 for flat input); each row's steps are
            consecutive in ``columns`` (``n_envs * steps_per_env == N`` unless ``padded``).
        padded: the input was padded trajectories (one trajectory per row, lengths vary).
        row_lengths: for padded input, the number of kept steps of each input row.
        flat: the input was flat ``[N]`` (no env rows to tell streams apart).
    """

    columns: Columns
    n_envs: int
    padded: bool
    row_lengths: np.ndarray | None
    flat: bool = False

    @property
    def n(self) -> int:
        first = next(iter(self.columns.values()), None)
        return 0 if first is None else first.shape[0]


def _leaves(td: TensorDictBase) -> Iterator[tuple[Key, Tensor]]:
    return tensor_leaves(td, context="a replay buffer")


def flatten_batch(td: TensorDictBase, ids_key: Key | None, first: bool) -> FlatBatch:
    """Flatten ``td`` env-major and drop its padding (see module docs).

    Args:
        td: the batch given to ``extend``.
        ids_key: key of the trajectory ids, if the buffer uses ids (rows with a negative id
            are padding and are dropped).
        first: this is the storage's first batch: also run the data-contract validator.
    """
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"extend expects a TensorDict, got {type(td).__name__}")
    if td.ndim == 0:
        raise LayoutError(
            "extend expects a batch with at least one dimension ([N], [B, T] or padded "
            "[N, T]); use add() for a single step"
        )
    if first:
        validate_batch(td, check_done_consistency=False)
    batch = td.batch_size
    ndim = len(batch)
    n = batch.numel()
    leaves = dict(_leaves(td))
    mask = leaves.pop(MASK, None)
    columns = {k: v.reshape(n, *v.shape[ndim:]) for k, v in leaves.items()}
    keep: Tensor | None = None
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape != batch:
            raise LayoutError(
                f"key {fmt_key(MASK)}: expected dtype torch.bool and shape {list(batch)}, got "
                f"dtype {mask.dtype} and shape {list(mask.shape)}"
            )
        keep = mask.reshape(n)
    if ids_key is not None and ids_key in columns:
        ids = columns[ids_key]
        if ids.dtype != torch.int64 or ids.shape != (n,):
            raise LayoutError(
                f"key {fmt_key(ids_key)}: expected dtype torch.int64 and shape {list(batch)}, "
                f"got dtype {ids.dtype} and shape {list(leaves[ids_key].shape)}"
            )
        real = ids >= 0
        keep = real if keep is None else keep & real
    padded = mask is not None and ndim >= 2
    n_envs = 1 if ndim == 1 else batch[:-1].numel()
    row_lengths = None
    if keep is not None and not bool(keep.all()):
        if padded:
            row_lengths = keep.reshape(n_envs, batch[-1]).sum(1).numpy().astype(np.int64)
        idx = keep.nonzero().squeeze(1)
        columns = {k: take_rows(v, idx) for k, v in columns.items()}
    elif padded:
        row_lengths = np.full(n_envs, batch[-1], dtype=np.int64)
    if CUT in columns and (columns[CUT].dtype != torch.bool or columns[CUT].dim() != 1):
        raise LayoutError(
            f"key {fmt_key(CUT)}: expected dtype torch.bool and shape {list(batch)}, got dtype "
            f"{columns[CUT].dtype} and shape {list(leaves[CUT].shape)}"
        )
    return FlatBatch(columns, n_envs, padded, row_lengths, flat=ndim == 1)
