"""Argument checks shared by every layer: a count is an ``int``, never a bool.

``TypeError`` for a value that is not an integer where a count is meant (a bool included:
``True`` is not a count), ``ValueError`` for an integer out of range; each error names the
argument.

Examples:
    >>> positive_int("batch_size", 4)
    4
    >>> positive_int("batch_size", True)
    Traceback (most recent call last):
    ...
    TypeError: batch_size must be an int, got bool True
    >>> positive_int("batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be a positive int, got 0
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

__all__ = ["non_negative_int", "positive_int", "require_int"]


def require_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` if it is an integer (numpy integers too), else a ``TypeError``
    naming ``name``; bools are refused (``True`` is not a count)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int ``>= 1``: ``TypeError`` for a non-integer or a bool,
    ``ValueError`` for an integer below 1 (each naming ``name``)."""
    if require_int(name, value) < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    """``value`` if it is an int ``>= 0`` (errors as :func:`positive_int`)."""
    if require_int(name, value) < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)
