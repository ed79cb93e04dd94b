"""Episode bookkeeping of the rollout loop: the ``max_frames_per_traj`` time limit, and the
returns and lengths of the episodes that end in each batch (carried across batches)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from splice.collectors._settings import positive_int
from splice.envs import EnvAdapter

__all__ = ["EpisodeStats", "EpisodeTracker", "TimeLimit"]


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

    def reset(self) -> None:
        """Forget the episodes in flight."""
        self._carry_return[:] = 0
        self._carry_length[:] = 0

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

    def reset(self) -> None:
        """Every env starts a new episode."""
        self._length[:] = 0

    def count(self, init: np.ndarray | None) -> None:
        """One more step for every env (``init``: the envs whose episode starts with it)."""
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
