"""Raw tensor files and atomic JSON: persistence without pickle.

A tensor is stored as its raw bytes (``<name>.bin``) next to a JSON description (dtype,
shape); numpy arrays of the index and samplers are stored as ``.npy`` (loaded with
``allow_pickle=False``). JSON documents are written to a temporary file and renamed over the
old one, so a reader sees either the previous or the new document, never a torn one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "file_tensor",
    "load_arrays",
    "read_json",
    "save_arrays",
    "tensor_from_file",
    "tensor_to_file",
    "write_json_atomic",
]


def write_json_atomic(path: Path, doc: object, *, fsync: bool = False) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (write a temp file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, object]:
    with open(path, encoding="utf-8") as f:
        out = json.load(f)
    if not isinstance(out, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return out


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


def file_tensor(
    path: Path, dtype: torch.dtype, shape: tuple[int, ...], *, create: bool
) -> tuple[Tensor, np.memmap | None]:
    """A tensor backed by a shared memory map of ``path`` (created, or opened read-write),
    and the map itself (None for an empty tensor).

    Writes into the tensor land in the file through the page cache: they survive the death of
    the process (not a power cut, for which see ``LazyMemmapStorage.flush``).
    """
    nbytes = _nbytes(dtype, shape)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype), None
    if not create and path.stat().st_size != nbytes:
        raise ValueError(f"{path}: expected {nbytes} bytes, found {path.stat().st_size}")
    raw = np.memmap(path, dtype=np.uint8, mode="w+" if create else "r+", shape=(nbytes,))
    return torch.from_numpy(raw).view(dtype).view(shape), raw


def tensor_to_file(tensor: Tensor, path: Path) -> None:
    """Write the raw bytes of ``tensor`` (any dtype) to ``path``."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    flat.view(torch.uint8).numpy().tofile(path)


def tensor_from_file(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size != _nbytes(dtype, shape):
        raise ValueError(f"{path}: expected {_nbytes(dtype, shape)} bytes, found {raw.size}")
    if raw.size == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(raw).view(dtype).view(shape)


def save_arrays(directory: Path, arrays: Mapping[str, object]) -> dict[str, object]:
    """Save the numpy arrays of ``arrays`` as ``.npy`` files; return the JSON-able rest."""
    directory.mkdir(parents=True, exist_ok=True)
    scalars: dict[str, object] = {}
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            np.save(directory / f"{name}.npy", value, allow_pickle=False)
        elif isinstance(value, (np.integer, np.floating)):
            scalars[name] = value.item()
        else:
            scalars[name] = value
    return scalars


def load_arrays(directory: Path, scalars: dict[str, object]) -> dict[str, object]:
    """The inverse of :func:`save_arrays`."""
    out: dict[str, object] = dict(scalars)
    if directory.is_dir():
        for file in directory.glob("*.npy"):
            out[file.stem] = np.load(file, allow_pickle=False)
    return out
