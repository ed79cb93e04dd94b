"""Reading and checking the targets' inputs: the batch's flags and the value tensors.

Everything here is device-agnostic Python: it finds the entries and checks their dtypes and
shapes. Laying the tensors out as ``[rows, T]`` (time last) and the arithmetic are the
backends' (:mod:`splice.targets._backend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice.layout import (
    CUT,
    DONE,
    MASK,
    NEXT,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
    LayoutError,
)


@dataclass(frozen=True)
class TargetKeys:
    """Where the target functions read their inputs (TorchRL's names by default).

    Only ``reward`` and ``terminated`` are required, and at least one of ``done``,
    ``truncated`` and ``traj_ids`` (something must say where episodes end). ``value``,
    ``next_value``, ``state_action_value`` and ``sample_log_prob`` are read when the
    corresponding tensors are not passed. ``sample_log_prob`` is the behaviour policy's
    log-probability of each action, written by the policy that collected the data: TorchRL's
    ``ProbabilisticActor(return_log_prob=True)`` and ``ModulePolicy(output="sample")`` write
    ``"action_log_prob"``.

    Examples:
        >>> TargetKeys().next_value
        ('next', 'state_value')
        >>> TargetKeys(reward=("next", "intrinsic_reward")).reward
        ('next', 'intrinsic_reward')
        >>> TargetKeys().sample_log_prob
        'action_log_prob'
    """

    reward: NestedKey = REWARD
    terminated: NestedKey = TERMINATED
    truncated: NestedKey = TRUNCATED
    done: NestedKey = DONE
    cut: NestedKey = CUT
    traj_ids: NestedKey = TRAJ_IDS
    mask: NestedKey = MASK
    value: NestedKey = "state_value"
    next_value: NestedKey = (NEXT, "state_value")
    state_action_value: NestedKey = "state_action_value"
    sample_log_prob: NestedKey = "action_log_prob"


@dataclass(slots=True)
class Rows:
    """A batch reduced to what targets need: its reward and flags, checked.

    Each tensor is ``[*batch]`` or ``[*batch, 1]`` as stored; a backend lays them out as
    ``shape`` = ``[rows, T]`` (time last). ``done``, ``truncated``, ``cut``, ``traj_ids`` and
    ``mask`` are None when the batch does not have them.
    """

    reward: Tensor  # any dtype
    terminated: Tensor  # bool
    done: Tensor | None  # bool
    truncated: Tensor | None  # bool
    cut: Tensor | None  # bool
    traj_ids: Tensor | None  # int64
    mask: Tensor | None  # bool
    batch: torch.Size  # the batch size, to shape outputs
    shape: tuple[int, int]  # (rows, T)

    @property
    def device(self) -> torch.device:
        return self.reward.device

    def output(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """A ``[rows, T]`` result as ``[*batch, 1]`` in ``dtype``."""
        x = x.view(*self.batch, 1)
        return x if x.dtype == dtype else x.to(dtype)


def read(td: TensorDictBase, keys: TargetKeys) -> Rows:
    """Validate ``td`` and lay its reward and flags out as rows."""
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"td must be a TensorDict, got {type(td).__name__}")
    if not isinstance(keys, TargetKeys):
        raise TypeError(f"keys must be a TargetKeys, got {type(keys).__name__}")
    batch = td.batch_size
    if not batch:
        raise ValueError("td must have at least one batch dim (time is the last), got []")
    if any(s < 0 for s in batch):
        raise ValueError(
            f"td has a ragged batch size {list(batch)}: nested layouts are not supported, "
            "use split_trajectories(..., as_nested=False) (padded with a mask)"
        )
    reward = td.get(keys.reward, None)
    if reward is None:
        raise LayoutError(f"missing key {keys.reward!r} (the reward)")
    if not isinstance(reward, Tensor) or reward.is_nested:
        raise LayoutError(f"key {keys.reward!r}: expected a tensor, got {_describe(reward)}")
    terminated = _flag(td, keys.terminated, batch)
    if terminated is None:
        raise LayoutError(
            f"missing key {keys.terminated!r}: without it a time limit cannot be told "
            "from the end of the MDP"
        )
    done = _flag(td, keys.done, batch)
    truncated = _flag(td, keys.truncated, batch)
    ids = td.get(keys.traj_ids, None)
    if done is None and truncated is None and ids is None:
        raise LayoutError(
            f"the batch has none of {keys.done!r}, {keys.truncated!r} and "
            f"{keys.traj_ids!r}: nothing says where truncated episodes end"
        )
    if ids is not None:
        if not isinstance(ids, Tensor) or ids.dtype != torch.int64:
            raise LayoutError(f"key {keys.traj_ids!r}: expected int64, got {_describe(ids)}")
        _check_shape(ids, batch, f"key {keys.traj_ids!r}")
    _check_shape(reward, batch, f"key {keys.reward!r}")
    length = batch[-1]
    return Rows(
        reward=reward.detach(),
        terminated=terminated,
        done=done,
        truncated=truncated,
        cut=_flag(td, keys.cut, batch),
        traj_ids=ids,
        mask=_flag(td, keys.mask, batch),
        batch=batch,
        shape=(batch.numel() // length if length else 0, length),
    )


def tensor(
    td: TensorDictBase,
    rows: Rows,
    given: Tensor | None,
    key: NestedKey,
    name: str,
    missing: str = "",
) -> Tensor:
    """A float per-step argument (or the entry at ``key`` when it is None), checked.

    ``missing`` is added to the error when neither the argument nor the entry exists.
    """
    error: type[ValueError]
    if given is None:
        given = td.get(key, None)
        if given is None:
            raise LayoutError(f"{name} not given and key {key!r} missing from the batch{missing}")
        what, error = f"key {key!r}", LayoutError
    else:
        what, error = name, ValueError
    if not isinstance(given, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(given).__name__}")
    if not given.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor, got dtype {given.dtype}")
    if given.device != rows.device:
        raise error(f"{what} is on {given.device}, the batch on {rows.device}")
    _check_shape(given, rows.batch, what, error)
    return given.detach()


def work_dtype(*tensors: Tensor) -> tuple[torch.dtype, torch.dtype]:
    """``(output dtype, dtype computed in)``: the promoted dtype of ``tensors``; half
    precision is computed in float32 and cast back."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype, (dtype if dtype in (torch.float32, torch.float64) else torch.float32)


def check_rate(name: str, x: float) -> float:
    """A discount or trace parameter in ``[0, 1]``."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {x}")
    return float(x)


def check_threshold(name: str, x: float) -> float:
    """A clipping threshold: ``> 0`` (``math.inf``: no clipping)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    if math.isnan(x) or x <= 0:
        raise ValueError(f"{name} must be > 0 (math.inf: no clipping), got {x}")
    return float(x)


def _flag(td: TensorDictBase, key: NestedKey, batch: torch.Size) -> Tensor | None:
    """A bool entry of shape ``[*batch]`` or ``[*batch, 1]``, or None."""
    value = td.get(key, None)
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        raise LayoutError(f"key {key!r}: expected a bool tensor, got {_describe(value)}")
    _check_shape(value, batch, f"key {key!r}")
    return value


def _check_shape(
    value: Tensor, batch: torch.Size, what: str, error: type[ValueError] = LayoutError
) -> None:
    """``value`` must be ``[*batch]``, or ``[*batch, 1]`` (a trailing feature dim of 1)."""
    shape = value.shape
    if shape != batch and (shape[:-1] != batch or shape[-1] != 1):
        raise error(f"{what}: expected shape {list(batch)} or {[*batch, 1]}, got {list(shape)}")


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"dtype {value.dtype} and shape {list(value.shape)}"
    return type(value).__name__
