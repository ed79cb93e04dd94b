"""Whole episodes straight out of the rollout loop's staging (``trajs_per_batch``).

A :class:`~splice.Collector` with ``trajs_per_batch`` does not copy its batches out and feed
them to a :class:`~splice.TrajectoryAssembler` (which copies every step into its pool and
out again in episode order). :class:`StagedEpisodes` keeps the steps where the loop wrote
them: an episode is one *run* of consecutive staging columns of one env row (an episode
never holds a dead step, and staging columns are never reordered), so the store only
records ``(row, first column, length, id)`` per episode, and emitting ``n`` episodes in
the "cat" layout is one gather of whole runs per key (:func:`~splice.collectors._staging.
runs_flat`). Staging keeps every column from the oldest step still needed
(:attr:`Staging.keep`).

The episodes, their order and their marks are exactly what a ``TrajectoryAssembler`` fed
with the loop's plain batches gives (tested side by side): a batch is still the first ``T``
valid steps of every row, episodes complete in order of (batch, time step, env row), the
ids are the plain batches' ids, in-flight episodes are flushed at the end in order of
their first step with the cut mark on their last step, and ``set_truncated`` marks never
reach an episode.

Examples:
    >>> import gymnasium as gym
    >>> from splice.collectors.ids import TrajectoryIds
    >>> from splice.envs import make_adapter
    >>> env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    >>> loop = WholeEpisodeLoop(make_adapter(env), None, steps=50, ids=TrajectoryIds(), seed=0)
    >>> loop.collect_episodes()
    200
    >>> store = loop.episodes_store
    >>> n = len(store)
    >>> cat = store.emit(n, "cat")
    >>> bool(cat["next", "done"].sum() == n), len(store)
    (True, 0)
    >>> loop.close()
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from splice._gather import stable_order
from splice.collectors._episodes import EpisodeStats
from splice.collectors._staging import (
    BATCH_KEYS,
    FLAG_KEYS,
    Span,
    Staging,
    nested_tensordict,
    runs_flat,
)
from splice.collectors.ids import TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.layout import (
    CUT,
    DONE,
    IS_INIT,
    MASK,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
    TrajFormat,
    check_traj_format,
)
from splice.trajectories._index import TrajectoryIndex
from splice.trajectories.assembler import Drained, emit_count
from splice.trajectories.split import to_padded

__all__ = ["StagedEpisodes", "WholeEpisodeLoop"]


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


Key = tuple[str, ...]


@dataclass(frozen=True)
class _Runs:
    """Episodes (or fragments) as runs of staging columns: parallel int64 arrays, one entry
    per episode.

    ``first`` is a *logical* column (``physical + Staging.base``), so it stays valid when
    staging moves its columns; ``batch`` is the index of the batch holding the first step.
    """

    row: np.ndarray = field(default_factory=_empty)
    first: np.ndarray = field(default_factory=_empty)
    length: np.ndarray = field(default_factory=_empty)
    id: np.ndarray = field(default_factory=_empty)
    batch: np.ndarray = field(default_factory=_empty)

    def __len__(self) -> int:
        return int(self.row.size)

    def select(self, which: Any) -> _Runs:
        return _Runs(*(getattr(self, f.name)[which] for f in fields(self)))

    def concat(self, other: _Runs) -> _Runs:
        return _Runs(
            *(np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self))
        )


class StagedEpisodes:
    """The complete and in-flight episodes of one :class:`~splice.collectors.RolloutLoop`,
    held in its staging (see the module docstring). The loop calls :meth:`add_batch` for
    every batch; the collector front end calls :meth:`emit` and :meth:`drain` (the same
    interface as :class:`~splice.TrajectoryAssembler`).

    Args:
        staging: the loop's staging.
        ids: where fresh trajectory ids come from.
        device: where emitted episodes go (``None``: CPU).
    """

    def __init__(
        self, staging: Staging, ids: TrajectoryIds, device: torch.device | None = None
    ) -> None:
        self.staging = staging
        self.ids = ids
        self.device = device
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every episode (the loop starts over with new episodes)."""
        b = self.staging.num_envs
        self._complete = _Runs()  # in completion order
        self._flight_id = np.full(b, -1, np.int64)  # per row, -1: nothing in flight
        self._flight_first = np.zeros(b, np.int64)
        self._flight_batch = np.zeros(b, np.int64)
        self._orphans = _Runs()  # in flight when the loop restarted (they never complete)
        self._stop = np.zeros(b, np.int64)  # logical column after each row's delivered steps
        self._batches = 0
        #: True once everything was drained: the loop must restart before adding batches.
        self.drained = False
        self.staging.keep = None

    def restart(self) -> None:
        """The loop restarts its envs: the episodes in flight never continue (they are
        flushed at the end, marked cut, like any episode still in flight)."""
        self._orphans = self._in_flight()
        self._flight_id[:] = -1
        self._keep()

    def _in_flight(self) -> _Runs:
        """Every incomplete episode: those orphaned by a restart, then the rows' episodes in
        flight (so far)."""
        rows = np.flatnonzero(self._flight_id >= 0)
        if rows.size == 0:
            return self._orphans
        first = self._flight_first[rows]
        flight = _Runs(
            rows, first, self._stop[rows] - first, self._flight_id[rows], self._flight_batch[rows]
        )
        return self._orphans.concat(flight)

    def __len__(self) -> int:
        """Complete episodes ready to :meth:`emit`."""
        return len(self._complete)

    @property
    def frames_buffered(self) -> int:
        """Steps held: complete episodes, and episodes in flight up to the last batch."""
        live = self._flight_id >= 0
        in_flight = int((self._stop[live] - self._flight_first[live]).sum())
        return int(self._complete.length.sum()) + in_flight + int(self._orphans.length.sum())

    def _keep(self) -> None:
        """Tell staging the oldest column still needed."""
        firsts = [self._complete.first, self._orphans.first]
        firsts.append(self._flight_first[self._flight_id >= 0])
        oldest = [int(f.min()) for f in firsts if f.size]
        self.staging.keep = min(oldest) if oldest else None

    # ----------------------------------------------------------------- batches
    def add_batch(self, span: Span, *, stats: bool = False) -> EpisodeStats:
        """Record the episodes that start and end in the batch ``span`` describes (before
        staging advances past it).

        Returns:
            The episodes that ended in it (returns and lengths, in order of env row then
            time, as :class:`~splice.collectors._episodes.EpisodeTracker`), if ``stats``.
        """
        st = self.staging
        b, base, steps = st.num_envs, st.base, st.steps
        # The batch's steps env-major (row b's T steps, then row b + 1's ...): a step's
        # position in it gives its row and time step, and sorts by row then time, so the
        # episode starts and ends are found without looking at staging's dead steps again.
        flat = span.flat(b)
        init = st.arrays[(IS_INIT,)].reshape(-1).take(flat)
        ended = st.arrays[TERMINATED].reshape(-1).take(flat)
        ended |= st.arrays[TRUNCATED].reshape(-1).take(flat)
        s_pos, e_pos = np.flatnonzero(init), np.flatnonzero(ended)
        s_row, s_t = np.divmod(s_pos, steps)
        e_row, e_t = np.divmod(e_pos, steps)
        s_col, e_col = flat[s_pos] // b, flat[e_pos] // b  # physical columns
        # Fresh ids in order of (time step, env row), as for the plain batches.
        issue = stable_order(s_t, steps)
        s_id = np.empty(s_row.size, np.int64)
        s_id[issue] = self.ids.take(s_row.size)
        # Each end closes the latest start before it in its row, or the episode in flight.
        match = np.searchsorted(s_pos, e_pos, side="right") - 1
        own = match >= 0
        own[own] = s_row[match[own]] == e_row[own]
        e_first, e_id = self._flight_first[e_row], self._flight_id[e_row]  # fresh arrays
        e_first[own] = s_col[match[own]] + base
        e_id[own] = s_id[match[own]]
        e_batch = np.where(own, self._batches, self._flight_batch[e_row])
        if (e_id < 0).any():
            raise RuntimeError("an episode ended whose start was never seen (restart the loop)")
        e_length = e_col + base - e_first + 1
        # Episodes complete in order of (time step, env row).
        order = stable_order(e_t, steps)
        done = _Runs(row=e_row, first=e_first, length=e_length, id=e_id, batch=e_batch)
        self._complete = self._complete.concat(done.select(order))
        # What is in flight now: the starts no end closed (the last start of their row).
        self._flight_id[e_row] = -1
        open_start = np.ones(s_row.size, np.bool_)
        open_start[match[own]] = False
        rows = s_row[open_start]
        self._flight_id[rows] = s_id[open_start]
        self._flight_first[rows] = s_col[open_start] + base
        self._flight_batch[rows] = self._batches
        self._stop = span.stop + base
        self._batches += 1
        self._keep()
        if not stats:
            return EpisodeStats()
        if not e_length.size:
            return EpisodeStats()
        reward = st.column(REWARD).reshape(-1)  # [C * B] (or [C] for one env)
        rewards = np.take(reward, runs_flat(e_row, e_first - base, e_length, b))
        offsets = np.cumsum(e_length) - e_length
        returns = np.add.reduceat(rewards.astype(np.float64), offsets)
        return EpisodeStats(returns=returns, lengths=e_length)

    # -------------------------------------------------------------------- output
    def emit(self, n: int | None = None, traj_format: TrajFormat = "padded") -> TensorDict:
        """Remove and return ``n`` complete episodes (all by default), oldest first.

        Raises:
            ValueError: more than :func:`len` episodes, or an unknown ``traj_format``.
        """
        check_traj_format(traj_format)
        n = emit_count(n, len(self))
        runs = self._complete.select(slice(0, n))
        self._complete = self._complete.select(slice(n, None))
        out = self._output(runs, traj_format, cut_from=n)
        self._keep()
        return out

    def drain(
        self, traj_format: TrajFormat = "padded", *, drop_incomplete: bool = False
    ) -> Drained:
        """End of a run: every complete episode, then (unless ``drop_incomplete``) the ones in
        flight, marked cut on their last step, in order of their first step. Afterwards the
        store is empty and the loop must restart (:attr:`drained`)."""
        check_traj_format(traj_format)
        flight = self._in_flight()
        flight = flight.select(np.lexsort((flight.row, flight.batch)))
        complete = self._complete
        dropped_trajs = dropped_frames = 0
        if drop_incomplete:
            dropped_trajs, dropped_frames = len(flight), int(flight.length.sum())
            flight = _Runs()
        runs = complete.concat(flight)
        batch = self._output(runs, traj_format, cut_from=len(complete)) if len(runs) else None
        self.reset()
        self.drained = True
        return Drained(batch, dropped_trajs, dropped_frames)

    def _output(self, runs: _Runs, traj_format: TrajFormat, *, cut_from: int) -> TensorDict:
        """One gather of the runs' steps per key, in the "cat" layout (or scattered into the
        padded one); runs from ``cut_from`` on get the cut mark on their last step."""
        st = self.staging
        n_steps = int(runs.length.sum())
        flat = runs_flat(runs.row, runs.first - st.base, runs.length, st.num_envs)
        columns = st.gather(flat, (n_steps,), extra=BATCH_KEYS)
        np.bitwise_or(columns[TERMINATED], columns[TRUNCATED], out=columns[DONE])
        columns[TRAJ_IDS][:] = np.repeat(runs.id, runs.length)
        cut = columns[CUT]
        cut[:] = False
        last = np.cumsum(runs.length) - 1
        cut[last[cut_from:]] = True
        if traj_format == "cat":
            out = nested_tensordict(columns, FLAG_KEYS, [n_steps])
        else:
            n = len(runs)
            row = np.repeat(np.arange(n), runs.length)
            pos = np.arange(n_steps) - (last + 1 - runs.length)[row]
            index = TrajectoryIndex(
                torch.from_numpy(row),
                torch.from_numpy(pos),
                torch.from_numpy(runs.length.copy()),
                int(runs.length.max()) if n else 0,
            )
            objects = {key: v for key, v in columns.items() if v.dtype == object}
            flat_td = nested_tensordict(columns, FLAG_KEYS, [n_steps])
            tensors = {key: flat_td.get(key) for key in columns if key not in objects}
            out = to_padded(tensors, index, ids_key=TRAJ_IDS, mask_key=MASK, objects=objects)
        if self.device is not None and self.device.type != "cpu":
            out = out.to(self.device)
        return out


class WholeEpisodeLoop(RolloutLoop):
    """A :class:`~splice.collectors.rollout.RolloutLoop` that keeps what it collects in
    staging as episodes (:attr:`episodes_store`, for ``trajs_per_batch``) instead of returning
    batches: call :meth:`collect_episodes`, then emit from the store. Takes the loop's
    arguments; the example is this module's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The episodes collected so far, kept in staging until emitted.
        self.episodes_store = StagedEpisodes(self.staging, self.ids, self.storing_device)

    def _clear_staging(self) -> None:
        store = self.episodes_store
        if len(store) or store.frames_buffered:
            store.restart()  # its episodes stay in staging until they are emitted
            self.staging.restart_rows()
        else:
            self.staging.clear()
            store.reset()

    def collect(self, *, random_actions: bool = False) -> TensorDict:
        raise RuntimeError("this loop collects whole episodes: call collect_episodes()")

    def collect_episodes(self, *, random_actions: bool = False) -> int:
        """Collect one batch into :attr:`episodes_store`: the same steps
        :meth:`~splice.collectors.rollout.RolloutLoop.collect` would return, kept in staging
        as episodes. An error starts the next call over, as ``collect`` does.

        Returns:
            The frames collected (``B * T``).
        """
        store = self.episodes_store
        if store.drained:
            self.restart()  # everything was handed out: start new episodes
        try:
            self._collect_steps(random_actions)
            span = self.staging.span()
            self.episodes = store.add_batch(span, stats=self.track_episodes)
            self.staging.advance(span)
        except BaseException:
            self.restart()
            raise
        return self.adapter.num_envs * self.steps
