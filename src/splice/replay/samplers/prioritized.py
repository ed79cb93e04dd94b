"""Prioritised experience replay: ``PrioritizedSampler`` (single steps) and
``PrioritizedSliceSampler`` (slices, with R2D2's sequence priority)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from splice._args import positive_int
from splice.replay._structures import I64, as_i64
from splice.replay._sumtree import SumTree, SumTreeState, last_of_each
from splice.replay._validate import check_weights, float_array, int_array, weight_limit
from splice.replay.index import ReplayIndex, WriteReport
from splice.replay.samplers._base import Draw, Sampler, SamplerState, expect_state
from splice.replay.samplers.slice import SliceSampler, SliceSamplerState

__all__ = [
    "PrioritizedSampler",
    "PrioritizedSamplerState",
    "PrioritizedSliceSampler",
    "PrioritizedSliceState",
]

_REDUCTIONS = ("max", "min", "sum", "mean", "median")
#: ``alpha * log(p + eps)`` below this: ``(p + eps) ** alpha`` cannot overflow (the log of
#: the largest float is 709.8), so an update needs no ``np.errstate`` (a few us per call).
_NO_OVERFLOW = 700.0


def _check_per(alpha: float, beta: float, eps: float) -> tuple[float, float, float]:
    for name, value in (("alpha", alpha), ("beta", beta), ("eps", eps)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(alpha), float(beta), float(eps)


def _check_capacity(max_capacity: int | None, index: ReplayIndex) -> None:
    if max_capacity is not None and max_capacity != index.capacity:
        raise ValueError(
            f"max_capacity={max_capacity} but the storage holds {index.capacity} steps"
        )


def _live_updates(
    index: ReplayIndex, rows: np.ndarray, priority: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(rows, priorities)``: padding (-1) and rows holding no data dropped, one
    value per row (the last one given wins).

    Raises:
        ValueError: a priority that is negative or not finite.
        IndexError: a row beyond the storage, or below -1.
    """
    rows, priority = as_i64(rows), np.asarray(priority, dtype=np.float64).reshape(-1)
    # (NaN fails both comparisons: two reductions instead of four calls.)
    if priority.size and not (priority.min() >= 0 and priority.max() < np.inf):
        raise ValueError("priorities must be finite and >= 0")
    if rows.size and (rows.max() >= index.capacity or rows.min() < -1):
        raise IndexError(
            f"index out of range for a storage of {index.capacity} rows (-1 is padding)"
        )
    keep = rows >= 0
    if not keep.all():  # (the masks copy: skipped in the common case, nothing to drop)
        rows, priority = rows[keep], priority[keep]
    keep = index.row_slot[rows] >= 0
    if not keep.all():
        rows, priority = rows[keep], priority[keep]
    return last_of_each(rows, priority)


@dataclass
class PrioritizedSamplerState(SamplerState):
    """:class:`PrioritizedSampler`: the base state, the tree and the largest priority."""

    tree: SumTreeState
    max_priority: float


class PrioritizedSampler(Sampler):
    """Proportional prioritised replay of single steps (PER, Schaul et al. 2016), TorchRL's.

    A step with priority ``p`` is drawn with probability ``(p + eps) ** alpha / sum``; new
    steps get the largest priority given so far (1 at first), so each is likely to be drawn
    soon. The sample carries the importance weights ``(N * P(i)) ** -beta`` normalised by
    their maximum, ``(w_i / w_min) ** -beta``, in ``"priority_weight"``. Set priorities
    (e.g. absolute TD errors) with ``rb.update_priority(sample["index"], priority)``.

    Draws and updates go through a sum tree (``SumTree``: blocks of 32 rows under a top of
    block sums) over the storage rows, in whole-array numpy calls: O(batch) per draw plus,
    after a change, the largest weight and one running sum over the top (31,250 numbers
    for a million rows). When the rows' weights are within a few times of each other (the
    buffer's priorities are not heavy-tailed), a draw picks rows by rejection (a row drawn
    uniformly, kept with probability its weight over the largest): no descent of the tree,
    and the kept rows' weights, read to decide, give the importance weights. When only the
    block sums are that close, it picks blocks the same way, then descends; otherwise it
    inverts the running sum. All three are exact: a row is drawn with probability
    ``(p + eps) ** alpha / sum`` either way, from the sampler's generator (they use its
    numbers differently).

    A priority whose weight ``(p + eps) ** alpha`` exceeds ``float_max / (2 * capacity)`` (so
    that the weights of the whole buffer could not sum to a finite number) is refused with a
    ``ValueError``, as a negative or non-finite one is; the update is then not applied at all
    and the sampler goes on as before.

    Args:
        max_capacity: the storage size (checked when the buffer is built).
        alpha: prioritisation exponent (0: uniform).
        beta: importance-sampling exponent (1: full correction).
        eps: added to every priority so that none is zero.
        reduction: how priorities with more dims than the index (e.g. one per step of a
            ``[B, T]`` index row) reduce to one per row: ``"max"``, ``"min"``, ``"sum"``,
            ``"mean"`` or ``"median"``.
        replacement: must be True (there is no without-replacement variant, as in TorchRL).
        generator: the random generator to draw from.
        seed: seed of a fresh generator (exclusive with ``generator``).

    Examples:
        >>> import torch
        >>> from splice.replay import LazyTensorStorage, PrioritizedSampler, ReplayBuffer
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(10),
        ...     sampler=PrioritizedSampler(10, alpha=1.0, beta=1.0, seed=0),
        ...     batch_size=4,
        ... )
        >>> index = rb.extend(torch.arange(4.0))
        >>> rb.update_priority(index, torch.tensor([1.0, 0.0, 0.0, 3.0]))
        >>> sample, info = rb.sample(return_info=True)
        >>> set(sample.tolist()) <= {0.0, 3.0}  # rows 1 and 2: (0 + eps) ** alpha, rarely
        True
        >>> sorted(info)
        ['index', 'priority_weight']
    """

    state_type = PrioritizedSamplerState

    def __init__(
        self,
        max_capacity: int | None,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        reduction: str = "max",
        *,
        replacement: bool = True,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        if not replacement:
            raise TypeError("PrioritizedSampler has no without-replacement variant")
        super().__init__(generator=generator, seed=seed)
        self.alpha, self.beta, self.eps = _check_per(alpha, beta, eps)
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        if max_capacity is not None:
            max_capacity = positive_int("max_capacity", max_capacity)
        self.max_capacity = max_capacity
        self.reduction = reduction
        self.max_priority = 1.0
        self._tree = SumTree(1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha}, beta={self.beta}, eps={self.eps})"

    def _value(self, priority: np.ndarray | float) -> np.ndarray:
        return np.power(np.asarray(priority, dtype=np.float64) + self.eps, self.alpha)

    def rebuild(self) -> None:
        index = self.index
        _check_capacity(self.max_capacity, index)
        self._tree = SumTree(index.capacity)
        rows = index.live_rows()
        self._tree.set(rows, np.broadcast_to(self._value(self.max_priority), rows.shape))

    def on_write(self, report: WriteReport) -> None:
        self._tree.set(report.evicted_rows, np.zeros(report.evicted_rows.size))
        new = report.new_rows
        self._tree.set(new, np.broadcast_to(self._value(self.max_priority), new.shape))

    def draw(self, batch_size: int) -> Draw:
        if len(self.index) == 0:
            raise self.empty_error()
        if self._tree.total() <= 0:
            raise RuntimeError("every stored step has priority 0: nothing can be drawn")
        rows, weight = self._tree.draw(batch_size, self.random)
        weight /= self._tree.min()
        return Draw(rows=rows, weight=np.power(weight, -self.beta, out=weight))

    def update_priority(self, rows: np.ndarray, priority: np.ndarray) -> None:
        """Set the priorities of storage ``rows`` (``-1`` and rows holding no data are
        ignored; with repeated rows the last value wins).

        ``priority`` has the shape of ``rows``, broadcasts to it, or has extra trailing dims
        that ``reduction`` reduces.
        """
        rows = np.asarray(rows)
        priority = np.asarray(priority, dtype=np.float64)
        if priority.ndim > rows.ndim and priority.shape[: rows.ndim] == rows.shape:
            flat = priority.reshape(*rows.shape, -1)
            priority = getattr(np, self.reduction)(flat, axis=-1)
        if priority.shape != rows.shape:
            priority = np.broadcast_to(priority, rows.shape)
        rows, priority = _live_updates(self.index, rows, priority)
        if rows.size == 0:
            return
        top = float(priority.max())  # (finite and >= 0: checked above)
        if top + self.eps <= 1.0 or self.alpha * math.log(top + self.eps) < _NO_OVERFLOW:
            value = self._value(priority)
        else:  # (may overflow: refused below, without a warning)
            with np.errstate(over="ignore"):
                value = self._value(priority)
        limit = weight_limit(self.index.capacity)
        if not value.max() <= limit:  # (one call when all is well; NaN fails it too)
            check_weights(priority, value, limit)
        self.max_priority = max(self.max_priority, top)
        self._tree.set(rows, value, unique=True)  # (sorted without repeats above)

    def priority(self, rows: np.ndarray) -> np.ndarray:
        """The stored (transformed) priorities ``(p + eps) ** alpha`` at ``rows``."""
        return self._tree.get(as_i64(rows))

    def config(self) -> dict[str, object]:
        out = super().config()
        out.update(alpha=self.alpha, beta=self.beta, eps=self.eps, reduction=self.reduction)
        return out

    def state(self) -> PrioritizedSamplerState:
        base = super().state()
        return PrioritizedSamplerState(
            **vars(base), tree=self._tree.state(), max_priority=self.max_priority
        )

    def restore(self, state: SamplerState) -> None:
        """Load :meth:`state`: the weights must be finite, within the limit, and 0 at every
        row that holds no step.

        Raises:
            ValueError: naming the entry that does not fit.
        """
        state = expect_state(state, PrioritizedSamplerState)
        index = self.index
        limit = weight_limit(index.capacity)
        leaves = float_array(state.tree.leaves, "tree.leaves", index.capacity, limit)
        empty = np.ones(index.capacity, dtype=bool)
        empty[index.live_rows()] = False
        if (leaves[empty] > 0).any():
            raise ValueError("tree.leaves: a row that holds no step has a positive weight")
        with np.errstate(over="ignore"):
            check_weights(np.array([state.max_priority]), self._value(state.max_priority), limit)
        super().restore(state)
        self._tree.restore(SumTreeState(leaves))
        self.max_priority = state.max_priority


@dataclass
class PrioritizedSliceState(SliceSamplerState):
    """:class:`PrioritizedSliceSampler`: the slice state, the tree over slice ends, the
    per-step priorities, the largest priority and each trajectory's short-slice end."""

    tree: SumTreeState
    step_priority: np.ndarray
    max_priority: float
    short_end: np.ndarray


class PrioritizedSliceSampler(SliceSampler):
    """Prioritised slices (PER) with R2D2's sequence priority.

    Every stored step has a priority ``p`` (new steps get the largest priority seen so far).
    A slice's priority is R2D2's mixture of its training steps' priorities::

        priority(slice) = eta * max(p) + (1 - eta) * mean(p)

    and a slice is drawn with probability ``priority ** alpha / sum over eligible slices``
    through a sum tree over slice ends (O(batch)
    per draw, O(updated steps) per update). :meth:`update_priority` takes per-step priorities
    (e.g. absolute TD errors) at storage rows — ``sample["index"]`` — and re-scores every
    slice containing an updated step; a priority per slice broadcasts over its steps. A newly
    written slice gets the largest priority seen so far, so that it is drawn soon (PER's
    rule). Importance weights ``(N * P(i)) ** -beta``, normalised by their maximum, come per
    slice in ``info["priority_weight"]`` and per step in ``sample["priority_weight"]``.

    Slices are drawn per position, and the slice length is fixed (the one of the buffer's
    ``batch_size``). With ``strict_length=False``, trajectories shorter than ``slice_len``
    are sampled whole, as one slice each (TorchRL's rule, as :class:`SliceSampler`).

    A priority ``p`` with ``p + eps`` or ``(p + eps) ** alpha`` above
    ``float_max / (2 * capacity)`` (sums over the buffer could overflow) is refused with a
    ``ValueError``, and the update is not applied at all.

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

    state_type = PrioritizedSliceState

    def __init__(
        self,
        max_capacity: int | None = None,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        *,
        eta: float = 0.9,
        **kwargs: Any,
    ) -> None:
        if "weighting" in kwargs:
            raise TypeError("PrioritizedSliceSampler draws per position: weighting is fixed")
        if kwargs.pop("replacement", True) is False:
            raise TypeError("PrioritizedSliceSampler has no without-replacement variant")
        super().__init__(weighting="transition", **kwargs)
        self.alpha, self.beta, self.eps = _check_per(alpha, beta, eps)
        if isinstance(eta, bool) or not isinstance(eta, int | float):
            raise TypeError(f"eta must be a number, got {type(eta).__name__}")
        if not 0 <= eta <= 1:
            raise ValueError(f"eta must be in [0, 1], got {eta!r}")
        if max_capacity is not None:
            max_capacity = positive_int("max_capacity", max_capacity)
        self.max_capacity = max_capacity
        self.eta = float(eta)
        self._tree = SumTree(1)
        self._step_priority = np.zeros(0)
        self._short_end = np.zeros(0, dtype=I64)  # per trajectory slot: its short slice's end
        self.max_priority = 1.0

    @property
    def _track_ends(self) -> bool:
        return False  # the tree replaces the set of eligible ends

    def rebuild(self) -> None:
        _check_capacity(self.max_capacity, self.index)
        self._step_priority = np.full(self.index.capacity, self.max_priority)
        super().rebuild()

    def _build(self, length: int | None) -> None:
        if self._built_len is not None and length != self._built_len:
            raise ValueError(
                f"PrioritizedSliceSampler slices have a fixed length ({self._built_len}); "
                f"got a batch that implies {length}"
            )
        super()._build(length)
        index = self.index
        self._tree = SumTree(index.capacity)
        self._short_end = np.full(index.traj.size, -1, dtype=I64)
        if length is None:
            return
        rows = index.live_rows()
        self._add_items(rows[index.steps_before(rows) >= length - 1])
        if not self.strict_length:
            self._update_short_ends(index.live_slots(), length)

    def _full(self, rows: np.ndarray, length: int) -> np.ndarray:
        return self.index.steps_before(rows) >= length - 1

    def _eligible(self, rows: np.ndarray, length: int) -> np.ndarray:
        full = self._full(rows, length)
        if self.strict_length:
            return full
        return full | (self._short_end[self.index.row_slot[rows]] == rows)

    def _add_items(self, rows: np.ndarray) -> None:
        self._step_priority[rows] = self.max_priority
        self._tree.set(rows, np.full(rows.size, self.max_priority**self.alpha))

    def _drop_items(self, rows: np.ndarray) -> None:
        self._tree.set(rows, np.zeros(rows.size))

    def _update_short_ends(self, slots: np.ndarray, length: int) -> None:
        """Non-strict: a trajectory shorter than ``length`` is one slice, ending at its last
        stored step. Move those ends for ``slots`` (trajectories that grew, lost old steps or
        disappeared)."""
        index = self.index
        if self._short_end.size < index.traj.size:
            grown = np.full(index.traj.size, -1, dtype=I64)
            grown[: self._short_end.size] = self._short_end
            self._short_end = grown
        T = index.traj.a
        alive = T["key"][slots] >= 0
        short = alive & (T["last"][slots] - T["first"][slots] + 1 < length)
        new = np.where(short, T["last_row"][slots], -1)
        old = self._short_end[slots]
        changed = old != new
        gone = old[changed & (old >= 0)]
        gone = gone[index.row_slot[gone] >= 0]  # evicted rows left the tree already
        gone = gone[~self._full(gone, length)]
        self._drop_items(gone)
        self._short_end[slots] = new
        self._score(new[changed & (new >= 0)], length)

    def on_write(self, report: WriteReport) -> None:
        length = self._built_len
        if length is None:
            return
        self._step_priority[report.new_rows] = self.max_priority
        self._drop_items(np.concatenate([report.evicted_rows, self._stale_ends(report, length)]))
        new = report.new_rows
        self._add_items(new[self._full(new, length)])
        if not self.strict_length:
            # A freed slot's short end was evicted with it (and the slot may hold a new
            # trajectory already): forget it before comparing old and new ends.
            self._short_end[report.freed_slots[report.freed_slots < self._short_end.size]] = -1
            slots = np.concatenate([report.touched_slots, report.head_slots])
            self._update_short_ends(np.unique(slots), length)

    def _pick(
        self, count: int, length: int
    ) -> tuple[np.ndarray, np.ndarray | int, np.ndarray, np.ndarray]:
        index = self.index
        total = self._tree.total()
        if total <= 0:
            raise self._no_slice_error(length)
        ends = self._tree.find(self.random(count) * total)
        before = index.steps_before(ends)
        return ends, 0, before, np.minimum(before + 1, length)

    def draw(self, batch_size: int) -> Draw:
        draw = super().draw(batch_size)
        assert draw.length is not None
        start = draw.start if draw.start is not None else 0
        ends = draw.rows[np.arange(draw.rows.shape[0]), start + draw.length - 1]
        weight = np.power(self._tree.get(ends) / self._tree.min(), -self.beta)
        return Draw(draw.rows, draw.length, draw.burn, weight, draw.start)

    def update_priority(self, rows: np.ndarray, priority: np.ndarray) -> None:
        """Set per-step priorities at storage rows and re-score affected slices.

        ``priority`` has the shape of ``rows`` or broadcasts to it (one value per slice for a
        ``[num_slices, width]`` index). Padding (-1) and rows holding no data are ignored; as
        in TorchRL, a row overwritten since it was sampled passes the priority to its new step.
        With ``burn_in``, give the training steps' rows only (e.g. ``index.where(~burn_in,
        -1)`` with the sample's ``("collector", "burn_in")`` flag): a burn-in step is not
        trained on in this slice, and its priority is that of its own slices.
        """
        idx = np.asarray(rows, dtype=I64)
        prio = np.asarray(priority, dtype=np.float64)
        if idx.ndim == 2 and prio.ndim == 1 and prio.size == idx.shape[0]:
            prio = prio[:, None]
        rows, prio = _live_updates(self.index, idx, np.broadcast_to(prio, idx.shape))
        if rows.size == 0 or self._built_len is None:
            return
        limit = weight_limit(self.index.capacity)
        given = prio
        prio = prio + self.eps
        check_weights(given, prio, limit)  # the mean of a slice sums step priorities
        with np.errstate(over="ignore"):
            check_weights(given, prio**self.alpha, limit)
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
        self._score(ends[self._eligible(ends, length)], length)

    def _score(self, ends: np.ndarray, length: int) -> None:
        """Set the tree value of slice ``ends`` from their steps' priorities."""
        if ends.size == 0:
            return
        index = self.index
        train = np.minimum(index.steps_before(ends) + 1, length)
        window = index.window_rows(ends, 0, train, length)
        valid = window >= 0
        p = np.where(valid, self._step_priority[np.where(valid, window, 0)], 0.0)
        seq = self.eta * p.max(axis=1) + (1 - self.eta) * p.sum(axis=1) / train
        self._tree.set(ends, seq**self.alpha)

    def priority(self, rows: np.ndarray) -> np.ndarray:
        """The drawing weight ``priority(slice) ** alpha`` of the slices ending at ``rows``
        (0 where no slice ends)."""
        return self._tree.get(as_i64(rows))

    def config(self) -> dict[str, object]:
        out = super().config()
        out.update(alpha=self.alpha, beta=self.beta, eps=self.eps, eta=self.eta)
        return out

    def state(self) -> PrioritizedSliceState:
        base = super().state()
        return PrioritizedSliceState(
            **vars(base),
            tree=self._tree.state(),
            step_priority=self._step_priority,
            max_priority=self.max_priority,
            short_end=self._short_end,
        )

    def restore(self, state: SamplerState) -> None:
        """Load :meth:`state`: the slice structures are rebuilt from the index for the saved
        length (see :meth:`SliceSampler.restore`); the saved weights must be finite, within
        the limit and 0 wherever no slice ends, the short-slice ends those of the index.

        Raises:
            ValueError: naming the entry that does not fit.
        """
        state = expect_state(state, PrioritizedSliceState)
        super().restore(state)  # builds the tree and short ends the index implies
        capacity = self.index.capacity
        limit = weight_limit(capacity)
        leaves = float_array(state.tree.leaves, "tree.leaves", capacity, limit)
        no_slice = self._tree.get(np.arange(capacity, dtype=I64)) == 0
        if (leaves[no_slice] > 0).any():
            i = int(np.flatnonzero(no_slice & (leaves > 0))[0])
            raise ValueError(f"tree.leaves: row {i} has a weight but no slice ends there")
        steps = float_array(state.step_priority, "step_priority", capacity, limit)
        with np.errstate(over="ignore"):
            check_weights(np.array([state.max_priority]), np.array([state.max_priority]), limit)
            check_weights(
                np.array([state.max_priority]),
                np.array([state.max_priority]) ** self.alpha,
                limit,
            )
        short = int_array(state.short_end, "short_end")
        built = self._short_end
        expected = np.full(max(short.size, built.size), -1, dtype=I64)
        expected[: built.size] = built
        if (
            short.size > built.size
            or not np.array_equal(short, expected[: short.size])
            or (expected[short.size :] != -1).any()
        ):
            raise ValueError("short_end: not the short-slice ends the index implies")
        self._tree.restore(SumTreeState(leaves))
        self._step_priority = steps
        self.max_priority = state.max_priority
        self._short_end = short
