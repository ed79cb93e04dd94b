"""Collectors: a policy stepping environments, batches out.

* :class:`~splice.Collector` — one process; iterate for batches, or
  :meth:`~splice.Collector.start` to fill a replay buffer from a background thread;
* :class:`~splice.MultiSyncCollector`, :class:`~splice.MultiAsyncCollector` — several worker
  processes (one batch made of every worker's part, or the first batch ready), same front end;
* :class:`~splice.TrajectoryIds` — the id spaces that keep trajectory ids unique across collectors.
"""

from splice.collectors._worker import WorkerError
from splice.collectors.collector import Collector
from splice.collectors.ids import TrajectoryIds
from splice.collectors.multi import MultiAsyncCollector, MultiSyncCollector

__all__ = [
    "Collector",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "TrajectoryIds",
    "WorkerError",
]
