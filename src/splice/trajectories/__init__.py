"""Trajectory operations: pure tensor code, no environments.

* :func:`~splice.split_trajectories` — steps to one row per trajectory (padded + mask, or nested);
* :func:`~splice.cat_trajectories` — its inverse, the flat "cat" layout;
* :class:`~splice.TrajectoryAssembler` — streaming: collector chunks in, complete episodes out.
"""

from splice.trajectories.assembler import TrajectoryAssembler
from splice.trajectories.split import cat_trajectories, split_trajectories

__all__ = ["TrajectoryAssembler", "cat_trajectories", "split_trajectories"]
