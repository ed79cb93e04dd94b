"""Which implementation computes a target: one per device kind.

CPU tensors take :mod:`splice.targets._cpu` (compiled loops, numba); tensors on any other
device take :mod:`splice.targets._torch` (whole-tensor ops, a parallel scan). Both
implement :class:`Backend` on the rows of :class:`~splice.targets._inputs.Rows`, with the
values already in the dtype computed in; they compute the same targets.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import torch
from torch import Tensor

from splice.targets._inputs import Rows


class Backend(Protocol):
    """The arithmetic of every target on ``[rows, T]`` tensors."""

    def continuation(self, rows: Rows) -> tuple[Tensor, Tensor]: ...

    def gae(
        self,
        rows: Rows,
        reward: Tensor,
        value: Tensor,
        next_value: Tensor,
        gamma: float,
        lmbda: float,
    ) -> tuple[Tensor, Tensor]: ...

    def td_lambda(
        self, rows: Rows, reward: Tensor, next_value: Tensor, gamma: float, lmbda: float
    ) -> Tensor: ...

    def reward_to_go(self, rows: Rows, reward: Tensor, gamma: float) -> Tensor: ...

    def n_step(
        self, rows: Rows, reward: Tensor, next_value: Tensor, n: int, gamma: float
    ) -> Tensor: ...

    def vtrace(
        self,
        rows: Rows,
        reward: Tensor,
        value: Tensor,
        next_value: Tensor,
        log_pi: Tensor,
        log_mu: Tensor | None,
        gamma: float,
        rho_thresh: float,
        c_thresh: float,
    ) -> tuple[Tensor, Tensor]: ...

    def retrace(
        self,
        rows: Rows,
        reward: Tensor,
        q: Tensor,
        next_value: Tensor,
        log_pi: Tensor,
        log_mu: Tensor | None,
        gamma: float,
        lmbda: float,
        c_thresh: float,
    ) -> Tensor: ...


def for_device(device: torch.device) -> Backend:
    """The implementation for tensors on ``device``.

    The CPU one is imported on first use, so ``import splice`` does not import numba.
    """
    name = "_cpu" if device.type == "cpu" else "_torch"
    backend = _loaded.get(name)
    if backend is None:
        backend = _loaded[name] = importlib.import_module(f"splice.targets.{name}")  # type: ignore[assignment]
    return backend


_loaded: dict[str, Backend] = {}
