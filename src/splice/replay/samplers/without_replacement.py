"""``SamplerWithoutReplacement``: every stored step once per epoch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splice.replay._structures import I64, Epoch, EpochState
from splice.replay._validate import check_epoch
from splice.replay.samplers._base import Draw, Sampler, SamplerState, expect_state

__all__ = ["SamplerWithoutReplacement", "WithoutReplacementState"]


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
        check_epoch(state.epoch, "epoch", self.index.write_count, tagged=False)
        super().restore(state)
        self._epoch.restore(state.epoch)
