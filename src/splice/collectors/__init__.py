"""Collectors: a policy stepping environments, batches out.

* :class:`~splice.Collector` — one process; iterate for batches, or
  :meth:`~splice.Collector.start` to fill a replay buffer from a background thread;
* :class:`~splice.MultiSyncCollector`, :class:`~splice.MultiAsyncCollector` — several worker
  processes (one batch made of every worker's part, or the first batch ready), same front end;
* :class:`RolloutLoop` — the reusable single-process collection loop behind every collector,
  with its options in one :class:`LoopOptions`;
* :class:`~splice.TrajectoryIds` — the id spaces that keep trajectory ids unique across collectors.
"""

from splice.collectors._episodes import EpisodeStats
from splice.collectors._settings import LoopOptions
from splice.collectors._worker import WorkerError
from splice.collectors.background import BackgroundRunner, StopCollection
from splice.collectors.collector import Collector
from splice.collectors.ids import TrajectoryIds
from splice.collectors.multi import MultiAsyncCollector, MultiSyncCollector
from splice.collectors.rollout import RolloutLoop

__all__ = [
    "BackgroundRunner",
    "Collector",
    "EpisodeStats",
    "LoopOptions",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "RolloutLoop",
    "StopCollection",
    "TrajectoryIds",
    "WorkerError",
]
