"""Samplers: which stored steps (or slices of trajectories) a batch is made of."""

from splice.replay.samplers._base import Draw, RandomSampler, Sampler
from splice.replay.samplers.prioritized import PrioritizedSliceSampler
from splice.replay.samplers.slice import SliceSampler, SliceSamplerWithoutReplacement

__all__ = [
    "Draw",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "Sampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
]
