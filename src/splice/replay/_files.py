"""Raw tensor files, preallocated memory maps and atomic JSON: persistence without pickle.

A tensor is stored as its raw bytes (``<name>.bin``) next to a JSON description (dtype,
shape); numpy arrays of the index and samplers are stored as ``.npy`` (loaded with
``allow_pickle=False``). JSON documents are written to a temporary file and renamed over the
old one, so a reader sees either the previous or the new document, never a torn one; the two
steps can be separated (:func:`stage_json`, then ``os.replace``) so that a full disk fails
before anything else has changed.

Memory-mapped files are *preallocated* (:func:`reserve`): a write into a sparse file on a full
filesystem kills the process with ``SIGBUS``, a failed preallocation is an ``OSError`` that
names the file. Every error about a file names its path.
"""

from __future__ import annotations

import errno
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
    "nbytes_of",
    "read_json",
    "reserve",
    "save_arrays",
    "stage_json",
    "tensor_from_file",
    "tensor_to_file",
    "write_json_atomic",
]

#: errno values of a filesystem that cannot preallocate (the space is then written instead).
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def _os_error(err: OSError, path: Path, what: str) -> OSError:
    """``err`` again, with ``path`` named and what was being done."""
    return OSError(err.errno, f"{what}: {err.strerror or err}", str(path))


def stage_json(path: Path, doc: object, *, fsync: bool = False) -> Path:
    """Write ``doc`` as JSON to ``<path>.tmp`` and return that path (``os.replace`` it over
    ``path`` to commit). A failed write (a full disk) removes the temporary file and raises
    ``OSError`` naming it."""
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(doc).encode("utf-8")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _os_error(err, tmp, "cannot write") from err
    return tmp


def write_json_atomic(path: Path, doc: object, *, fsync: bool = False) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (write a temp file, then rename)."""
    os.replace(stage_json(path, doc, fsync=fsync), path)


def read_json(path: Path) -> dict[str, object]:
    """The JSON object in ``path``.

    Raises:
        ValueError: not valid JSON, or not an object (the message names ``path``).
        OSError: the file cannot be read.
    """
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a valid JSON document ({err})") from err
    if not isinstance(out, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(out).__name__}")
    return out


def nbytes_of(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``dtype`` and ``shape`` (exact, in Python ints)."""
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


def reserve(path: Path, nbytes: int, *, fresh: bool) -> None:
    """Make sure the first ``nbytes`` of ``path`` have disk blocks, so that writes through a
    memory map never need new space (a full disk would kill the process with ``SIGBUS``).

    ``posix_fallocate`` where the filesystem supports it; otherwise a ``fresh`` file is
    written with zeros (checked writes), and an existing one is left as it is.

    Raises:
        OSError: no space (``ENOSPC``, a quota, a file size limit); the message names
            ``path``.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            if not hasattr(os, "posix_fallocate"):
                raise OSError(errno.ENOSYS, "posix_fallocate is not available")
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as err:
            if err.errno not in _NO_FALLOCATE:
                raise _os_error(err, path, f"cannot reserve {nbytes} bytes") from err
            if fresh:
                _write_zeros(fd, path, nbytes)
    finally:
        os.close(fd)


def _write_zeros(fd: int, path: Path, nbytes: int) -> None:
    block = bytes(1 << 20)
    done = 0
    try:
        while done < nbytes:
            done += os.write(fd, block[: min(len(block), nbytes - done)])
    except OSError as err:
        raise _os_error(err, path, f"cannot reserve {nbytes} bytes") from err


def file_tensor(
    path: Path, dtype: torch.dtype, shape: tuple[int, ...], *, create: bool
) -> tuple[Tensor, np.memmap | None]:
    """A tensor backed by a shared memory map of ``path`` (created, or opened read-write),
    and the map itself (None for an empty tensor).

    The file's blocks are reserved first (:func:`reserve`): on a full disk this raises
    ``OSError`` naming the file, instead of a ``SIGBUS`` at a later write. Writes into the
    tensor land in the file through the page cache: they survive the death of the process
    (not a power cut, for which see ``LazyMemmapStorage.flush``).

    Raises:
        ValueError: an existing file (``create=False``) of the wrong size.
        OSError: the file cannot be created or its space reserved.
    """
    nbytes = nbytes_of(dtype, shape)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype), None
    if create:
        try:
            with open(path, "wb"):
                pass  # truncate: the map starts from zeros
        except OSError as err:
            raise _os_error(err, path, "cannot create") from err
    elif path.stat().st_size != nbytes:
        raise ValueError(f"{path}: expected {nbytes} bytes, found {path.stat().st_size}")
    reserve(path, nbytes, fresh=create)
    raw = np.memmap(path, dtype=np.uint8, mode="r+", shape=(nbytes,))
    return torch.from_numpy(raw).view(dtype).view(shape), raw


def tensor_to_file(tensor: Tensor, path: Path) -> None:
    """Write the raw bytes of ``tensor`` (any dtype) to ``path``."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    try:
        with open(path, "wb") as f:
            f.write(flat.view(torch.uint8).numpy().data)
    except OSError as err:
        raise _os_error(err, path, "cannot write") from err


def tensor_from_file(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    """The tensor stored by :func:`tensor_to_file` (its size is checked before reading).

    Raises:
        ValueError: the file does not hold exactly ``dtype`` x ``shape`` bytes.
    """
    expected = nbytes_of(dtype, shape)
    size = path.stat().st_size
    if size != expected:
        raise ValueError(f"{path}: expected {expected} bytes, found {size}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size != expected:  # the file changed under us
        raise ValueError(f"{path}: expected {expected} bytes, found {raw.size}")
    return torch.from_numpy(raw).view(dtype).view(shape)


def save_arrays(directory: Path, arrays: Mapping[str, object]) -> dict[str, object]:
    """Save the numpy arrays of ``arrays`` as ``.npy`` files; return the JSON-able rest,
    plus ``"arrays"``: the sorted names of the files written (what :func:`load_arrays`
    reads)."""
    directory.mkdir(parents=True, exist_ok=True)
    scalars: dict[str, object] = {}
    names: list[str] = []
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            path = directory / f"{name}.npy"
            try:
                np.save(path, value, allow_pickle=False)
            except OSError as err:
                raise _os_error(err, path, "cannot write") from err
            names.append(name)
        elif isinstance(value, (np.integer, np.floating)):
            scalars[name] = value.item()
        else:
            scalars[name] = value
    return {"scalars": scalars, "arrays": sorted(names)}


def load_arrays(directory: Path, doc: object, where: str) -> dict[str, object]:
    """The inverse of :func:`save_arrays`: exactly the listed ``.npy`` files (no pickle).

    Raises:
        ValueError: a malformed description (named by ``where``), a missing or unreadable
            file, or an object (pickled) array; the message names the file.
    """
    if not isinstance(doc, dict) or set(doc) != {"scalars", "arrays"}:
        raise ValueError(f"{where}: expected an object with 'scalars' and 'arrays'")
    scalars, names = doc["scalars"], doc["arrays"]
    if not isinstance(scalars, dict) or not isinstance(names, list):
        raise ValueError(f"{where}: 'scalars' must be an object and 'arrays' a list")
    out: dict[str, object] = dict(scalars)
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"{where}: bad array name {name!r}")
        path = directory / f"{name}.npy"
        try:
            out[name] = np.load(path, allow_pickle=False)
        except FileNotFoundError as err:
            raise ValueError(f"{path}: missing (listed in {where})") from err
        except (ValueError, OSError, EOFError) as err:
            raise ValueError(f"{path}: not a readable .npy array ({err})") from err
    return out
