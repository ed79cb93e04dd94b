"""Object columns: the replay storage's column kind for non-tensor entries.

A non-tensor entry of a batch (one Python object per step, e.g. MiniGrid's text ``mission``)
is stored in a numpy object array of the storage's capacity, one object per row, gathered
with ``np.take`` like the tensor columns and turned back into a tensordict non-tensor entry on
output. In memory any object is kept (by reference, as a list would).

On disk (``state_dict``, ``dumps``, :class:`~splice.replay.LazyMemmapStorage`) there is no
pickle, so an object column holds **text**: ``str`` values (or ``None``), encoded as UTF-8
with lone surrogates passed through (``surrogatepass``), so every Python ``str`` round-trips
exactly. Anything else is refused by name before anything is written.

* :func:`encode_text` / :func:`decode_text`: a column as ``(utf8 bytes, lengths)``, a length
  of ``-1`` meaning ``None`` (the form of ``state_dict`` and ``dumps``);
* :class:`TextLog`: the crash-safe form of :class:`~splice.replay.LazyMemmapStorage`: an
  append-only log of UTF-8 records plus, per row, the ``(offset, length)`` of its record.

Examples:
    >>> import numpy as np
    >>> values = np.array(["go", None, "go", "\\udc80"], dtype=object)
    >>> utf8, lengths = encode_text(values, ("mission",))
    >>> lengths.tolist(), bytes(utf8)
    ([2, -1, 2, 3], b'gogo\\xed\\xb2\\x80')
    >>> decode_text(utf8, lengths).tolist() == values.tolist()
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from splice.layout import Key, LayoutError, fmt_key

__all__ = ["TextLog", "check_text", "decode_text", "encode_text"]

_ERRORS = "surrogatepass"


def check_text(values: np.ndarray, key: Key, where: str) -> None:
    """Raise unless every value is a ``str`` or ``None`` (what can be stored without pickle).

    Raises:
        LayoutError: naming the key, the first offending value's type and position.
    """
    for i, v in enumerate(values.tolist()):
        if v is not None and type(v) is not str:
            raise LayoutError(
                f"key {fmt_key(key)}: {where} stores non-tensor entries as text (no pickle), "
                f"got a {type(v).__name__} at position {i}; store str values, or keep the "
                "buffer in memory (LazyTensorStorage keeps any Python object)"
            )


def _distinct(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct values (``None`` excluded) and each value's number among them (-1 for
    ``None``)."""
    records: dict[str, int] = {}
    number = np.empty(values.size, dtype=np.int64)
    for i, v in enumerate(values.tolist()):
        if v is None:
            number[i] = -1
            continue
        r = records.get(v)
        if r is None:
            r = records[v] = len(records)
        number[i] = r
    return list(records), number


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", _ERRORS)


def encode_text(values: np.ndarray, key: Key) -> tuple[np.ndarray, np.ndarray]:
    """``(utf8, lengths)``: the values' UTF-8 bytes back to back (uint8) and each value's
    length in bytes (int64, ``-1`` for ``None``).

    Raises:
        LayoutError: a value that is neither ``str`` nor ``None`` (:func:`check_text`).
    """
    check_text(values, key, "a saved replay buffer")
    texts, number = _distinct(values)
    encoded = [_utf8(t) for t in texts]
    sizes = np.fromiter((len(b) for b in encoded), np.int64, len(encoded))
    lengths = np.where(number >= 0, sizes[np.maximum(number, 0)] if sizes.size else 0, -1)
    parts = [encoded[r] for r in number.tolist() if r >= 0]
    utf8 = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    return utf8, lengths.astype(np.int64)


def decode_text(utf8: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The inverse of :func:`encode_text`.

    Raises:
        ValueError: lengths that do not add up to the bytes, or bytes that are not UTF-8.
    """
    sizes = np.maximum(lengths, 0)
    if int(sizes.sum()) != utf8.size or (lengths < -1).any():
        raise ValueError(
            f"text column: lengths add up to {int(sizes.sum())} bytes, found {utf8.size}"
        )
    ends = np.cumsum(sizes)
    return _decode(utf8.tobytes(), ends - sizes, lengths)


def _decode(raw: bytes, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    out = np.empty(lengths.size, dtype=object)
    cache: dict[tuple[int, int], str] = {}
    for i, (offset, length) in enumerate(zip(offsets.tolist(), lengths.tolist(), strict=True)):
        if length < 0:
            continue
        value = cache.get((offset, length))
        if value is None:
            value = cache[(offset, length)] = raw[offset : offset + length].decode("utf-8", _ERRORS)
        out[i] = value
    return out


class TextLog:
    """A text column on disk that survives a killed process (:class:`LazyMemmapStorage`).

    Files, in ``directory``, for generation ``g``: ``<name>.<g>.log``, UTF-8 records appended
    and never overwritten, and ``<name>.<g>.ref`` (int64 ``[capacity, 2]``, memory-mapped): each
    row's record ``(offset, length)``, length -1 for ``None``. The values also stay in memory
    (:attr:`values`), so reads cost what an in-memory object column costs.

    A write appends the distinct new values (a value written recently reuses its record, so
    MiniGrid's one mission costs one record) and then points the rows at them. The storage's
    commit records :meth:`committed` (generation, log size); on reopening, bytes after the
    committed size belong to an interrupted write and are ignored. When the log holds more than
    twice the live bytes (and over 1 MiB) it is compacted into a new generation, which the next
    commit switches to atomically; files of other generations are deleted on the commit after.

    Args:
        directory: where the files live.
        name: file name stem (one per column).
        open_refs: ``open_refs(path, create)``: a memory-mapped int64 ``[capacity, 2]``
            array of that file (the storage's own file mapper).
        gen: the generation the files are at.
        size: the committed log size (bytes).
        create: new files (else open those of generation ``gen``, then call :meth:`reopen`).
    """

    RECENT = 4096  # values remembered with their record, to write a repeated value once
    MIN_COMPACT = 1 << 20

    def __init__(
        self,
        directory: Path,
        name: str,
        open_refs: Callable[[Path, bool], np.ndarray],
        *,
        gen: int = 0,
        size: int = 0,
        create: bool = True,
    ) -> None:
        self.directory, self.name, self._open_refs = directory, name, open_refs
        self.gen, self.size = gen, size
        self.refs: np.ndarray = self._refs_file(gen, create)
        if create:
            self.refs[:, 0] = 0
            self.refs[:, 1] = -1
            self._log_path(gen).write_bytes(b"")
        self.values = np.empty(self.refs.shape[0], dtype=object)
        self._recent: dict[str, tuple[int, int]] = {}
        self._next_check = max(2 * size, self.MIN_COMPACT)

    # ------------------------------------------------------------------ files
    def _log_path(self, gen: int) -> Path:
        return self.directory / f"{self.name}.{gen}.log"

    def _refs_file(self, gen: int, create: bool) -> np.ndarray:
        return self._open_refs(self.directory / f"{self.name}.{gen}.ref", create)

    def committed(self) -> dict[str, int]:
        """What the storage's commit records: the generation and the log's size."""
        return {"gen": self.gen, "size": self.size}

    def remove_stale(self) -> None:
        """Delete the files of other generations (after a commit of this one)."""
        for path in self.directory.glob(f"{self.name}.*"):
            parts = path.name[len(self.name) + 1 :].split(".")
            if len(parts) == 2 and parts[0] != str(self.gen):
                path.unlink(missing_ok=True)

    def reopen(self, live_rows: np.ndarray) -> None:
        """Read the committed log back into :attr:`values` for ``live_rows`` (the rows of a
        reopened storage that hold data; the others read as None and have their references
        cleared)."""
        raw = self._log_path(self.gen).read_bytes()[: self.size]
        self._truncate(self.size)
        refs = self.refs[live_rows]
        if (refs[:, 1] >= 0).any() and int((refs[:, 0] + refs[:, 1]).max()) > self.size:
            raise ValueError(f"{self.name}: a live row points past the committed text log")
        dead = np.ones(self.refs.shape[0], dtype=bool)
        dead[live_rows] = False
        self.refs[dead, 1] = -1
        self.values[:] = None
        self.values[live_rows] = _decode(raw, refs[:, 0], refs[:, 1])

    def _truncate(self, size: int) -> None:
        with open(self._log_path(self.gen), "r+b") as f:
            f.truncate(size)

    # ------------------------------------------------------------------ writes
    def write(
        self, rows: np.ndarray, values: np.ndarray, live_rows: Callable[[], np.ndarray]
    ) -> None:
        """Store ``values`` at ``rows`` (the values must be text: :func:`check_text`).

        ``live_rows()`` gives the rows holding data (read only to compact the log)."""
        if self.size >= self._next_check:
            self._maybe_compact(live_rows)
        texts, number = _distinct(values)
        refs = np.empty((len(texts), 2), dtype=np.int64)
        new: list[bytes] = []
        offset = self.size
        for r, text in enumerate(texts):
            known = self._recent.get(text)
            if known is None:
                data = _utf8(text)
                known = (offset, len(data))
                new.append(data)
                offset += len(data)
                if len(self._recent) >= self.RECENT:
                    self._recent.clear()
                self._recent[text] = known
            refs[r] = known
        if new:
            with open(self._log_path(self.gen), "ab") as f:
                f.seek(self.size)
                f.write(b"".join(new))
        self.size = offset
        row_refs = np.tile(np.array([0, -1], dtype=np.int64), (number.size, 1))
        if texts:
            row_refs[number >= 0] = refs[number[number >= 0]]
        self.refs[rows] = row_refs
        self.values[rows] = values

    def _maybe_compact(self, live_rows: Callable[[], np.ndarray]) -> None:
        rows = live_rows()
        refs = self.refs[rows]
        used = refs[refs[:, 1] >= 0]
        live = int(np.unique(used, axis=0)[:, 1].sum()) if used.size else 0
        if 2 * live >= self.size:
            self._next_check = 2 * self.size
            return
        # A new generation with the live rows' values only; the old files stay valid until
        # the storage commits the switch.
        gen = self.gen + 1
        self._log_path(gen).write_bytes(b"")
        kept = self.values[rows]
        self.refs = self._refs_file(gen, True)
        self.refs[:, 0] = 0
        self.refs[:, 1] = -1
        self.gen, self.size, self._recent = gen, 0, {}
        self.values[:] = None  # the same array: the storage reads it
        self.write(rows, kept, live_rows)
        self._next_check = max(2 * self.size, self.MIN_COMPACT)

    def sync(self) -> None:
        """``fsync`` the log (for :meth:`LazyMemmapStorage.flush`)."""
        fd = os.open(self._log_path(self.gen), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
