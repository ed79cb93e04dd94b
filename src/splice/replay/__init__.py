"""Replay: storages, the trajectory-aware ``ReplayBuffer`` and its samplers.

Names follow TorchRL so that code ports by changing imports:

* storages :class:`~splice.LazyTensorStorage` (memory) and
  :class:`~splice.LazyMemmapStorage` (files, crash safe);
* :class:`~splice.ReplayBuffer` — ``extend`` any collector layout (or plain tensors and dicts),
  ``sample``, in-place access by row and key, ``state_dict``, ``dumps``/``loads``;
* :class:`~splice.RayReplayBuffer` — the same buffer served by a Ray actor, extended by
  collectors on any node and sampled by the learner (Ray is imported when one is created);
* samplers :class:`~splice.RandomSampler`, :class:`~splice.SamplerWithoutReplacement`,
  :class:`~splice.PrioritizedSampler`, :class:`~splice.SliceSampler`,
  :class:`~splice.SliceSamplerWithoutReplacement`, :class:`~splice.PrioritizedSliceSampler`,
  and the contract to write one: :class:`Sampler` (hooks and call order), :class:`Draw`,
  :class:`SliceMarks`, :class:`SamplerState`;
* :class:`ReplayIndex` and :class:`WriteReport` — the incremental trajectory index behind
  O(batch) slice sampling, which samplers read.

Output keys added to samples: ``"index"``, ``"priority_weight"``, ``("collector", "mask")``
and :data:`~splice.replay.BURN_IN` (``("collector", "burn_in")``).
"""

from splice.replay._output import BURN_IN
from splice.replay.buffer import ReplayBuffer
from splice.replay.index import ReplayIndex, WriteReport
from splice.replay.memmap import LazyMemmapStorage
from splice.replay.ray_buffer import RayReplayBuffer
from splice.replay.samplers import (
    Draw,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SamplerState,
    SamplerWithoutReplacement,
    SliceMarks,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.replay.storage import LazyTensorStorage, Storage

__all__ = [
    "BURN_IN",
    "Draw",
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "RayReplayBuffer",
    "ReplayBuffer",
    "ReplayIndex",
    "Sampler",
    "SamplerState",
    "SamplerWithoutReplacement",
    "SliceMarks",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "Storage",
    "WriteReport",
]
