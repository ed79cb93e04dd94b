"""Fixtures of the replay tests: comparable snapshots of a buffer's whole state and contents."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

from splice.replay import ReplayBuffer


def _comparable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().clone().contiguous().numpy().tobytes()
        return ("tensor", str(value.dtype), tuple(value.shape), data)
    if isinstance(value, Mapping):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(item) for item in value]
    return value


@pytest.fixture
def buffer_state() -> Callable[[ReplayBuffer], Any]:
    """``rb -> `` a comparable copy of everything the buffer holds (its ``state_dict``: data,
    index, boundary state, sampler state and generator); equal copies mean an unchanged
    buffer."""
    return lambda rb: _comparable(rb.state_dict())


@pytest.fixture
def stored_steps() -> Callable[[ReplayBuffer], tuple[int, list[Any]]]:
    """``rb -> (write_count, the stored steps oldest first, as lists per key)``: what a
    buffer holds, independent of how its index numbers things (comparable across a
    memory-mapped reopen)."""

    def contents(rb: ReplayBuffer) -> tuple[int, list[Any]]:
        rows = torch.from_numpy(rb.index.live_rows())
        columns = rb.storage.gather(rows) if rb.storage.schema is not None else {}
        return rb.write_count, [(key, columns[key].tolist()) for key in sorted(columns)]

    return contents
