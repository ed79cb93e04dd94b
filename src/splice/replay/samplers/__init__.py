"""Samplers: which stored steps (or slices of trajectories) a batch is made of.

:class:`Sampler` documents the contract a sampler implements (the hooks and their call
order); every sampler here is written against it alone.
"""

from splice.replay.samplers._base import Draw, Sampler, SamplerState, SliceMarks
from splice.replay.samplers.prioritized import PrioritizedSampler, PrioritizedSliceSampler
from splice.replay.samplers.slice import SliceSampler, SliceSamplerWithoutReplacement
from splice.replay.samplers.uniform import RandomSampler
from splice.replay.samplers.without_replacement import SamplerWithoutReplacement

__all__ = [
    "Draw",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "Sampler",
    "SamplerState",
    "SamplerWithoutReplacement",
    "SliceMarks",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
]
