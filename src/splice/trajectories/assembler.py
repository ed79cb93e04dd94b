"""``TrajectoryAssembler``: collector chunks in, complete episodes out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice._gather import take_rows
from splice.contract import Steps, flatten_steps
from splice.layout import (
    CUT,
    DONE,
    MASK,
    TRAJ_FORMATS,
    TRAJ_IDS,
    Key,
    LayoutError,
    TrajFormat,
    as_key_tuple,
    fmt_key,
)
from splice.trajectories._id_set import IdSet
from splice.trajectories._index import index_by_id, index_by_row
from splice.trajectories._tensordict import replace_last
from splice.trajectories.split import to_padded

__all__ = ["Drained", "TrajectoryAssembler"]


class TrajectoryAssembler:
    """Stitch trajectory fragments from successive collector batches into whole episodes.

    :meth:`ingest` takes batches of shape ``[T]`` or ``[B, T]`` whose trajectories continue
    across calls (same id in the next batch). An episode is *complete* when a step of it has
    ``("next", "done")`` (or terminated/truncated) set by the environment. A step marked
    ``("collector", "cut")`` is a cut made by the collector at a batch edge: it never completes
    an episode, and any done/truncated flag the collector put there (TorchRL's
    ``set_truncated``) is cleared when the fragments are stitched, so an emitted episode has a
    single end, at its last step.

    :meth:`emit` returns complete episodes in the order they completed (ties: earlier env row
    first) as ``[n, max_len]`` + mask (``"padded"``) or flat ``[sum of lengths]`` (``"cat"``).
    :meth:`flush` returns the episodes still in flight, each marked with ``cut=True`` on its
    last step so it can never pass for a complete episode.

    Steps are kept in one flat pool that grows geometrically and is compacted lazily, so
    memory stays proportional to what is buffered, no Python object is made per step, and
    a long episode is never re-concatenated batch after batch.

    Args:
        trajectory_key: key of the trajectory ids (required in every batch).
        done_key: key of the done flag; ``terminated``/``truncated`` are read next to it.
        cut_key: key of the collector's cut mark (optional in the input, always in the output).
        mask_key: key of the mask in ``"padded"`` output.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice import TrajectoryAssembler
        >>> def chunk(ids, done):
        ...     return TensorDict(
        ...         {
        ...             ("collector", "traj_ids"): torch.tensor(ids),
        ...             ("next", "done"): torch.tensor(done).unsqueeze(-1),
        ...         },
        ...         batch_size=[len(ids)],
        ...     )
        >>> asm = TrajectoryAssembler()
        >>> asm.ingest(chunk([0, 0, 0], [False, False, False]))  # episode 0 is cut
        0
        >>> asm.ingest(chunk([0, 1, 1], [True, False, False]))  # ... and ends here
        1
        >>> len(asm), asm.num_in_flight
        (1, 1)
        >>> episode = asm.emit(1)
        >>> episode["collector", "traj_ids"]
        tensor([[0, 0, 0, 0]])
        >>> asm.flush(traj_format="cat")["collector", "cut"]
        tensor([False,  True])
    """

    def __init__(
        self,
        *,
        trajectory_key: NestedKey = TRAJ_IDS,
        done_key: NestedKey = DONE,
        cut_key: NestedKey = CUT,
        mask_key: NestedKey = MASK,
    ) -> None:
        self.trajectory_key = as_key_tuple(trajectory_key)
        self.done_key = as_key_tuple(done_key)
        self.terminated_key = replace_last(done_key, "terminated")
        self.truncated_key = replace_last(done_key, "truncated")
        self.cut_key = as_key_tuple(cut_key)
        self.mask_key = as_key_tuple(mask_key)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Drop everything buffered: complete and in-flight episodes, the key schema and the
        record of completed ids."""
        self._pool: dict[Key, Tensor] | None = None  # one column per key, rows = steps
        self._device: torch.device | None = None
        self._schema: dict[Key, tuple[torch.dtype, torch.Size]] | None = None
        self._ids = torch.empty(0, dtype=torch.int64)
        self._alive = torch.empty(0, dtype=torch.bool)
        self._size = 0  # pool rows in use, alive or dead
        self._n_dead = 0
        self._complete = torch.empty(0, dtype=torch.int64)  # ids, in completion order
        self._completed = IdSet()  # every id completed so far (emitted or not)

    def __len__(self) -> int:
        """The number of complete episodes ready to :meth:`emit`."""
        return self._complete.numel()

    @property
    def num_complete(self) -> int:
        """Complete episodes ready to emit (same as ``len()``)."""
        return len(self)

    @property
    def num_in_flight(self) -> int:
        """Episodes started but not finished yet."""
        return int(torch.unique(self._ids[: self._size][self._in_flight_mask()]).numel())

    @property
    def frames_complete(self) -> int:
        """Steps held by complete episodes."""
        return int(self._complete_mask().sum())

    @property
    def frames_in_flight(self) -> int:
        """Steps held by episodes still in flight."""
        return int(self._in_flight_mask().sum())

    @property
    def frames_buffered(self) -> int:
        """All steps held (complete plus in flight)."""
        return self._size - self._n_dead

    def _complete_mask(self) -> Tensor:
        live = self._alive[: self._size]
        return live & _isin(self._ids[: self._size], self._complete)

    def _in_flight_mask(self) -> Tensor:
        live = self._alive[: self._size]
        return live & ~_isin(self._ids[: self._size], self._complete)

    # ----------------------------------------------------------------- ingest
    def ingest(self, batch: TensorDictBase) -> int:
        """Add a collector batch (``[T]`` or ``[B, T]``, time last).

        Steps with id ``-1``, or whose mask (if the batch has one) is False, are padding and
        are ignored. Ids are never reused: a step for an id that already completed (in an
        earlier batch, or earlier in this one) is refused, so is ingesting a batch twice. The
        batch is validated before anything is stored: on error the assembler is left exactly as
        it was.

        Returns:
            The number of episodes this batch completed.

        Raises:
            TypeError: ``batch`` is not a TensorDict.
            LayoutError: no ids, no done flags, wrong shapes or dtypes, ids below ``-1``, steps
                for an id that already completed, or keys that differ from the batches
                ingested before.
        """
        ids, ends, cut, steps = self._read_batch(batch)
        n_env, n_time = steps.n_envs, steps.steps_per_env
        columns = {key: x for key, x in steps.columns.items() if key != self.cut_key}
        # Completion order: by time step, then env row (flat index is env-major).
        flat_pos = torch.arange(ids.numel())
        completion_key = (flat_pos % n_time) * n_env + flat_pos // n_time
        if steps.real is not None:
            ends &= steps.real
        done_ids = ids[ends][torch.argsort(completion_key[ends])]
        if steps.real is not None:
            keep = steps.real.nonzero().squeeze(1)
            columns = {key: take_rows(x, keep) for key, x in columns.items()}
            ids, cut, ends = ids[keep], cut[keep], ends[keep]
        self._refuse_completed_ids(ids, ends)
        self._check_schema(columns)
        if self._device is None:
            self._device = batch.device
        if ids.numel() == 0:  # no real steps ([B, 0], all padding): nothing to store
            return 0
        self._append(columns, ids, cut)
        self._complete = torch.cat([self._complete, done_ids])
        self._completed.add(done_ids.numpy())
        return done_ids.numel()

    def _refuse_completed_ids(self, ids: Tensor, ends: Tensor) -> None:
        """Refuse steps for an id that completed before (in an earlier batch, or at an earlier
        step of this one). ``ids``/``ends``: the real steps, flat (env-major)."""
        if ids.numel() == 0:
            return
        # numpy, not torch: each torch call costs microseconds even on a few hundred ids.
        v, e = ids.numpy(), ends.numpy()
        same_as_next = v[1:] == v[:-1]
        after_end = e[:-1] & same_as_next  # the step after an end has the same id
        if after_end.any():
            self._raise_after_end(v[:-1][after_end])
        # One entry per run of equal ids: a collector batch has one run per env row and episode.
        run_first = np.flatnonzero(np.concatenate([[True], ~same_as_next]))
        run_ids = v[run_first]
        if self._completed.intersects(run_ids):
            seen = self._completed.contains(run_ids)
            raise LayoutError(
                f"key {fmt_key(self.trajectory_key)}: steps for trajectory id(s) "
                f"{_preview(np.unique(run_ids[seen]))} that already completed in an earlier "
                "batch (ids are never reused; was a batch ingested twice?)"
            )
        if len(set(run_ids.tolist())) == run_ids.size:
            return  # every id is one run: checked above
        # An id in several runs (ids repeating non-adjacently): no run may follow its end.
        end_pos = np.flatnonzero(e)
        end_ids = v[end_pos]
        unique_end_ids, end_count = np.unique(end_ids, return_counts=True)
        if (end_count > 1).any():
            self._raise_after_end(unique_end_ids[end_count > 1])
        rank = _rank_in(torch.from_numpy(run_ids), torch.from_numpy(end_ids)).numpy()
        ends_here = rank >= 0
        late = run_first[ends_here] > end_pos[rank[ends_here]]
        if late.any():
            self._raise_after_end(run_ids[ends_here][late])

    def _raise_after_end(self, ids: np.ndarray) -> None:
        raise LayoutError(
            f"key {fmt_key(self.trajectory_key)}: trajectory id(s) {_preview(np.unique(ids))} have "
            "steps after the step that ends them (ids are never reused)"
        )

    def _read_batch(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, Tensor, Steps]:
        """Ids, end flags (episode ends that are not cuts) and cut flags, all ``[N]``."""
        if not isinstance(batch, TensorDictBase):
            raise TypeError(f"ingest expects a TensorDict, got {type(batch).__name__}")
        if batch.ndim not in (1, 2):
            raise LayoutError(
                f"ingest expects a [T] or [B, T] batch, got batch shape {list(batch.batch_size)}"
            )
        steps = flatten_steps(
            batch,
            ids_key=self.trajectory_key,
            mask_key=self.mask_key,
            context="a TrajectoryAssembler batch",
        )
        if steps.ids is None:
            raise LayoutError(
                f"missing key {fmt_key(self.trajectory_key)}: trajectory ids are required"
            )
        ends = torch.zeros(steps.n, dtype=torch.bool)
        found = False
        for key in (self.done_key, self.terminated_key, self.truncated_key):
            flag = steps.flag(key)
            if flag is not None:
                found = True
                ends |= flag
        if not found:
            raise LayoutError(
                f"missing key {fmt_key(self.done_key)}: an end-of-episode flag (done, "
                "terminated or truncated) is required"
            )
        cut = steps.flag(self.cut_key)
        if cut is None:
            cut = torch.zeros(steps.n, dtype=torch.bool)
        return steps.ids, ends & ~cut, cut, steps

    def _check_schema(self, columns: dict[Key, Tensor]) -> None:
        schema = {key: (x.dtype, x.shape[1:]) for key, x in columns.items()}
        if self._schema is None:
            self._schema = schema
            return
        if schema == self._schema:
            return
        missing = sorted(set(self._schema) - set(schema))
        extra = sorted(set(schema) - set(self._schema))
        if missing or extra:
            raise LayoutError(
                "batch keys differ from earlier batches: missing "
                f"[{', '.join(map(fmt_key, missing))}], unexpected "
                f"[{', '.join(map(fmt_key, extra))}]"
            )
        for key, (dtype, feature) in schema.items():
            want_dtype, want_feature = self._schema[key]
            if (dtype, feature) != (want_dtype, want_feature):
                raise LayoutError(
                    f"key {fmt_key(key)}: expected dtype {want_dtype} and per-step shape "
                    f"{list(want_feature)} as in earlier batches, got dtype {dtype} and "
                    f"per-step shape {list(feature)}"
                )

    def _append(self, columns: dict[Key, Tensor], ids: Tensor, cut: Tensor) -> None:
        n = ids.numel()
        self._reserve(n, columns)
        assert self._pool is not None
        lo, hi = self._size, self._size + n
        for key, x in columns.items():
            self._pool[key][lo:hi].copy_(x)
        if bool(cut.any()):
            # Stitching: what the collector marked at a cut (TorchRL's set_truncated) is not
            # an episode end, so it must not survive inside the assembled episode.
            at_cut = cut.nonzero().squeeze(1) + lo
            for key in (self.done_key, self.truncated_key):
                if key in self._pool:
                    self._pool[key][at_cut] = False
        self._pool[self.cut_key][lo:hi] = False
        self._ids[lo:hi] = ids
        self._alive[lo:hi] = True
        self._size = hi

    def _reserve(self, n: int, like: dict[Key, Tensor]) -> None:
        capacity = self._ids.numel()
        if self._size + n <= capacity:
            return
        if self._n_dead:
            self._compact()
            if self._size + n <= capacity:
                return
        new_capacity = max(2 * capacity, self._size + n, 64)
        if self._pool is None:
            template = dict(like)
            template[self.cut_key] = torch.zeros(0, dtype=torch.bool, device=self._device)
        else:
            template = self._pool
        pool = {key: x.new_empty((new_capacity, *x.shape[1:])) for key, x in template.items()}
        ids = torch.empty(new_capacity, dtype=torch.int64)
        alive = torch.zeros(new_capacity, dtype=torch.bool)
        if self._pool is not None and self._size:
            for key, x in self._pool.items():
                pool[key][: self._size] = x[: self._size]
            ids[: self._size] = self._ids[: self._size]
            alive[: self._size] = self._alive[: self._size]
        self._pool, self._ids, self._alive = pool, ids, alive

    def _compact(self) -> None:
        assert self._pool is not None
        keep = self._alive[: self._size].nonzero().squeeze(1)
        k = keep.numel()
        for leaf in self._pool.values():
            leaf[:k] = take_rows(leaf, keep)
        self._ids[:k] = self._ids[keep]
        self._alive[:k] = True
        self._alive[k : self._size] = False
        self._size, self._n_dead = k, 0

    # ------------------------------------------------------------------- emit
    def emit(self, n: int | None = None, traj_format: TrajFormat = "padded") -> TensorDict:
        """Remove and return ``n`` complete episodes (all of them when ``n`` is None).

        Args:
            n: how many episodes; at most ``len(self)``.
            traj_format: ``"padded"`` gives ``[n, max_len]`` with a mask (ids padded with
                ``-1``, everything else with zeros); ``"cat"`` gives ``[sum of lengths]``.

        Raises:
            ValueError: ``n`` larger than the number of complete episodes, or an unknown
                ``traj_format``. Nothing is removed in that case.
        """
        _check_format(traj_format)
        available = len(self)
        n = available if n is None else n
        if not 0 <= n <= available:
            raise ValueError(
                f"emit(n={n}): {available} complete episode(s) are buffered; ask for at most "
                f"{available} or ingest more batches"
            )
        chosen, self._complete = self._complete[:n], self._complete[n:]
        row_of_step = _rank_in(self._ids[: self._size], chosen)
        return self._remove(row_of_step, n, traj_format, cut_from=n)

    def flush(self, traj_format: TrajFormat = "padded") -> TensorDict | None:
        """Remove and return the episodes still in flight, or None if there are none.

        Rows are in order of each episode's first step. Every returned episode is incomplete:
        its last step has ``("collector", "cut") = True`` and no done flag from the
        environment. Complete episodes stay buffered for :meth:`emit`.
        """
        _check_format(traj_format)
        row_of_step, n_rows = self._in_flight_rows(first_row=0)
        if n_rows == 0:
            return None
        return self._remove(row_of_step, n_rows, traj_format, cut_from=0)

    def drain(
        self, traj_format: TrajFormat = "padded", *, drop_incomplete: bool = False
    ) -> Drained:
        """End of a run: remove everything, in one batch: the complete episodes (in completion
        order) then, unless ``drop_incomplete``, the in-flight ones marked cut (as
        :meth:`flush`). Dropped episodes and their steps are counted in the result.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> asm = TrajectoryAssembler()
            >>> _ = asm.ingest(TensorDict({
            ...     ("collector", "traj_ids"): torch.tensor([4, 4, 5]),
            ...     ("next", "done"): torch.tensor([[False], [True], [False]]),
            ... }, [3]))
            >>> drained = asm.drain("cat")
            >>> drained.batch["collector", "traj_ids"], drained.batch["collector", "cut"]
            (tensor([4, 4, 5]), tensor([False, False,  True]))
            >>> asm.drain().batch is None  # nothing left
            True
        """
        _check_format(traj_format)
        n_complete = len(self)
        row_of_step = _rank_in(self._ids[: self._size], self._complete)
        flight_rows, n_flight = self._in_flight_rows(first_row=n_complete)
        dropped_trajs = dropped_frames = 0
        if drop_incomplete:
            dropped = flight_rows >= 0
            dropped_trajs, dropped_frames = n_flight, int(dropped.sum())
            self._alive[: self._size] &= ~dropped
            self._n_dead += dropped_frames
            n_flight = 0
        else:
            row_of_step = torch.maximum(row_of_step, flight_rows)
        self._complete = self._complete[:0]
        n_rows = n_complete + n_flight
        batch = (
            self._remove(row_of_step, n_rows, traj_format, cut_from=n_complete) if n_rows else None
        )
        return Drained(batch, dropped_trajs, dropped_frames)

    def _in_flight_rows(self, first_row: int) -> tuple[Tensor, int]:
        """Per pool row: ``first_row + k`` for a step of the ``k``-th episode in flight (in order
        of first step), else -1; and the number of episodes in flight."""
        rows = torch.full((self._size,), -1, dtype=torch.int64)
        steps = self._in_flight_mask().nonzero().squeeze(1)
        if steps.numel() == 0:
            return rows, 0
        index = index_by_id(self._ids[steps])
        rows[steps] = index.row + first_row
        return rows, index.n_rows

    def _remove(
        self, row_of_step: Tensor, n_rows: int, traj_format: TrajFormat, *, cut_from: int
    ) -> TensorDict:
        """Take the live steps with ``row_of_step >= 0`` out of the pool, as ``n_rows`` rows;
        rows ``>= cut_from`` get the cut mark on their last step."""
        steps = (self._alive[: self._size] & (row_of_step >= 0)).nonzero().squeeze(1)
        index = index_by_row(row_of_step[steps], n_rows)
        if self._pool is None:
            return TensorDict({}, batch_size=[0, 0] if traj_format == "padded" else [0])
        if traj_format == "cat":
            steps = steps[index.cat_order()]  # trajectory after trajectory
        flat = {key: take_rows(x, steps) for key, x in self._pool.items()}
        if cut_from < n_rows:
            if traj_format == "cat":
                last = index.offsets()[1:][cut_from:] - 1
            else:
                last = (index.pos == index.lengths[index.row] - 1) & (index.row >= cut_from)
            flat[self.cut_key][last] = True
        self._alive[steps] = False
        self._n_dead += steps.numel()
        if self._n_dead * 2 > self._size:
            self._compact()
        if traj_format == "cat":
            return TensorDict(flat, batch_size=[steps.numel()], device=self._device)
        return to_padded(
            flat,
            index,
            ids_key=self.trajectory_key,
            mask_key=self.mask_key,
            device=self._device,
        )


@dataclass(frozen=True)
class Drained:
    """What :meth:`TrajectoryAssembler.drain` returns.

    Args:
        batch: the remaining episodes (complete first, then in flight marked cut), or None.
        dropped_trajs: episodes in flight dropped (``drop_incomplete=True``).
        dropped_frames: the steps of those episodes.
    """

    batch: TensorDict | None
    dropped_trajs: int
    dropped_frames: int


def _isin(values: Tensor, test: Tensor) -> Tensor:
    """``torch.isin`` for CPU int64 tensors."""
    return _rank_in(values, test) >= 0


def _rank_in(values: Tensor, test: Tensor) -> Tensor:
    """For each value, its position in ``test`` (distinct ids), or -1 if it is not there.

    A collector hands out ids from a counter, so the ids in flight span a narrow range: a dense
    lookup table then costs one gather. Otherwise numpy's sort-based search (torch's
    ``isin``/``searchsorted`` go through the intra-op thread pool even for a few elements,
    which costs milliseconds on a busy machine).
    """
    if values.numel() == 0 or test.numel() == 0:
        return torch.full(values.shape, -1, dtype=torch.int64)
    v, t = values.numpy(), test.numpy()
    low = min(int(v.min()), int(t.min()))
    span = max(int(v.max()), int(t.max())) - low + 1
    if span <= 4 * (v.size + t.size) + 1024:
        table = np.full(span, -1, dtype=np.int64)
        table[t - low] = np.arange(t.size)
        return torch.from_numpy(table[v - low])
    order = np.argsort(t, kind="stable")
    where = np.searchsorted(t, v, sorter=order).clip(max=t.size - 1)
    found = t[order[where]] == v
    return torch.from_numpy(np.where(found, order[where], -1))


def _preview(ids: np.ndarray, limit: int = 5) -> str:
    """``[3, 4, 9]``, or ``[3, 4, 9, 11, 12, ...] (8 ids)`` for long lists."""
    shown = ", ".join(str(i) for i in ids[:limit].tolist())
    return f"[{shown}]" if ids.size <= limit else f"[{shown}, ...] ({ids.size} ids)"


def _check_format(traj_format: str) -> None:
    if traj_format not in TRAJ_FORMATS:
        raise ValueError(f"traj_format must be one of {TRAJ_FORMATS}, got {traj_format!r}")
