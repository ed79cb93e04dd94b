"""splice: whole, correct reinforcement-learning trajectories from chunked collection.

Examples:
    >>> import splice
    >>> sorted(splice.__all__)[:3]
    ['Collector', 'EnvError', 'LayoutError']
"""

from splice import layout, targets
from splice.collectors import (
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
    TrajectoryIds,
    WorkerError,
)
from splice.envs import EnvError
from splice.layout import LayoutError, validate_batch
from splice.policies import PolicyError, RandomPolicy, as_policy
from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    RayReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.trajectories import (
    TrajectoryAssembler,
    attention_mask,
    cat_trajectories,
    split_trajectories,
)

__version__ = "0.1.0"

__all__ = [
    "Collector",
    "EnvError",
    "LayoutError",
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "PolicyError",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomPolicy",
    "RandomSampler",
    "RayReplayBuffer",
    "ReplayBuffer",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "TrajectoryAssembler",
    "TrajectoryIds",
    "WorkerError",
    "as_policy",
    "attention_mask",
    "cat_trajectories",
    "layout",
    "split_trajectories",
    "targets",
    "validate_batch",
]
