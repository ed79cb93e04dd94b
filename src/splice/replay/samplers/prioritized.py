"""``PrioritizedSliceSampler``: slices drawn in proportion to an R2D2 sequence priority."""

from __future__ import annotations

import math

import numpy as np

from splice.replay._structures import I64, SegmentTree, State, as_i64
from splice.replay.index import WriteReport
from splice.replay.samplers._base import Draw
from splice.replay.samplers.slice import SliceSampler

__all__ = ["PrioritizedSliceSampler"]


class PrioritizedSliceSampler(SliceSampler):
    """Prioritised slices (PER) with R2D2's sequence priority, drawn from a sum-tree.

    Every stored step has a priority ``p`` (new steps get the largest priority seen so far).
    A slice's priority is R2D2's mixture of its training steps' priorities::

        priority(slice) = eta * max(p) + (1 - eta) * mean(p)

    and a slice is drawn with probability ``priority ** alpha / sum over eligible slices``
    through a fan-out-16 sum-tree over slice ends (O(log capacity) per draw and per update).
    :meth:`update_priority` takes per-step priorities (e.g. absolute TD errors) at storage
    rows — ``sample["index"]`` — and re-scores every slice containing an updated step; a
    priority per slice broadcasts over its steps. A newly written slice gets the largest
    priority seen so far, so that it is drawn soon (PER's rule). Importance weights
    ``(N * P(i)) ** -beta``, normalised by their maximum, come per slice in
    ``info["priority_weight"]`` and per step in ``sample["priority_weight"]``.

    Slices are drawn per position (``weighting="transition"``); the slice length must stay
    fixed (the one of the buffer's ``batch_size``).

    Args:
        max_capacity: accepted for TorchRL compatibility; must equal the storage size if
            given.
        alpha: prioritisation exponent (0: uniform).
        beta: importance-sampling exponent (1: full correction).
        eps: added to every priority so that none is zero.
        eta: weight of the max in the sequence priority (R2D2 uses 0.9).
        **kwargs: as for :class:`SliceSampler` (except ``weighting``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, PrioritizedSliceSampler, ReplayBuffer
        >>> sampler = PrioritizedSliceSampler(alpha=1.0, beta=1.0, slice_len=2, seed=0)
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
        >>> ids = torch.tensor([0, 0, 0, 1, 1, 1])
        >>> _ = rb.extend(TensorDict({("collector", "traj_ids"): ids}, batch_size=[6]))
        >>> rb.update_priority(torch.arange(6), torch.tensor([1.0, 1, 1, 1, 1, 9]))
        >>> sample, info = rb.sample(return_info=True)
        >>> sample["index"].tolist()  # slice 4-5 (priority 0.9 * 9 + 0.1 * 5 = 8.6) wins
        [4, 5, 4, 5]
        >>> info["priority_weight"]  # (8.6 / smallest slice priority 1.0) ** -beta
        tensor([0.1163, 0.1163])
    """

    def __init__(
        self,
        max_capacity: int | None = None,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        *,
        eta: float = 0.9,
        **kwargs: object,
    ) -> None:
        if "weighting" in kwargs:
            raise TypeError("PrioritizedSliceSampler draws per position: weighting is fixed")
        super().__init__(weighting="transition", **kwargs)  # type: ignore[arg-type]
        for name, value in (("alpha", alpha), ("beta", beta), ("eta", eta), ("eps", eps)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if eta > 1:
            raise ValueError(f"eta must be in [0, 1], got {eta!r}")
        self.max_capacity = max_capacity
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.eps = float(eps)
        self.eta = float(eta)
        self._sum = SegmentTree(1, "sum")
        self._min = SegmentTree(1, "min")
        self._step_priority = np.zeros(0)
        self.max_priority = 1.0

    @property
    def _track_ends(self) -> bool:
        return False  # the trees replace the set of eligible ends

    def _attach(self, index: object, batch_size: int | None) -> None:
        capacity = index.capacity  # type: ignore[attr-defined]
        if self.max_capacity is not None and self.max_capacity != capacity:
            raise ValueError(
                f"max_capacity={self.max_capacity} but the storage holds {capacity} steps"
            )
        self._step_priority = np.full(capacity, self.max_priority)
        super()._attach(index, batch_size)  # type: ignore[arg-type]

    def _build(self, length: int | None) -> None:
        if self._built_len is not None and length != self._built_len:
            raise ValueError(
                f"PrioritizedSliceSampler slices have a fixed length ({self._built_len}); "
                f"got a batch that implies {length}"
            )
        super()._build(length)
        index = self.index
        self._sum = SegmentTree(index.capacity, "sum")
        self._min = SegmentTree(index.capacity, "min")
        if length is None:
            return
        rows = index.live_rows()
        self._add_items(rows[self._eligible(rows, length)])

    def _eligible(self, rows: np.ndarray, length: int) -> np.ndarray:
        if not self.strict_length:
            return np.ones(rows.size, dtype=bool)
        return self.index.steps_before(rows) >= length - 1

    def _add_items(self, rows: np.ndarray) -> None:
        self._step_priority[rows] = self.max_priority
        value = np.full(rows.size, self.max_priority**self.alpha)
        self._sum.set(rows, value)
        self._min.set(rows, value)

    def _drop_items(self, rows: np.ndarray) -> None:
        self._sum.set(rows, np.zeros(rows.size))
        self._min.set(rows, np.full(rows.size, np.inf))

    def _on_write(self, report: WriteReport) -> None:
        length = self._built_len
        if length is None:
            return
        drop = report.evicted_rows
        if self.strict_length:
            drop = np.concatenate([drop, self._stale_ends(report, length)])
        self._drop_items(drop)
        new = report.new_rows
        self._add_items(new[self._eligible(new, length)])

    def _pick(
        self, count: int, length: int
    ) -> tuple[np.ndarray, np.ndarray | int, np.ndarray, np.ndarray]:
        index = self.index
        if len(index) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        total = self._sum.total()
        if total <= 0:
            raise self._no_slice_error(length)
        ends = self._sum.find(self._uniform(count) * total)
        for _ in range(8):  # rounding may land on an empty leaf: redraw those
            empty = self._sum.get(ends) <= 0
            if not empty.any():
                break
            ends[empty] = self._sum.find(self._uniform(int(empty.sum())) * total)
        before = index.steps_before(ends)
        return ends, 0, before, np.minimum(before + 1, length)

    def _draw(self, batch_size: int) -> Draw:
        draw = super()._draw(batch_size)
        assert draw.length is not None
        ends = draw.rows[np.arange(draw.rows.shape[0]), draw.length - 1]
        weight = (self._sum.get(ends) / self._min.total()) ** (-self.beta)
        return Draw(draw.rows, draw.length, draw.burn, weight)

    def update_priority(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Set per-step priorities at storage rows ``index`` and re-score affected slices.

        ``priority`` has the shape of ``index`` or broadcasts to it (one value per slice for a
        ``[num_slices, width]`` index). Padding (-1) and rows holding no data are ignored; as
        in TorchRL, a row overwritten since it was sampled passes the priority to its new step.
        """
        idx = np.asarray(index, dtype=I64)
        prio = np.broadcast_to(np.asarray(priority, dtype=np.float64), idx.shape)
        if idx.ndim == 2 and prio.ndim == 1 and prio.size == idx.shape[0]:
            prio = np.broadcast_to(prio[:, None], idx.shape)
        rows, prio = as_i64(idx), prio.reshape(-1)
        if not np.isfinite(prio).all() or (prio < 0).any():
            raise ValueError("priorities must be finite and >= 0")
        if rows.size and (rows.max() >= self.index.capacity):
            raise IndexError(f"index out of range for a storage of {self.index.capacity} rows")
        keep = rows >= 0
        rows, prio = rows[keep], prio[keep]
        keep = self.index.row_slot[rows] >= 0
        rows, prio = rows[keep], prio[keep]
        if rows.size == 0 or self._built_len is None:
            return
        rows_rev = rows[::-1]
        rows, first = np.unique(rows_rev, return_index=True)  # the last value given wins
        prio = prio[::-1][first] + self.eps
        self._step_priority[rows] = prio
        self.max_priority = max(self.max_priority, float(prio.max()))
        self._rescore(rows, self._built_len)

    def _rescore(self, rows: np.ndarray, length: int) -> None:
        """Recompute the priority of every slice whose training steps include ``rows``."""
        index = self.index
        after = np.minimum(index.steps_after(rows), length - 1)
        count = after + 1
        total = int(count.sum())
        anchor = np.repeat(rows, count)
        offset = np.arange(total, dtype=I64) - np.repeat(np.cumsum(count) - count, count)
        ends = np.unique(index.rows_forward(anchor, offset))
        ends = ends[self._eligible(ends, length)]
        if ends.size == 0:
            return
        train = np.minimum(index.steps_before(ends) + 1, length)
        window = index.window_rows(ends, 0, train, length)
        valid = window >= 0
        p = np.where(valid, self._step_priority[np.where(valid, window, 0)], 0.0)
        seq = self.eta * p.max(axis=1) + (1 - self.eta) * p.sum(axis=1) / train
        value = seq**self.alpha
        self._sum.set(ends, value)
        self._min.set(ends, value)

    def config(self) -> dict[str, object]:
        out = super().config()
        out.update(alpha=self.alpha, beta=self.beta, eps=self.eps, eta=self.eta)
        return out

    def state_dict(self) -> State:
        out = super().state_dict()
        out.update(self._sum.state_dict("sum_"))
        out["step_priority"] = self._step_priority
        out["max_priority"] = self.max_priority
        return out

    def load_state_dict(self, state: State) -> None:
        super().load_state_dict(state)
        self._sum.load_state_dict(state, "sum_")
        leaves = np.asarray(state["sum_leaves"], dtype=np.float64)
        self._min.load_state_dict({"min_leaves": np.where(leaves > 0, leaves, np.inf)}, "min_")
        self._step_priority = np.asarray(state["step_priority"], dtype=np.float64).copy()
        self.max_priority = float(state["max_priority"])  # type: ignore[arg-type]
