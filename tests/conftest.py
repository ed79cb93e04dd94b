"""Fixtures shared by every test module: a seeded torch RNG and a minimal replay buffer.

Test data generators (collector-like batches, a counting env) live in :mod:`splice.testing`.
"""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDictBase


class ListBuffer:
    """The smallest replay buffer: keeps what ``extend`` receives (thread-safe)."""

    def __init__(self) -> None:
        self.items: list[TensorDictBase] = []
        self._lock = threading.Lock()

    def extend(self, data: TensorDictBase) -> None:
        with self._lock:
            self.items.append(data)

    def __len__(self) -> int:
        with self._lock:
            return sum(int(d.numel()) for d in self.items)


@pytest.fixture
def list_buffer() -> ListBuffer:
    """A fresh :class:`ListBuffer`: records every batch a collector writes."""
    return ListBuffer()


@pytest.fixture(autouse=True)
def _torch_seed() -> None:
    torch.manual_seed(0)
