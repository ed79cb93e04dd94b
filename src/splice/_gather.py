"""``take_rows`` and ``put_rows``: row gathers and row-range writes, through numpy on the CPU.

On this project's 2-core benchmark machine, torch 2.13's CPU ``index_select`` costs 4-6x more
than numpy's ``take`` for rows of a few elements (``[N, 4]`` float32, ``[N, 1]`` bool flags):
about 4 ns against 1 ns per row. Every gather of whole steps (the assembler's ``emit``, the
splits, the replay buffer's regrouping) goes through here.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["put_rows", "take_rows"]


def take_rows(x: Tensor, rows: Tensor) -> Tensor:
    """The rows ``rows`` (int64, in range) of ``x`` along dim 0, as a new contiguous tensor.

    CPU tensors of a dtype numpy knows that do not require grad go through ``np.take``;
    everything else (accelerators, bfloat16, autograd) through ``index_select``.

    Examples:
        >>> take_rows(torch.arange(10).reshape(5, 2), torch.tensor([4, 0]))
        tensor([[8, 9],
                [0, 1]])
    """
    if x.device.type != "cpu" or rows.device.type != "cpu" or x.requires_grad:
        return x.index_select(0, rows)
    try:
        array = x.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks; conjugate/negative views
        return x.index_select(0, rows)
    return torch.from_numpy(np.take(array, rows.numpy(), axis=0))


def put_rows(dest: Tensor, start: int, src: Tensor) -> None:
    """``dest[start : start + len(src)] = src`` (same dtype), through numpy on the CPU.

    A torch slice plus ``copy_`` costs about 10 us per call on this project's benchmark
    machine, a numpy slice assignment about 4 us; a replay buffer's ``extend`` makes one per
    stored key. Tensors numpy cannot view (accelerators, bfloat16, autograd) go through
    ``copy_``.

    Examples:
        >>> dest = torch.zeros(5, dtype=torch.int64)
        >>> put_rows(dest, 1, torch.tensor([7, 8]))
        >>> dest
        tensor([0, 7, 8, 0, 0])
    """
    try:
        dest.numpy()[start : start + src.shape[0]] = src.numpy()
    except (TypeError, RuntimeError):  # not on the CPU, a dtype numpy lacks, autograd
        dest[start : start + src.shape[0]].copy_(src)
