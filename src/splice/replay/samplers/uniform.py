"""``RandomSampler``: uniform draws of single steps, with replacement."""

from __future__ import annotations

from typing import Any

import torch

from splice.replay.samplers._base import Draw, Sampler
from splice.replay.samplers.without_replacement import SamplerWithoutReplacement

__all__ = ["RandomSampler"]


class RandomSampler(Sampler):
    """Uniform sampling of single steps, with replacement, in O(batch).

    Args:
        replacement: ``False`` gives a :class:`SamplerWithoutReplacement` (with the other
            keyword arguments), as in TorchRL.
        generator: the random generator to draw from.
        seed: seed of a fresh generator (exclusive with ``generator``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import LazyTensorStorage, RandomSampler, ReplayBuffer
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(100), sampler=RandomSampler(seed=0), batch_size=4
        ... )
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(10.0)}, batch_size=[10]))
        >>> sample = rb.sample()
        >>> sample.batch_size, bool((sample["observation"] == sample["index"]).all())
        (torch.Size([4]), True)
    """

    def __new__(cls, *args: Any, replacement: bool = True, **kwargs: Any) -> Any:
        if replacement is False and cls is RandomSampler:
            # TorchRL's dispatch: RandomSampler(replacement=False) is a
            # SamplerWithoutReplacement.
            return SamplerWithoutReplacement(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        *,
        replacement: bool = True,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(generator=generator, seed=seed)

    def draw(self, batch_size: int) -> Draw:
        index = self.index
        n = len(index)
        if n == 0:
            raise self.empty_error()
        pos = index.lo + self.randint(n, batch_size)
        return Draw(rows=pos % index.capacity)
