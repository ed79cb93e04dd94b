"""Epochs: every item drawn once, and ``SamplerWithoutReplacement`` for single steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from splice.replay._structures import EMPTY, I64
from splice.replay.samplers._base import Draw, Sampler, SamplerState, expect_state

__all__ = ["Epoch", "EpochState", "SamplerWithoutReplacement", "WithoutReplacementState"]


@dataclass
class EpochState:
    """:class:`Epoch`: the items of the current epoch, their tags and the cursor."""

    items: np.ndarray
    tags: np.ndarray
    cursor: int


class Epoch:
    """A snapshot of items, visited once each, in shuffled (or stored) order.

    Items may go stale while the epoch runs (overwritten data): :meth:`take` asks a validity
    test and skips stale ones. Items that appear during the epoch wait for the next one.

    Args:
        drop_last: an epoch ends when fewer than a full batch of items is left.

    Examples:
        >>> epoch = Epoch()
        >>> epoch.start(np.arange(5), None, None)  # in order (a generator shuffles)
        >>> epoch.take(3, lambda items, tags: items != 2).tolist()  # 2 went stale
        [0, 1, 3]
        >>> epoch.take(3, lambda items, tags: items != 2).tolist(), epoch.left
        ([4], 0)
    """

    def __init__(self, *, drop_last: bool = False) -> None:
        self.drop_last = drop_last
        self.items = EMPTY
        self.tags = EMPTY
        self.cursor = 0

    @property
    def left(self) -> int:
        """Items not visited yet (some may be stale)."""
        return self.items.size - self.cursor

    def finished(self, batch: int) -> bool:
        """Whether the epoch has nothing (or, with ``drop_last``, no full batch) left."""
        return self.left == 0 or (self.drop_last and self.left < batch)

    def start(
        self, items: np.ndarray, tags: np.ndarray | None, generator: torch.Generator | None
    ) -> None:
        """A new epoch over ``items`` (shuffled with ``generator``; in order when None)."""
        if generator is not None and items.size > 1:
            order = torch.randperm(items.size, generator=generator).numpy()
            items = items[order]
            tags = None if tags is None else tags[order]
        self.items = items
        self.tags = EMPTY if tags is None else tags
        self.cursor = 0

    def take(self, count: int, valid: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """Up to ``count`` valid items of this epoch, in epoch order.

        ``valid(items, tags)`` returns a bool mask of the items that are still valid.
        """
        got: list[np.ndarray] = []
        need = count
        while need > 0 and self.cursor < self.items.size:
            stop = min(self.cursor + need, self.items.size)
            items = self.items[self.cursor : stop]
            tags = self.tags[self.cursor : stop] if self.tags.size else EMPTY
            self.cursor = stop
            ok = items[valid(items, tags)]
            got.append(ok)
            need -= ok.size
        return np.concatenate(got) if got else EMPTY

    def state(self) -> EpochState:
        return EpochState(self.items, self.tags, self.cursor)

    def restore(self, state: EpochState) -> None:
        self.items = np.asarray(state.items, dtype=I64)
        self.tags = np.asarray(state.tags, dtype=I64)
        self.cursor = state.cursor

    def reset(self) -> None:
        self.items, self.tags, self.cursor = EMPTY, EMPTY, 0


@dataclass
class WithoutReplacementState(SamplerState):
    """:class:`SamplerWithoutReplacement`: the base state and the epoch."""

    epoch: EpochState


class SamplerWithoutReplacement(Sampler):
    """Single steps without replacement: every stored step once per epoch (TorchRL's).

    An epoch is a shuffled snapshot of the steps stored when it starts; steps overwritten
    during the epoch are skipped and steps written during it wait for the next one. The last
    batch of an epoch is smaller unless ``drop_last=True`` (then the leftover steps are
    skipped); :attr:`ran_out` becomes True with the last batch, which ends iteration over
    the buffer. Cost: O(stored steps) once per epoch, O(batch) per draw.

    Args:
        drop_last: only return full batches.
        shuffle: visit the steps in random order (default) or in write order.
        replacement: accepted for TorchRL compatibility; must be False.
        generator: the random generator to draw from.
        seed: seed of a fresh generator (exclusive with ``generator``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(10),
        ...     sampler=SamplerWithoutReplacement(seed=0),
        ...     batch_size=4,
        ... )
        >>> _ = rb.extend(torch.arange(10))
        >>> batches = [batch.tolist() for batch in rb]  # one epoch: 4 + 4 + 2 steps
        >>> [len(b) for b in batches], sorted(sum(batches, []))
        ([4, 4, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """

    state_type = WithoutReplacementState

    def __init__(
        self,
        drop_last: bool = False,
        shuffle: bool = True,
        *,
        replacement: bool = False,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        if replacement:
            raise ValueError("SamplerWithoutReplacement(replacement=True): use RandomSampler")
        super().__init__(generator=generator, seed=seed)
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self._epoch = Epoch(drop_last=self.drop_last)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"

    def rebuild(self) -> None:
        if self.drop_last and self.default_batch_size is None:
            raise ValueError(
                "Samplers with drop_last=True must work with a prescribed batch_size: pass "
                "batch_size to the ReplayBuffer"
            )
        self._epoch.reset()

    def draw(self, batch_size: int) -> Draw:
        index = self.index
        n = len(index)
        if n == 0:
            raise self.empty_error()
        if self.drop_last and batch_size > n:
            raise ValueError(
                f"The batch size {batch_size} is greater than the storage capacity {n} "
                "(drop_last=True can never fill a batch)"
            )
        self.ran_out = False

        def live(items: np.ndarray, tags: np.ndarray) -> np.ndarray:
            return items >= index.lo

        if self._epoch.finished(batch_size):
            self._new_epoch()
        pos = self._epoch.take(batch_size, live)
        if pos.size == 0 or (self.drop_last and pos.size < batch_size):
            self._new_epoch()  # the rest of the epoch was overwritten
            pos = self._epoch.take(batch_size, live)
        if self._epoch.finished(batch_size):
            self.ran_out = True
        return Draw(rows=pos % index.capacity)

    def _new_epoch(self) -> None:
        index = self.index
        items = np.arange(index.lo, index.write_count, dtype=I64)
        self._epoch.start(items, None, self.generator if self.shuffle else None)

    def config(self) -> dict[str, object]:
        out = super().config()
        out.update(drop_last=self.drop_last, shuffle=self.shuffle)
        return out

    def state(self) -> WithoutReplacementState:
        base = super().state()
        return WithoutReplacementState(**vars(base), epoch=self._epoch.state())

    def restore(self, state: SamplerState) -> None:
        state = expect_state(state, WithoutReplacementState)
        super().restore(state)
        self._epoch.restore(state.epoch)
