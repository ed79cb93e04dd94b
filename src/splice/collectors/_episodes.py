"""Episode bookkeeping of the rollout loop: the ``max_frames_per_traj`` time limit, the
returns and lengths of the episodes that end in each batch (carried across batches), and the
per-batch labels of a finished batch (``done``, trajectory ids, the cut mark)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from splice.collectors._settings import positive_int
from splice.collectors.ids import TrajectoryIds
from splice.envs import EnvAdapter
from splice.layout import CUT, DONE, IS_INIT, REWARD, TERMINATED, TRAJ_IDS, TRUNCATED, Key

__all__ = ["BatchLabeller", "EpisodeStats", "EpisodeTracker", "TimeLimit"]


@dataclass
class EpisodeStats:
    """Episodes that ended (by the env or ``max_frames_per_traj``) in the last batch.

    Args:
        returns: undiscounted return of each episode (float64).
        lengths: number of steps of each episode.
    """

    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class EpisodeTracker:
    """Sums rewards and counts steps per env row, vectorized per ``[B, T]`` batch; the part of
    an episode in an earlier batch is carried over.

    Args:
        num_envs: ``B``.

    Examples:
        >>> import numpy as np
        >>> tracker = EpisodeTracker(num_envs=1)
        >>> reward = np.ones((1, 4))
        >>> is_init = np.array([[True, False, False, True]])
        >>> ended = np.array([[False, False, True, False]])
        >>> tracker.update(reward, is_init, ended).lengths
        array([3])
        >>> ended = np.array([[False, True, False, False]])  # next batch: it ends at t = 1
        >>> tracker.update(reward, np.zeros((1, 4), bool), ended).lengths
        array([3])
    """

    def __init__(self, num_envs: int) -> None:
        self._carry_return = np.zeros(num_envs, np.float64)
        self._carry_length = np.zeros(num_envs, np.int64)

    def update(self, reward: np.ndarray, is_init: np.ndarray, ended: np.ndarray) -> EpisodeStats:
        """The episodes that end in a ``[B, T]`` batch (``ended`` True on their last step)."""
        steps = reward.shape[1]
        start = np.where(is_init, np.arange(steps)[None, :], -1)  # latest start, or -1
        np.maximum.accumulate(start, axis=1, out=start)
        csum = np.cumsum(reward, axis=1, dtype=np.float64)
        before = np.where(
            start > 0, np.take_along_axis(csum, np.maximum(start - 1, 0), axis=1), 0.0
        )
        seg_return = csum - before
        seg_length = np.arange(1, steps + 1)[None, :] - np.maximum(start, 0)
        continuing = start < 0
        seg_return = seg_return + np.where(continuing, self._carry_return[:, None], 0.0)
        seg_length = seg_length + np.where(continuing, self._carry_length[:, None], 0)
        last_open = ~ended[:, -1]
        self._carry_return = np.where(last_open, seg_return[:, -1], 0.0)
        self._carry_length = np.where(last_open, seg_length[:, -1], 0)
        return EpisodeStats(returns=seg_return[ended], lengths=seg_length[ended])


class BatchLabeller:
    """Labels each finished ``[B, T]`` batch with what is computed once per batch rather than
    per step: ``done``, the trajectory ids, the cut mark (and ``set_truncated``), and the
    returns and lengths of the episodes that end in it.

    It owns the episode in flight in each env row from one batch to the next: its id (the
    steps of a row before its first ``is_init`` continue it) and, through an
    :class:`EpisodeTracker`, its return and length so far. Nothing needs resetting when every
    env is reset: the next batch then starts with ``is_init`` in every row, so nothing carried
    over is read.

    Args:
        num_envs: ``B``.
        ids: where fresh trajectory ids come from.
        set_truncated: also set ``truncated`` and ``done`` on the cut last step of each row
            (TorchRL's ``set_truncated``); the cut mark stays True there.
        track_episodes: compute the returns and lengths of the episodes that end.

    Examples:
        >>> import numpy as np
        >>> from splice.layout import CUT, DONE, IS_INIT, REWARD, TERMINATED, TRAJ_IDS, TRUNCATED
        >>> labeller = BatchLabeller(1, TrajectoryIds(worker_id=0), track_episodes=True)
        >>> def batch(is_init, terminated):
        ...     columns = {(IS_INIT,): np.array([is_init]), TERMINATED: np.array([terminated])}
        ...     columns[TRUNCATED] = np.zeros((1, 4), bool)
        ...     columns[REWARD] = np.ones((1, 4), np.float32)
        ...     for key, dtype in ((DONE, bool), (TRAJ_IDS, np.int64), (CUT, bool)):
        ...         columns[key] = np.empty((1, 4), dtype)  # written by label()
        ...     return columns
        >>> first = batch([True, False, False, True], [False, False, True, False])
        >>> labeller.label(first).lengths
        array([3])
        >>> first[TRAJ_IDS], first[CUT]
        (array([[0, 0, 0, 1]]), array([[False, False, False,  True]]))
        >>> second = batch([False, False, False, False], [False, True, False, False])
        >>> labeller.label(second).lengths  # episode 1 goes on, ends at t = 1
        array([3])
        >>> second[TRAJ_IDS]
        array([[1, 1, 1, 1]])
    """

    def __init__(
        self,
        num_envs: int,
        ids: TrajectoryIds,
        *,
        set_truncated: bool = False,
        track_episodes: bool = False,
    ) -> None:
        self.ids = ids
        self.set_truncated = set_truncated
        self.track_episodes = track_episodes
        self._row_ids = np.full(num_envs, -1, np.int64)  # the id each row's steps continue
        self._tracker = EpisodeTracker(num_envs)

    def label(self, columns: dict[Key, np.ndarray]) -> EpisodeStats:
        """Write ``done``, the ids and the cut mark into a batch's ``[B, T]`` columns (their
        arrays must exist); with ``set_truncated``, also its last steps' ``truncated`` and
        ``done``.

        Returns:
            The episodes that ended in the batch (empty without ``track_episodes``).
        """
        is_init, truncated = columns[(IS_INIT,)], columns[TRUNCATED]
        done = np.bitwise_or(columns[TERMINATED], truncated, out=columns[DONE])
        traj_ids = self.ids.label(is_init, self._row_ids, out=columns[TRAJ_IDS])
        self._row_ids = traj_ids[:, -1].copy()
        cut = columns[CUT]
        cut[:, :-1] = False
        np.logical_not(done[:, -1], out=cut[:, -1])  # the episode goes on, same id
        if self.set_truncated:
            truncated[:, -1] |= cut[:, -1]
            done |= cut
        if not self.track_episodes:
            return EpisodeStats()
        return self._tracker.update(columns[REWARD], is_init, done & ~cut)


class TimeLimit:
    """Ends every episode after ``max_len`` steps (``max_frames_per_traj``): the step gets
    ``truncated=True`` (unless the env ended the episode there itself) and the env is reset.

    Args:
        adapter: the env adapter (must support partial resets).
        max_len: the episode length limit.

    Raises:
        ValueError: ``max_len`` is not a positive int, or the env cannot reset some of its envs.

    Examples:
        >>> import gymnasium as gym, numpy as np
        >>> from splice.envs import make_adapter
        >>> adapter = make_adapter(gym.make("CartPole-v1"))
        >>> limit = TimeLimit(adapter, max_len=1)
        >>> limit.count(np.ones(1, bool))  # a first step: the count restarts at 1
        >>> trunc, term = np.zeros((1, 1), bool), np.zeros((1, 1), bool)
        >>> adapter.reset(seed=0)
        >>> limit.apply(None, 0, term[:, 0], trunc[:, 0])
        array([ True])
        >>> bool(trunc[0, 0])
        True
    """

    def __init__(self, adapter: EnvAdapter, max_len: int) -> None:
        positive_int("max_frames_per_traj", max_len)
        if not adapter.supports_partial_reset:
            raise ValueError(
                f"max_frames_per_traj needs an env that can reset a subset of its envs; "
                f"{type(adapter.env).__name__} (autoreset mode {adapter.autoreset_mode}) "
                "cannot. Use the env's own time limit (e.g. max_episode_steps=...) instead"
            )
        self.adapter = adapter
        self.max_len = max_len
        self._length = np.zeros(adapter.num_envs, np.int64)

    def count(self, init: np.ndarray | None) -> None:
        """One more step for every env (``init``: the envs whose episode starts with it; their
        count restarts, so a reset of every env needs nothing else than an all-True ``init``)."""
        if init is not None:
            self._length[init] = 0
        self._length += 1

    def apply(
        self, restarted: np.ndarray | None, c: int, term_col: np.ndarray, trunc_col: np.ndarray
    ) -> np.ndarray | None:
        """After the step at column ``c``: truncate and reset the envs at the limit; return the
        envs that restart (``restarted`` plus those)."""
        hit = self._length >= self.max_len
        if not np.count_nonzero(hit):
            return restarted
        hit &= ~(term_col[c] | trunc_col[c])  # the env ended it already
        if restarted is not None:
            hit &= ~restarted
        if not np.count_nonzero(hit):
            return restarted
        if self.adapter.batched:
            trunc_col[c][hit] = True
        else:
            trunc_col[c] = True
        self.adapter.reset_envs(hit)
        return hit if restarted is None else (restarted | hit)
