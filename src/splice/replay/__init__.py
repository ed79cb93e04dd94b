"""Replay: storages, the trajectory-aware ``ReplayBuffer`` and its samplers.

Names follow TorchRL so that code ports by changing imports:

* storages :class:`~splice.LazyTensorStorage` (memory) and
  :class:`~splice.LazyMemmapStorage` (files, crash safe);
* :class:`~splice.ReplayBuffer` — ``extend`` any collector layout, ``sample``, ``dumps``/``loads``;
* samplers :class:`~splice.RandomSampler`, :class:`~splice.SliceSampler`,
  :class:`~splice.SliceSamplerWithoutReplacement`, :class:`~splice.PrioritizedSliceSampler`;
* :class:`ReplayIndex` — the incremental trajectory index behind O(batch) slice sampling.

Output keys added to samples: ``"index"``, ``"priority_weight"``, ``("collector", "mask")``
and :data:`~splice.replay.BURN_IN` (``("collector", "burn_in")``).
"""

from splice.replay._output import BURN_IN
from splice.replay.buffer import ReplayBuffer
from splice.replay.index import ReplayIndex
from splice.replay.samplers import (
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.replay.storage import LazyMemmapStorage, LazyTensorStorage, Storage

__all__ = [
    "BURN_IN",
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "ReplayBuffer",
    "ReplayIndex",
    "Sampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "Storage",
]
