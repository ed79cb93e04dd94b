"""Index math shared by every trajectory operation: which row and position each step lands in.

Pure tensor code: one stable sort and a few scans, no Python loop over trajectories or steps,
and a single host synchronisation (for the output size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TrajectoryIndex:
    """Where each of ``N`` flat steps goes in a ``[n_rows, max_len]`` trajectory layout.

    Attributes:
        row: ``[N]`` int64, the trajectory (row) of each step.
        pos: ``[N]`` int64, the step's position within its trajectory (time order).
        lengths: ``[n_rows]`` int64, the length of each trajectory.
        max_len: the longest trajectory (0 when ``N == 0``).
    """

    row: Tensor
    pos: Tensor
    lengths: Tensor
    max_len: int

    @property
    def n_rows(self) -> int:
        return self.lengths.numel()

    @property
    def n_steps(self) -> int:
        return self.row.numel()

    def padded_dest(self) -> Tensor:
        """``[N]`` flat destination of each step in a ``[n_rows * max_len]`` buffer."""
        return self.row * self.max_len + self.pos

    def offsets(self) -> Tensor:
        """``[n_rows + 1]`` start of each trajectory in the flat "cat" layout."""
        out = torch.zeros(self.n_rows + 1, dtype=torch.int64, device=self.lengths.device)
        torch.cumsum(self.lengths, 0, out=out[1:])
        return out

    def cat_order(self) -> Tensor:
        """``[N]`` source step of each position of the "cat" layout (rows, then time)."""
        dest = self.offsets()[self.row] + self.pos
        order = torch.empty_like(dest)
        order[dest] = torch.arange(self.n_steps, device=dest.device)
        return order

    def cat_is_identity(self) -> bool:
        """True when the steps are already laid out row after row (no reordering needed)."""
        if self.n_steps == 0:
            return True
        return bool((self.offsets()[self.row] + self.pos == torch.arange(self.n_steps)).all())


def _group_positions(keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stable grouping of equal keys.

    Returns ``(perm, pos_sorted, group_start)`` where ``perm`` sorts the keys stably,
    ``pos_sorted[i]`` is the rank of sorted element ``i`` within its group (time order is
    kept because the sort is stable) and ``group_start[i]`` is the sorted index where that
    group begins.
    """
    n = keys.numel()
    sorted_keys, perm = torch.sort(keys, stable=True)
    new_group = torch.ones(n, dtype=torch.bool, device=keys.device)
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=new_group[1:])
    arange = torch.arange(n, device=keys.device)
    group_start = torch.where(new_group, arange, 0).cummax(0).values
    return perm, arange - group_start, group_start


def index_by_id(ids: Tensor) -> TrajectoryIndex:
    """Group steps by trajectory id; rows in order of each id's first appearance.

    Ids that repeat non-adjacently (``[0, 0, 1, 1, 0]``) are grouped into one row, in the
    order the steps appear.

    Examples:
        >>> ix = index_by_id(torch.tensor([7, 7, 3, 7, 3]))
        >>> ix.row.tolist(), ix.pos.tolist(), ix.lengths.tolist(), ix.max_len
        ([0, 0, 1, 0, 1], [0, 1, 0, 2, 1], [3, 2], 3)
    """
    n = ids.numel()
    if n == 0:
        empty = ids.new_zeros(0, dtype=torch.int64)
        return TrajectoryIndex(empty, empty, empty, 0)
    perm, pos_sorted, group_start = _group_positions(ids)
    # The first step of each group (stable sort: its earliest step) decides the row order.
    first_of_group = perm[group_start]
    is_first = torch.zeros(n, dtype=torch.bool, device=ids.device)
    is_first[first_of_group] = True
    rank = torch.cumsum(is_first, 0) - 1
    row = torch.empty_like(perm)
    row[perm] = rank[first_of_group]
    pos = torch.empty_like(perm)
    pos[perm] = pos_sorted
    n_rows, max_len = torch.stack([rank[-1] + 1, pos_sorted.max() + 1]).tolist()  # the one sync
    lengths = torch.bincount(row, minlength=n_rows)
    return TrajectoryIndex(row, pos, lengths, max_len)


def index_by_row(row: Tensor, n_rows: int) -> TrajectoryIndex:
    """Index for steps whose row is already known (``0 <= row < n_rows``), time order kept.

    Examples:
        >>> ix = index_by_row(torch.tensor([1, 0, 1, 1]), 2)
        >>> ix.pos.tolist(), ix.lengths.tolist(), ix.max_len
        ([0, 0, 1, 2], [1, 3], 3)
    """
    if row.numel() == 0:
        empty = row.new_zeros(0, dtype=torch.int64)
        return TrajectoryIndex(empty, empty, row.new_zeros(n_rows, dtype=torch.int64), 0)
    perm, pos_sorted, _ = _group_positions(row)
    pos = torch.empty_like(perm)
    pos[perm] = pos_sorted
    lengths = torch.bincount(row, minlength=n_rows)
    return TrajectoryIndex(row, pos, lengths, int(lengths.max()))


def ids_from_done(done: Tensor, batch_shape: torch.Size) -> Tensor:
    """Trajectory ids from done flags along the last (time) batch dim.

    A new trajectory starts at ``t = 0`` of every env row and after every done step; ids count
    up env-major (row by row), exactly as TorchRL numbers them.

    Examples:
        >>> done = torch.tensor([[False, True, False], [True, False, False]])
        >>> ids_from_done(done, torch.Size([2, 3])).tolist()
        [[0, 0, 1], [2, 3, 3]]
    """
    flags = done.reshape(*batch_shape, -1).any(-1)
    starts = torch.zeros_like(flags)
    starts[..., 0] = True
    starts[..., 1:] = flags[..., :-1]
    return (torch.cumsum(starts.reshape(-1), 0) - 1).reshape(batch_shape)
