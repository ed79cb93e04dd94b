"""Per-step Python objects (text observations and the like) as tensordict non-tensor entries.

A collector batch carries a leaf without a tensor form (a ``Text`` observation, MiniGrid's
``mission``) as a tensordict *non-tensor* entry of the batch's shape; ``batch.get(key).tolist()``
gives the nested list of the env's objects (``[T]`` or ``[B][T]``). Physically it is the most
compact form tensordict offers for the values:

* every value equal: one :class:`~tensordict.NonTensorData` with the batch size (O(1) to build);
* each env row constant (``[B, T]``): a :class:`~tensordict.NonTensorStack` of ``B``
  ``NonTensorData`` of batch size ``[T]`` (O(B));
* otherwise a ``NonTensorStack`` of one ``NonTensorData`` per step (tensordict builds these at
  ~45 µs each on this machine's CPU).

Code that reads the entry must use tensordict's accessors (indexing, ``tolist()``), which give
the same values for the three forms; :func:`non_tensor_values` returns them as a numpy object
array of the batch shape (the inverse of :func:`to_non_tensor`).

Examples:
    >>> import numpy as np
    >>> values = np.array([["go", "go", "go"], ["go", "go", "go"]], dtype=object)
    >>> entry = to_non_tensor(values)
    >>> type(entry).__name__, list(entry.batch_size)
    ('NonTensorData', [2, 3])
    >>> values[1, 2] = "stop"
    >>> entry = to_non_tensor(values)
    >>> type(entry).__name__, entry.tolist()
    ('NonTensorStack', [['go', 'go', 'go'], ['go', 'go', 'stop']])
    >>> np.array_equal(non_tensor_values(entry), values)
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tensordict import NonTensorData, NonTensorStack

__all__ = ["non_tensor_values", "to_non_tensor"]

_SCALARS = (str, bytes, int, float, bool, type(None))


def _all_equal(flat: np.ndarray) -> bool:
    """Whether every element of the 1-D object array ``flat`` equals the first (checked only
    for plain scalars such as str; other objects count as distinct)."""
    first = flat[0]
    if not isinstance(first, _SCALARS):
        return False
    try:
        return bool(np.all(flat == first)) and all(type(v) is type(first) for v in flat)
    except (TypeError, ValueError):
        return False


def to_non_tensor(values: np.ndarray) -> NonTensorData | NonTensorStack:
    """The tensordict non-tensor entry holding ``values`` (an object array, ``[T]`` or
    ``[B, T]``, of the batch shape)."""
    shape = list(values.shape)
    flat = values.reshape(-1)
    if flat.size and _all_equal(flat):
        return NonTensorData(data=flat[0], batch_size=shape)
    if values.ndim == 1:
        return NonTensorStack(*[NonTensorData(data=v) for v in values])
    rows = [to_non_tensor(row) for row in values]
    return NonTensorStack(*rows, stack_dim=0)


def non_tensor_values(entry: Any) -> np.ndarray:
    """The values of a non-tensor entry as an object array of its batch shape.

    Examples:
        >>> from tensordict import NonTensorData
        >>> non_tensor_values(NonTensorData(data="a", batch_size=[2]))
        array(['a', 'a'], dtype=object)
    """
    shape = tuple(entry.batch_size)
    out = np.empty(shape, dtype=object)
    if isinstance(entry, NonTensorData):
        out.fill(entry.data)
        return out
    _fill(out, entry.tolist())
    return out


def _fill(out: np.ndarray, values: list[Any]) -> None:
    if out.ndim == 1:
        for i, v in enumerate(values):
            out[i] = v
        return
    for row, v in zip(out, values, strict=True):
        _fill(row, v)
