"""``take_rows`` and ``put_rows``: row gathers and row-range writes, through numpy on the CPU;
``stable_order``.

On this project's 2-core benchmark machine, torch 2.13's CPU ``index_select`` costs 4-6x more
than numpy's ``take`` for rows of a few elements (``[N, 4]`` float32, ``[N, 1]`` bool flags):
about 4 ns against 1 ns per row. Every gather of whole steps (the assembler's ``emit``, the
splits, the replay buffer's regrouping) goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = ["as_tensor", "numpy_view", "put_rows", "stable_order", "take_rows", "take_rows_of"]


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


def stable_order(values: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` for ints in ``[0, bound)``.

    Cast to int16 when they fit: numpy sorts int16 with a radix sort, several times faster
    than its merge sort of int64 on a few thousand values (the row or time index of a
    batch's episode starts and ends).

    Examples:
        >>> stable_order(np.array([2, 0, 2, 1]), bound=3)
        array([1, 3, 0, 2])
    """
    if bound <= np.iinfo(np.int16).max:
        values = values.astype(np.int16)
    return np.argsort(values, kind="stable")


K = TypeVar("K")


def take_rows_of(
    columns: Mapping[K, Tensor],
    rows: Tensor,
    views: Mapping[K, np.ndarray | None] | None = None,
) -> dict[K, Tensor]:
    """:func:`take_rows` of every column with the same ``rows``, converted to numpy once.

    A sample gathers a few hundred rows of every stored key: the per-call checks of
    :func:`take_rows` cost more than the gather itself (8 keys: 86 us against 33 us for the
    bare ``np.take`` calls, measured). Here the rows are converted once and each column goes
    through its numpy view (:func:`numpy_view`: accelerators, autograd and dtypes numpy
    lacks go through ``index_select``). ``views``: the columns' numpy views, when the caller
    keeps them (a storage does): converting 8 columns on every call costs about as much as
    gathering 512 rows of them.

    Examples:
        >>> cols = {"a": torch.arange(6).reshape(3, 2), "b": torch.tensor([1.0, 2.0, 3.0])}
        >>> out = take_rows_of(cols, torch.tensor([2, 0]))
        >>> out["a"].tolist(), out["b"].tolist()
        ([[4, 5], [0, 1]], [3.0, 1.0])
    """
    idx = rows.numpy() if rows.device.type == "cpu" else None
    out: dict[K, Tensor] = {}
    for key, x in columns.items():
        if idx is not None:
            view = numpy_view(x) if views is None else views.get(key)
            if view is not None:
                out[key] = torch.from_numpy(view.take(idx, axis=0))
                continue
        out[key] = x.index_select(0, rows)
    return out


def numpy_view(x: Tensor) -> np.ndarray | None:
    """``x.numpy()`` (the same memory), or None for a tensor numpy cannot view (not on the
    CPU, autograd, a dtype numpy lacks).

    Examples:
        >>> numpy_view(torch.zeros(2)).tolist(), numpy_view(torch.zeros(2, requires_grad=True))
        ([0.0, 0.0], None)
    """
    if x.device.type != "cpu" or x.requires_grad:
        return None
    try:
        return x.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks; conjugate/negative views
        return None


def as_tensor(x: Tensor | np.ndarray) -> Tensor:
    """``x`` as a tensor (a numpy array becomes one that shares its memory).

    Examples:
        >>> as_tensor(np.arange(3)).tolist(), as_tensor(torch.ones(1)).tolist()
        ([0, 1, 2], [1.0])
    """
    return x if isinstance(x, Tensor) else torch.from_numpy(x)


def put_rows(
    dest: Tensor, start: int, src: Tensor | np.ndarray, view: np.ndarray | None = None
) -> None:
    """``dest[start : start + len(src)] = src`` (same dtype), through numpy on the CPU.

    A torch slice plus ``copy_`` costs about 10 us per call on this project's benchmark
    machine, a numpy slice assignment about 4 us; a replay buffer's ``extend`` makes one per
    stored key. ``view``: ``numpy_view(dest)``, when the caller keeps it (a storage does, for
    each of its columns). Tensors numpy cannot view (accelerators, bfloat16, autograd) go
    through ``copy_``.

    Examples:
        >>> dest = torch.zeros(5, dtype=torch.int64)
        >>> put_rows(dest, 1, torch.tensor([7, 8]))
        >>> dest
        tensor([0, 7, 8, 0, 0])
    """
    if view is None:
        view = numpy_view(dest)
    if isinstance(src, np.ndarray):  # (a numpy ``src`` has the dtype of ``dest``)
        if view is not None:
            view[start : start + src.shape[0]] = src
        else:
            dest[start : start + src.shape[0]].copy_(torch.from_numpy(src))
        return
    if view is not None:
        try:  # (``numpy()`` refuses accelerators, autograd and dtypes numpy lacks: no checks)
            view[start : start + src.shape[0]] = src.numpy()
            return
        except (TypeError, RuntimeError):
            pass
    dest[start : start + src.shape[0]].copy_(src)
