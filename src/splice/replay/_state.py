"""Typed state of the replay structures, and its one flat form for saving.

Every structure of the replay package (pools, sets, trees, the index, the samplers) describes
its state as a dataclass of numpy arrays and numbers. Saving needs a flat mapping instead:
:func:`flatten` turns a state into ``{"dotted.name": array or number}`` and :func:`unflatten`
rebuilds the dataclass from such a mapping, checking the kind of every value. The same flat
form is written as ``.npy`` files plus JSON by ``ReplayBuffer.dumps`` and returned as tensors
by ``ReplayBuffer.state_dict`` — no pickle anywhere.

Examples:
    >>> import numpy as np
    >>> from splice.replay._structures import Pool, PoolState
    >>> pool = Pool(("start",), size=2)
    >>> flat = flatten(pool.state())
    >>> sorted(flat)
    ['fields.start', 'free', 'n_free']
    >>> unflatten(PoolState, flat).n_free
    2
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Leaf",
    "as_bool",
    "as_float",
    "as_int",
    "flatten",
    "from_tensors",
    "to_tensors",
    "unflatten",
]

#: A value of the flat form.
Leaf = np.ndarray | int | float | bool | str | None

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def _scalar(value: object) -> object:
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def as_int(value: object, name: str = "value") -> int:
    """``value`` as an int (also from a numpy scalar or a one-element tensor).

    Raises:
        ValueError: ``value`` is not an integer.
    """
    value = _scalar(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    return value


def as_bool(value: object, name: str = "value") -> bool:
    """``value`` as a bool (also 0/1, a numpy bool or a one-element tensor).

    Raises:
        ValueError: ``value`` is not a bool.
    """
    value = _scalar(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name}: expected a bool, got {value!r}")


def as_float(value: object, name: str = "value") -> float:
    """``value`` as a float (ints accepted).

    Raises:
        ValueError: ``value`` is not a number.
    """
    value = _scalar(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _as_array(value: object, name: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, np.ndarray):
        return value
    raise ValueError(f"{name}: expected an array, got {type(value).__name__}")


def flatten(state: DataclassInstance, prefix: str = "") -> dict[str, Leaf]:
    """A state dataclass as a flat ``{"dotted.name": leaf}`` mapping (arrays are not copied).

    Nested dataclasses get dotted names; a ``dict[str, np.ndarray]`` field gives one entry
    per item.
    """
    out: dict[str, Leaf] = {}
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        name = prefix + field.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(flatten(value, name + "."))
        elif isinstance(value, dict):
            for key, item in value.items():
                out[f"{name}.{key}"] = item
        else:
            out[name] = value
    return out


def unflatten(cls: type[T], flat: Mapping[str, object], prefix: str = "") -> T:
    """Rebuild a state dataclass from :func:`flatten`'s form (arrays may be tensors).

    Raises:
        ValueError: a missing entry, or a value of the wrong kind (the message names it).
    """
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        name = prefix + field.name
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            kwargs[field.name] = unflatten(kind, flat, name + ".")
            continue
        if typing.get_origin(kind) is dict:
            start = name + "."
            kwargs[field.name] = {
                key[len(start) :]: _as_array(value, key)
                for key, value in flat.items()
                if key.startswith(start)
            }
            continue
        if name not in flat:
            raise ValueError(f"saved state has no entry {name!r}")
        value = flat[name]
        if kind is np.ndarray:
            kwargs[field.name] = _as_array(value, name)
        elif kind is bool:
            kwargs[field.name] = as_bool(value, name)
        elif kind is int:
            kwargs[field.name] = as_int(value, name)
        elif kind is float:
            kwargs[field.name] = as_float(value, name)
        else:  # a JSON-able value (str, None, lists)
            kwargs[field.name] = _scalar(value)
    return cls(**kwargs)


def to_tensors(flat: Mapping[str, Leaf]) -> dict[str, object]:
    """Arrays as (copied) tensors, everything else as is: what ``torch.save`` with
    ``weights_only=True`` loads back."""
    return {
        key: torch.from_numpy(np.array(value)) if isinstance(value, np.ndarray) else value
        for key, value in flat.items()
    }


def from_tensors(flat: Mapping[str, object]) -> dict[str, object]:
    """The inverse of :func:`to_tensors` (tensors back to numpy arrays, copied: the source
    may change later)."""
    return {
        key: value.detach().cpu().numpy().copy() if isinstance(value, Tensor) else value
        for key, value in flat.items()
    }
