"""Small TensorDict helpers for the trajectory ops: leaf iteration and key resolution."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice.layout import Key, as_key_tuple, tensor_leaves


def leaves(td: TensorDictBase) -> Iterator[tuple[Key, Tensor]]:
    """Every tensor leaf of ``td`` with its key as a tuple; non-tensor leaves raise."""
    return tensor_leaves(td, context="a trajectory operation's input")


def map_leaves(
    td: TensorDictBase,
    fn: Callable[[Key, Tensor], Tensor],
    batch_size: list[int] | torch.Size,
) -> TensorDict:
    """A new TensorDict with ``fn(key, leaf)`` for every leaf and the given batch size."""
    return TensorDict(
        {key: fn(key, value) for key, value in leaves(td)},
        batch_size=batch_size,
        device=td.device,
    )


def replace_last(key: NestedKey, last: str) -> Key:
    """``("collector", "traj_ids")`` -> ``("collector", last)``."""
    return (*as_key_tuple(key)[:-1], last)


def resolve_trajectory_keys(
    td: TensorDictBase, trajectory_key: NestedKey | None, prefix: NestedKey | None
) -> tuple[Key, Key]:
    """The (ids key, mask key) pair, resolved exactly as TorchRL's ``split_trajectories`` does.

    ``trajectory_key`` wins; otherwise ``prefix`` (default ``"collector"`` when the input has a
    ``"collector"`` entry, else none) gives ``(prefix, "traj_ids")`` and ``(prefix, "mask")``.
    """
    if trajectory_key is not None:
        return as_key_tuple(trajectory_key), replace_last(trajectory_key, "mask")
    if prefix is None and "collector" in td:
        prefix = "collector"
    if prefix is None:
        return ("traj_ids",), ("mask",)
    return (*as_key_tuple(prefix), "traj_ids"), (*as_key_tuple(prefix), "mask")
