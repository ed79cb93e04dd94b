"""splice: whole, correct reinforcement-learning trajectories from chunked collection.

Examples:
    >>> import splice
    >>> sorted(splice.__all__)[:3]
    ['LayoutError', 'TrajectoryAssembler', 'cat_trajectories']
"""

from splice import layout
from splice.layout import LayoutError, validate_batch
from splice.trajectories import TrajectoryAssembler, cat_trajectories, split_trajectories

__version__ = "0.1.0"

__all__ = [
    "LayoutError",
    "TrajectoryAssembler",
    "cat_trajectories",
    "layout",
    "split_trajectories",
    "validate_batch",
]
