"""A set of int64 trajectory ids, compact for ids handed out by counters.

The assembler remembers every id it has seen complete, to refuse steps that arrive for one of
them later. Collectors hand ids out from counters and episodes end in roughly the order they
started, so the completed ids form a few long runs: stored as ranges, the set stays a few
entries long however many episodes a run completes (at worst, for arbitrary ids, one range per
id). The few ids a batch completes first go to a small buffer (a Python set: adding to it and
testing a batch's ids against it cost a microsecond, where each numpy call costs about as much),
merged into the ranges with whole-array numpy operations when it fills.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IdSet"]

_LOWEST = np.iinfo(np.int64).min


class IdSet:
    """A set of int64 ids: sorted, disjoint, non-adjacent ranges ``[lo, hi)`` plus a bounded
    buffer of recently added ids.

    Args:
        buffer: how many ids are buffered before they are merged into the ranges.

    Examples:
        >>> ids = IdSet(buffer=4)
        >>> ids.add(np.array([3, 4, 5, 9, 6]))  # more than the buffer holds: merged
        >>> ids.ranges
        [(3, 7), (9, 10)]
        >>> ids.add(np.array([7]))  # buffered
        >>> ids.intersects(np.array([2, 8])), ids.intersects(np.array([2, 7]))
        (False, True)
        >>> ids.contains(np.array([2, 3, 6, 7, 9])).tolist()
        [False, True, True, True, True]
        >>> len(ids)
        6
    """

    def __init__(self, buffer: int = 1024) -> None:
        # A first, empty range at the lowest id: every id has a range at or before it.
        self._lo = np.array([_LOWEST], np.int64)
        self._hi = np.array([_LOWEST], np.int64)  # exclusive
        self._recent: set[int] = set()
        self._buffer = buffer

    def __len__(self) -> int:
        """The number of ids in the set."""
        self._merge()
        return int((self._hi - self._lo).sum())

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The ranges ``(lo, hi)`` (``hi`` exclusive), in order, after merging the buffer."""
        self._merge()
        return list(zip(self._lo[1:].tolist(), self._hi[1:].tolist(), strict=True))

    def _in_ranges(self, values: np.ndarray) -> np.ndarray:
        return values < self._hi[np.searchsorted(self._lo, values, side="right") - 1]

    def intersects(self, values: np.ndarray) -> bool:
        """Whether any of ``values`` (int64) is in the set."""
        if not self._recent.isdisjoint(values.tolist()):
            return True
        return self._lo.size > 1 and bool(self._in_ranges(values).any())

    def contains(self, values: np.ndarray) -> np.ndarray:
        """A bool array: which of ``values`` (int64) are in the set."""
        recent = np.fromiter(self._recent, np.int64, len(self._recent))
        return self._in_ranges(values) | np.isin(values, recent)

    def add(self, values: np.ndarray) -> None:
        """Add ``values`` (int64, any order, repeats allowed)."""
        self._recent.update(values.tolist())
        if len(self._recent) > self._buffer:
            self._merge()

    def _merge(self) -> None:
        """Move the buffered ids into the ranges."""
        if not self._recent:
            return
        new = np.sort(np.fromiter(self._recent, np.int64, len(self._recent)))
        self._recent = set()
        run_start = np.flatnonzero(np.diff(new, prepend=new[0] - 2) != 1)
        run_last = np.append(run_start[1:], new.size) - 1
        lo = np.concatenate([self._lo, new[run_start]])
        hi = np.concatenate([self._hi, new[run_last] + 1])
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
        reach = np.maximum.accumulate(hi)  # the furthest end of the ranges so far
        starts = np.flatnonzero(np.concatenate([[True], lo[1:] > reach[:-1]]))
        self._lo, self._hi = lo[starts], np.maximum.reduceat(hi, starts)
