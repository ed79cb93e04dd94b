"""Trajectory operations: pure tensor code, no environments.

* :func:`~splice.split_trajectories` — steps to one row per trajectory (padded + mask, or nested);
* :func:`~splice.cat_trajectories` — its inverse, the flat "cat" layout;
* :class:`~splice.TrajectoryAssembler` — streaming: collector chunks in, complete episodes out;
* :func:`~splice.attention_mask` — causal attention within episodes, over a window of steps.
"""

from splice.trajectories.assembler import TrajectoryAssembler
from splice.trajectories.attention import attention_mask
from splice.trajectories.split import cat_trajectories, split_trajectories

__all__ = ["TrajectoryAssembler", "attention_mask", "cat_trajectories", "split_trajectories"]
