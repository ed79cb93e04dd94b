"""``SliceSampler`` and ``SliceSamplerWithoutReplacement``: contiguous pieces of trajectories.

A slice is identified by its *last* training step (its end); with ``strict_length=False`` and
transition weighting, by its first (every stored step may start one). A slice of length
``L`` ending at a stored step is eligible when the ``L - 1`` steps before it are stored in the
same trajectory (``strict_length=True``). Because the steps before an end only change when
the trajectory's oldest steps are overwritten, eligibility is decided once, when the end step
is written, and withdrawn when overwriting reaches it: the set of eligible ends is maintained
in O(batch) per write, and a draw costs O(batch) — never a scan of the storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from tensordict.utils import NestedKey

from splice._args import non_negative_int, positive_int
from splice.layout import IS_INIT, TRUNCATED, Key, as_key_tuple
from splice.replay._structures import EMPTY, I64, DenseSet, DenseSetState, Epoch, EpochState
from splice.replay._validate import check_epoch, check_members, int_in
from splice.replay.index import WriteReport
from splice.replay.samplers._base import (
    Draw,
    Sampler,
    SamplerState,
    SliceMarks,
    expect_state,
    key_or_none,
)

__all__ = [
    "SliceSampler",
    "SliceSamplerState",
    "SliceSamplerWithoutReplacement",
    "SliceWithoutReplacementState",
]

_WEIGHTINGS = ("trajectory", "transition")
_ALIGNMENTS = ("left", "right")


def _key_tuple(name: str, keys: Sequence[NestedKey] | None) -> tuple[Key, ...] | None:
    """``keys`` as key tuples (None stays None).

    Raises:
        TypeError: ``keys`` is a single string, or holds something else than keys.
        ValueError: ``keys`` is empty.
    """
    if keys is None:
        return None
    if isinstance(keys, str):
        raise TypeError(f"{name} must be a list of keys, got the single key {keys!r}")
    out = []
    for key in keys:
        if not (
            isinstance(key, str)
            or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key))
        ):
            raise TypeError(f"{name}: {key!r} is not a key (a str or a tuple of str)")
        out.append(as_key_tuple(key))
    if not out:
        raise ValueError(f"{name} must name at least one key (None: every key)")
    return tuple(out)


@dataclass
class SliceSamplerState(SamplerState):
    """:class:`SliceSampler`: the base state, the slice length the sets were built for
    (-1: none yet) and the sets of eligible ends and trajectories."""

    built_len: int
    ends: DenseSetState
    trajs: DenseSetState


@dataclass
class SliceWithoutReplacementState(SliceSamplerState):
    """:class:`SliceSamplerWithoutReplacement`: the slice state and the epoch."""

    epoch: EpochState


class SliceSampler(Sampler):
    """Samples slices of consecutive steps of one trajectory; TorchRL's ``SliceSampler``, fixed.

    Same names and meanings as ``torchrl.data.SliceSampler`` (``num_slices`` xor
    ``slice_len``; ``end_key``/``traj_key``; ``truncated_key``; ``strict_length``;
    ``pad_output``), with these differences:

    * **Boundaries are known at write time.** The buffer's index records each stored step's
      trajectory and step number as it is written, so a slice never crosses an episode end,
      the write cursor, another env's or writer's data, or overwritten steps — and it may span
      the storage positions of one trajectory that arrived in several collector chunks.
      Drawing costs O(batch): there is nothing to cache (``cache_values`` is accepted and
      ignored).
    * ``weighting``: ``"trajectory"`` (TorchRL's behaviour and the default: every eligible
      trajectory is equally likely, then the slice position is uniform within it) or
      ``"transition"`` (every eligible slice position in the buffer is equally likely: each
      step followed by at least ``slice_len - 1`` steps of its trajectory is equally likely
      to start a slice, and with ``strict_length=False`` every stored step is). With
      ``"trajectory"`` a step of a short episode is sampled far more often than a step of a
      long one; with ``"transition"`` only a trajectory's first ``slice_len - 1`` steps (and,
      with ``strict_length=True``, its last ``slice_len - 1``) lie in fewer slices.
    * ``as_sequences=True`` returns ``[num_slices, width]`` instead of TorchRL's flat
      ``[num_slices * width]`` (``width = burn_in + slice_len``), with a mask.
    * ``burn_in=K`` brings, before every slice's first training step, the ``K`` steps of its
      trajectory that precede it: an RNN's burn-in (warm-up) or a transformer's context;
      one rule for both. They are stored steps of the same trajectory only: fewer where the
      trajectory starts less than ``K`` steps before the slice, or its older steps were
      overwritten, never a step of another episode or env. They are flagged in
      ``("collector", "burn_in")``, and ``("collector", "mask") & ~("collector", "burn_in")``
      marks the training steps, where a loss applies. ``burn_in_align`` places them:

      - ``"left"`` (default): burn-in steps, training steps, padding. Every row starts with
        its first real step, so a recurrent network runs each row from its first column,
        starting from the stored state found there (``state_keys``); a row's first training
        step is at column ``info["burn_in"][i]``.
      - ``"right"``: a fixed layout for attention models. Training step ``j`` of every slice
        is at column ``K + j``, the steps before it at columns ``K - 1``, ``K - 2``, ... back
        to column 0, which are padding (mask False, index -1) where no step of the
        trajectory is stored. Training outputs are ``out[:, K:]``, and
        :func:`~splice.attention_mask` builds each step's causal attention mask from the
        sample's mask. The flat output keeps the layout: ``[num_slices * width]`` with the
        mask (padded, as with ``pad_output``). ``burn_in + slice_len`` may not exceed the
        storage (no window could ever be complete).

      ``burn_in_keys`` reads only the named keys at the steps before the training steps
      (e.g. ``["observation", "action"]``, or a per-step entry the policy stored at
      collection, such as its layers' activations; a key names every key under it); the
      other keys are zero there (``None`` for non-tensor entries). Training steps bring
      every stored key. Reading a few keys of ``K`` steps instead of all of them is what
      makes long contexts cheap.
    * ``state_keys``: keys (e.g. the recurrent state) whose stored value at each slice's first
      step is returned in ``info["initial_state"]`` (``sample(return_info=True)``).

    ``batch_size`` counts training steps (``num_slices * slice_len``); burn-in steps come on
    top. In the output, ``truncated_key`` is True at the last real step of every slice (and
    ``done`` with it), the stored ``init_key`` flag is set at every slice's first step, a
    collector cut inside a slice is cleared (with the done/truncated marks TorchRL's
    ``set_truncated`` put there), and ``"index"`` holds the storage rows (-1 on padding).

    With ``strict_length=False``, trajectories shorter than ``slice_len`` are sampled whole
    (TorchRL's rule: a trajectory of ``n`` steps has ``max(n - slice_len + 1, 1)`` positions);
    with ``"transition"`` weighting every stored step may start a slice, which is then cut at
    the trajectory's last stored step, so that the last steps of an episode (its terminal
    transition above all) are trained on as often as any other (R2D2's sequences). Short
    slices are padded when the output is shaped or ``pad_output=True``, else concatenated (a
    smaller flat batch, as in TorchRL).

    Args:
        replacement: ``False`` gives a :class:`SliceSamplerWithoutReplacement` (with the
            other arguments), as in TorchRL.
        num_slices: slices per batch (exclusive with ``slice_len``).
        slice_len: training steps per slice (exclusive with ``num_slices``).
        end_key: end-of-trajectory flag used when the data has no trajectory ids
            (default ``("next", "done")``).
        traj_key: key of the trajectory ids. Default: ``("collector", "traj_ids")`` when
            present, else ``"episode"`` (TorchRL's auto-detection). A ``traj_key`` absent
            from the data falls back to the end flags (as in TorchRL). Ids, when present,
            take precedence over end flags.
        truncated_key: where to mark slice ends (None: leave the flags alone).
        init_key: where to mark slice starts, when stored (None: leave alone).
        strict_length: only sample full-length slices.
        pad_output: pad the flat output to ``num_slices * width`` with a mask.
        weighting: ``"trajectory"`` or ``"transition"`` (see above).
        as_sequences: return ``[num_slices, width]`` (default flat, TorchRL's layout).
        burn_in: steps before each slice's training steps (RNN burn-in, transformer
            context; see above).
        burn_in_align: ``"left"`` (packed, for recurrent warm-up) or ``"right"`` (training
            step ``j`` at column ``burn_in + j``, for attention); needs ``burn_in >= 1``.
        burn_in_keys: the keys read at the steps before the training steps (None: every
            key); needs ``burn_in >= 1``.
        state_keys: keys returned at each slice's first step in ``info["initial_state"]``.
        cache_values: ignored (accepted so that TorchRL code ports unchanged).
        generator: the random generator to draw from.
        seed: seed of a fresh generator (exclusive with ``generator``).

    Examples:
        Episodes of 5 steps arrive in chunks of 3 (ids continue across chunks), yet 4-step
        slices are contiguous (the observation counts the global step):

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(100),
        ...     sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
        ...     batch_size=8,
        ... )
        >>> step = torch.arange(20)
        >>> for chunk in step.split(3):
        ...     _ = rb.extend(
        ...         TensorDict(
        ...             {"observation": chunk.float(), ("collector", "traj_ids"): chunk // 5},
        ...             batch_size=[len(chunk)],
        ...         )
        ...     )
        >>> sample = rb.sample()
        >>> sample["observation"]
        tensor([[16., 17., 18., 19.],
                [10., 11., 12., 13.]])
        >>> sample["next", "truncated"].squeeze(-1)
        tensor([[False, False, False,  True],
                [False, False, False,  True]])

        An attention model's context: 2 training steps per slice at columns 3 and 4, the 3
        steps of the episode before them at columns 0-2 (only their observations read):

        >>> from splice import attention_mask
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(100),
        ...     sampler=SliceSampler(
        ...         slice_len=2,
        ...         burn_in=3,
        ...         burn_in_align="right",
        ...         burn_in_keys=["observation"],
        ...         as_sequences=True,
        ...         seed=0,
        ...     ),
        ...     batch_size=4,
        ... )
        >>> steps = {"observation": step.float(), "action": step % 2}
        >>> steps["collector", "traj_ids"] = step // 5
        >>> _ = rb.extend(TensorDict(steps, batch_size=[20]))
        >>> sample = rb.sample()
        >>> sample["index"]  # -1: no step of the episode there (episodes start at 0, 5, 10, 15)
        tensor([[-1, 15, 16, 17, 18],
                [-1, -1, -1, 10, 11]])
        >>> sample["action"]  # not in burn_in_keys: zero before the training steps
        tensor([[0, 0, 0, 1, 0],
                [0, 0, 0, 0, 1]])
        >>> mask = attention_mask(sample["collector", "mask"], window=3)  # [2, 5, 5]
        >>> mask[0, 3:].int()  # training steps see themselves and up to 3 stored steps before
        tensor([[0, 1, 1, 1, 0],
                [0, 1, 1, 1, 1]], dtype=torch.int32)
    """

    needs_trajectories = True
    state_type: ClassVar[type[SamplerState]] = SliceSamplerState

    def __new__(cls, *args: Any, replacement: bool = True, **kwargs: Any) -> Any:
        if replacement is False and cls is SliceSampler:
            # TorchRL's dispatch: SliceSampler(replacement=False) is a
            # SliceSamplerWithoutReplacement (initialised by Python with the same arguments).
            return super().__new__(SliceSamplerWithoutReplacement)
        return super().__new__(cls)

    def __init__(
        self,
        *,
        replacement: bool = True,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        truncated_key: NestedKey | None = TRUNCATED,
        init_key: NestedKey | None = IS_INIT,
        strict_length: bool = True,
        pad_output: bool = False,
        weighting: str = "trajectory",
        as_sequences: bool = False,
        burn_in: int = 0,
        burn_in_align: str = "left",
        burn_in_keys: Sequence[NestedKey] | None = None,
        state_keys: Sequence[NestedKey] = (),
        cache_values: bool = False,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(generator=generator, seed=seed)
        if (num_slices is None) == (slice_len is None):
            raise TypeError("pass exactly one of num_slices= and slice_len=")
        num_slices = None if num_slices is None else positive_int("num_slices", num_slices)
        slice_len = None if slice_len is None else positive_int("slice_len", slice_len)
        if weighting not in _WEIGHTINGS:
            raise ValueError(f"weighting must be one of {_WEIGHTINGS}, got {weighting!r}")
        burn_in = non_negative_int("burn_in", burn_in)
        if burn_in_align not in _ALIGNMENTS:
            raise ValueError(f"burn_in_align must be one of {_ALIGNMENTS}, got {burn_in_align!r}")
        context_keys = _key_tuple("burn_in_keys", burn_in_keys)
        for name, used in (
            ("burn_in_align='right'", burn_in_align == "right"),
            ("burn_in_keys", context_keys is not None),
        ):
            if used and burn_in < 1:
                raise ValueError(f"{name} needs burn_in >= 1 (steps before each slice), got 0")
        if pad_output and strict_length:
            raise ValueError(
                "pad_output=True is incompatible with strict_length=True: strict slices are "
                "never short, so there is nothing to pad"
            )
        self.num_slices = num_slices
        self.slice_len = slice_len
        self.end_key = end_key
        self.traj_key = traj_key
        self.truncated_key = truncated_key
        self.init_key = init_key
        self._truncated = key_or_none(truncated_key)
        self._init = key_or_none(init_key)
        self.strict_length = bool(strict_length)
        self.pad_output = bool(pad_output)
        self.weighting = weighting
        self.as_sequences = bool(as_sequences)
        self.burn_in = burn_in
        self.burn_in_align = burn_in_align
        self.burn_in_keys = context_keys
        self.state_keys: tuple[Key, ...] = tuple(as_key_tuple(k) for k in state_keys)
        self.cache_values = cache_values
        self._built_len: int | None = None
        self._ends = DenseSet(0)  # eligible end rows ("transition", strict)
        self._trajs = DenseSet(0)  # eligible trajectory slots ("trajectory")

    def __repr__(self) -> str:
        size = (
            f"slice_len={self.slice_len}"
            if self.slice_len is not None
            else f"num_slices={self.num_slices}"
        )
        return (
            f"{type(self).__name__}({size}, weighting={self.weighting!r}, "
            f"strict_length={self.strict_length}, burn_in={self.burn_in}"
            + (f", burn_in_align={self.burn_in_align!r}" if self._fixed else "")
            + ")"
        )

    @property
    def _fixed(self) -> bool:
        """Right-aligned burn-in: training step ``j`` always at column ``burn_in + j``."""
        return self.burn_in_align == "right"

    # ------------------------------------------------------------------ sizes
    def shape_for(self, batch_size: int) -> tuple[int, int]:
        """``(num_slices, slice_len)`` for a batch of ``batch_size`` training steps."""
        if self.slice_len is not None:
            if batch_size % self.slice_len:
                raise ValueError(
                    f"batch_size {batch_size} is not divisible by slice_len {self.slice_len}"
                )
            return batch_size // self.slice_len, self.slice_len
        assert self.num_slices is not None
        if batch_size % self.num_slices:
            raise ValueError(
                f"batch_size {batch_size} is not divisible by num_slices {self.num_slices}"
            )
        return self.num_slices, batch_size // self.num_slices

    def check_batch_size(self, batch_size: int) -> None:
        super().check_batch_size(batch_size)
        length = self.shape_for(batch_size)[1]
        if self.attached:
            self._check_window(length)

    def _check_window(self, length: int) -> None:
        """Refuse right-aligned windows longer than the storage (none could be complete)."""
        capacity = self.index.capacity
        if self._fixed and self.burn_in + length > capacity:
            raise ValueError(
                f"burn_in={self.burn_in} + slice_len={length} = {self.burn_in + length} steps "
                f"per window, longer than the storage ({capacity} steps): with "
                "burn_in_align='right' a window must fit in the storage"
            )

    @property
    def marks(self) -> SliceMarks:
        return SliceMarks(
            truncated_key=self._truncated,
            init_key=self._init,
            pad_output=self.pad_output or self._fixed,  # the fixed layout is kept when flat
            as_sequences=self.as_sequences,
            burn_in=self.burn_in,
            state_keys=self.state_keys,
            burn_in_keys=self.burn_in_keys,
        )

    @property
    def _track_ends(self) -> bool:
        return self.weighting == "transition" and self.strict_length

    # ------------------------------------------------------------------ maintenance
    def rebuild(self) -> None:
        length = self._built_len
        if length is None and self.default_batch_size is not None:
            length = self.shape_for(self.default_batch_size)[1]
        if length is not None:
            self._check_window(length)
        self._build(length)

    def _build(self, length: int | None) -> None:
        index = self.index
        self._built_len = length
        self._ends = DenseSet(index.capacity if self._track_ends else 0)
        self._trajs = DenseSet(index.traj.size if self.weighting == "trajectory" else 0)
        if length is None:
            return
        if self._track_ends:
            rows = index.live_rows()
            self._ends.add(rows[index.steps_before(rows) >= length - 1])
        if self.weighting == "trajectory":
            self._update_trajs(index.live_slots())

    def _ensure(self, length: int) -> None:
        if self._built_len != length:
            self._build(length)

    def on_write(self, report: WriteReport) -> None:
        length = self._built_len
        if length is None:
            return
        index = self.index
        if self._track_ends:
            self._ends.discard(report.evicted_rows)
            self._ends.discard(self._stale_ends(report, length))
            new = report.new_rows
            self._ends.add(new[index.steps_before(new) >= length - 1])
        if self.weighting == "trajectory":
            # (Each of the three is unique.) Freed trajectories leave the set first (a slot
            # freed and reused by this write is in ``touched_slots``); trajectories that lost
            # their oldest steps are alive (a write frees only by eviction) and were in the
            # set if they were long enough: with ``strict_length`` the ones now too short
            # leave it; the written ones only gained steps (or were cut just before: then
            # they are head slots too, already updated), so they can only join the set.
            if report.freed_slots.size:
                self._trajs.discard(report.freed_slots, unique=True)
            if self.strict_length and report.head_slots.size:
                slots = report.head_slots
                T = index.traj.a
                short = T["last"][slots] - T["first"][slots] < length - 1
                self._trajs.discard(slots[short], unique=True)
            self._add_trajs(report.touched_slots)

    def _add_trajs(self, slots: np.ndarray) -> None:
        """Add the trajectories of ``slots`` (live, unique) that are long enough."""
        assert self._built_len is not None
        index = self.index
        self._trajs.grow(index.traj.size)
        if self.strict_length:
            T = index.traj.a
            slots = slots[T["last"][slots] - T["first"][slots] >= self._built_len - 1]
        self._trajs.add(slots, unique=True)

    def _update_trajs(self, slots: np.ndarray) -> None:
        index = self.index
        assert self._built_len is not None
        self._trajs.grow(index.traj.size)
        T = index.traj.a
        ok = T["key"][slots] >= 0  # alive
        if self.strict_length:
            ok &= T["last"][slots] - T["first"][slots] >= self._built_len - 1
        self._trajs.discard(slots[~ok], unique=True)
        self._trajs.add(slots[ok], unique=True)

    def _stale_ends(self, report: WriteReport, length: int) -> np.ndarray:
        """Ends that lost their full-length slice because older steps were overwritten.

        A trajectory whose first live step moved from ``f0`` to ``f`` keeps every end at step
        ``>= f + length - 1``; the ends at steps ``[max(f0 + length - 1, f), f + length - 2]``
        become ineligible. Only trajectories cut by this write are visited.
        """
        slots = report.head_slots
        if slots.size == 0 or length < 2:
            return EMPTY
        index = self.index
        T = index.traj.a
        first = T["first"][slots]
        lo = np.maximum(report.head_old_first + length - 1 - first, 0)
        hi = np.minimum(length - 2, T["last"][slots] - first)
        count = np.maximum(hi - lo + 1, 0)
        total = int(count.sum())
        if total == 0:
            return EMPTY
        anchor = np.repeat(T["first_row"][slots], count)
        offset = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(total, dtype=I64)
        return index.rows_forward(anchor, offset)

    # ------------------------------------------------------------------ drawing
    def _no_slice_error(self, length: int) -> RuntimeError:
        return RuntimeError(
            f"no trajectory has {length} stored steps (slice_len={length}, "
            f"strict_length=True): extend the buffer first, or pass strict_length=False"
        )

    def _pick(
        self, count: int, length: int
    ) -> tuple[np.ndarray, np.ndarray | int, np.ndarray, np.ndarray]:
        """``count`` slices (the index is not empty: :meth:`draw` checked): ``(anchor rows,
        offset of each slice's end before its anchor, steps stored before each end, training
        length)``."""
        index = self.index
        if self.weighting == "trajectory":
            n = len(self._trajs)
            if n == 0:
                raise self._no_slice_error(length)
            slots = self._trajs.items[self.randint(n, count)]
            return self._end_in_trajectory(slots, length)
        if self.strict_length:
            n = len(self._ends)
            if n == 0:
                raise self._no_slice_error(length)
            ends = self._ends.items[self.randint(n, count)]
            return ends, 0, index.steps_before(ends), np.full(count, length, dtype=I64)
        starts = (index.lo + self.randint(len(index), count)) % index.capacity
        return self._from_starts(starts, length)

    def _from_starts(
        self, starts: np.ndarray, length: int
    ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
        """Slices that start at ``starts``, cut at their trajectory's last stored step."""
        index = self.index
        train = np.minimum(index.steps_after(starts) + 1, length)
        ends = index.rows_forward(starts, train - 1)
        return ends, 0, index.steps_before(starts) + train - 1, train

    def _end_in_trajectory(
        self, slots: np.ndarray, length: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A uniform slice position inside each of ``slots`` (TorchRL's rule)."""
        T = self.index.traj.a
        avail = T["last"][slots] - T["first"][slots] + 1
        train = np.minimum(avail, length)
        back = self.randint(avail - train + 1, slots.size)  # steps after the slice's end
        return T["last_row"][slots], back, avail - 1 - back, train

    def draw(self, batch_size: int) -> Draw:
        count, length = self.shape_for(batch_size)
        self._ensure(length)
        if len(self.index) == 0:
            raise self.empty_error()
        anchor, offset, before, train = self._pick(count, length)
        # The one rule: up to ``burn_in`` stored steps of the trajectory before the first
        # training step; the alignment only decides the column the slice starts at.
        burn = np.minimum(self.burn_in, before - (train - 1))
        total = burn + train
        start = self.burn_in - burn if self._fixed else None
        width = self.burn_in + length
        rows = self.index.window_rows(anchor, offset, total, width, 0 if start is None else start)
        return Draw(rows=rows, length=total, burn=burn, start=start)

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, object]:
        out = super().config()
        out.update(
            num_slices=self.num_slices,
            slice_len=self.slice_len,
            weighting=self.weighting,
            strict_length=self.strict_length,
            burn_in=self.burn_in,
            end_key=None if self.end_key is None else list(as_key_tuple(self.end_key)),
            traj_key=None if self.traj_key is None else list(as_key_tuple(self.traj_key)),
        )
        # (Only when set: buffers saved before these settings existed keep loading.)
        if self._fixed:
            out.update(burn_in_align=self.burn_in_align)
        if self.burn_in_keys is not None:
            out.update(burn_in_keys=[list(key) for key in self.burn_in_keys])
        return out

    def state(self) -> SliceSamplerState:
        base = super().state()
        return SliceSamplerState(
            **vars(base),
            built_len=-1 if self._built_len is None else self._built_len,
            ends=self._ends.state(),
            trajs=self._trajs.state(),
        )

    def restore(self, state: SamplerState) -> None:
        """Load :meth:`state`: the sets are rebuilt from the index for the saved slice
        length and must hold exactly the saved members (whose order is kept).

        Raises:
            ValueError: a slice length this sampler cannot have, or sets that do not match
                the index.
        """
        state = expect_state(state, SliceSamplerState)
        length = int_in(state.built_len, "built_len", -1, self.index.capacity)
        if length == 0 or (length > 0 and self.slice_len not in (None, length)):
            raise ValueError(f"built_len: {length} for slice_len={self.slice_len}")
        self._built_len = None  # a prioritised slice sampler refuses length changes in use
        self._build(None if length < 0 else length)
        built = length > 0
        check_members(state.ends.items, state.ends.universe, self._ends, "ends", built=built)
        check_members(state.trajs.items, state.trajs.universe, self._trajs, "trajs", built=built)
        super().restore(state)
        self._ends.restore(state.ends)
        self._trajs.restore(state.trajs)


class SliceSamplerWithoutReplacement(SliceSampler):
    """A :class:`SliceSampler` that visits every eligible item once per epoch.

    The items are what the weighting draws: trajectories (``"trajectory"``: each eligible
    trajectory yields one slice per epoch, at a random position — TorchRL's behaviour) or slice
    positions (``"transition"``: every eligible slice end once per epoch). An epoch is a
    shuffled snapshot of the items eligible when it starts (O(items) once per epoch, i.e.
    O(1) amortised per item); items overwritten or no longer eligible are skipped, items
    written during the epoch wait for the next one. ``ran_out`` becomes True with the last
    batch of an epoch, which ends iteration over the buffer.

    Args:
        drop_last: drop the last, incomplete batch of an epoch (default: return it smaller).
        shuffle: visit the items in random order (default) or in storage order.
        replacement: accepted for TorchRL compatibility (the dispatch target of
            ``SliceSampler(replacement=False)``); must be False.
        num_slices: as for :class:`SliceSampler`, and so are ``slice_len``, ``end_key``,
            ``traj_key``, ``truncated_key``, ``init_key``, ``strict_length``,
            ``pad_output``, ``weighting``, ``as_sequences``, ``burn_in``, ``burn_in_align``,
            ``burn_in_keys``, ``state_keys``, ``cache_values``, ``generator`` and ``seed``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, ReplayBuffer
        >>> from splice.replay import SliceSamplerWithoutReplacement
        >>> sampler = SliceSamplerWithoutReplacement(slice_len=2, seed=0)
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler, batch_size=4)
        >>> ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
        >>> _ = rb.extend(TensorDict({("collector", "traj_ids"): ids}, batch_size=[9]))
        >>> [sorted(set(batch["collector", "traj_ids"].tolist())) for batch in rb]
        [[0, 2], [1]]
    """

    state_type = SliceWithoutReplacementState

    def __init__(
        self,
        *,
        replacement: bool = False,
        num_slices: int | None = None,
        slice_len: int | None = None,
        drop_last: bool = False,
        shuffle: bool = True,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        truncated_key: NestedKey | None = TRUNCATED,
        init_key: NestedKey | None = IS_INIT,
        strict_length: bool = True,
        pad_output: bool = False,
        weighting: str = "trajectory",
        as_sequences: bool = False,
        burn_in: int = 0,
        burn_in_align: str = "left",
        burn_in_keys: Sequence[NestedKey] | None = None,
        state_keys: Sequence[NestedKey] = (),
        cache_values: bool = False,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        if replacement:
            raise ValueError("SliceSamplerWithoutReplacement(replacement=True): use SliceSampler")
        super().__init__(
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            traj_key=traj_key,
            truncated_key=truncated_key,
            init_key=init_key,
            strict_length=strict_length,
            pad_output=pad_output,
            weighting=weighting,
            as_sequences=as_sequences,
            burn_in=burn_in,
            burn_in_align=burn_in_align,
            burn_in_keys=burn_in_keys,
            state_keys=state_keys,
            cache_values=cache_values,
            generator=generator,
            seed=seed,
        )
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        # Items: global positions ("transition") or trajectory slots tagged with their
        # generation ("trajectory").
        self._epoch = Epoch(drop_last=self.drop_last)

    def rebuild(self) -> None:
        if self.drop_last and self.default_batch_size is None:
            raise ValueError(
                "Samplers with drop_last=True must work with a prescribed batch_size: pass "
                "batch_size to the ReplayBuffer"
            )
        super().rebuild()

    def _build(self, length: int | None) -> None:
        super()._build(length)
        self._epoch.reset()

    def _new_epoch(self) -> None:
        index = self.index
        tags = None
        if self.weighting == "trajectory":
            items = np.sort(self._trajs.members())
            tags = index.traj.a["gen"][items]
        elif self.strict_length:
            items = np.sort(index.global_position(self._ends.members()))
        else:
            items = np.arange(index.lo, index.write_count, dtype=I64)
        self._epoch.start(items, tags, self.generator if self.shuffle else None)

    def _valid(self, items: np.ndarray, tags: np.ndarray) -> np.ndarray:
        index = self.index
        if self.weighting == "trajectory":
            alive = index.traj.a["gen"][items] == tags
            return alive & self._trajs.contains(items)
        live = items >= index.lo
        if self.strict_length:
            live[live] = self._ends.contains(items[live] % index.capacity)
        return live

    def _pick(
        self, count: int, length: int
    ) -> tuple[np.ndarray, np.ndarray | int, np.ndarray, np.ndarray]:
        index = self.index
        self.ran_out = False
        if self._epoch.finished(count):
            self._new_epoch()
        items = self._epoch.take(count, self._valid)
        if items.size == 0 or (self.drop_last and items.size < count):
            self._new_epoch()  # the rest of the epoch was stale
            items = self._epoch.take(count, self._valid)
        if items.size == 0:
            raise self._no_slice_error(length)
        if self._epoch.finished(count):
            self.ran_out = True
        if self.weighting == "trajectory":
            return self._end_in_trajectory(items, length)
        if self.strict_length:
            ends = items % index.capacity
            return ends, 0, index.steps_before(ends), np.full(ends.size, length, dtype=I64)
        return self._from_starts(items % index.capacity, length)

    def config(self) -> dict[str, object]:
        out = super().config()
        out.update(drop_last=self.drop_last, shuffle=self.shuffle)
        return out

    def state(self) -> SliceWithoutReplacementState:
        base = super().state()
        return SliceWithoutReplacementState(**vars(base), epoch=self._epoch.state())

    def restore(self, state: SamplerState) -> None:
        state = expect_state(state, SliceWithoutReplacementState)
        super().restore(state)
        index = self.index
        if self.weighting == "trajectory":  # slots, tagged with their generation
            check_epoch(state.epoch, "epoch", index.traj.size, tagged=True)
        else:  # global positions
            check_epoch(state.epoch, "epoch", index.write_count, tagged=False)
        self._epoch.restore(state.epoch)
