"""The sampler protocol shared by every sampler, and the uniform ``RandomSampler``.

A sampler is attached to one buffer. It keeps whatever it needs to draw in O(batch) (sets of
eligible slice ends, sum-trees, epoch permutations), updates it from the index's
:class:`~splice.replay.index.WriteReport` after every write, and draws rows with its own
``torch.Generator`` — never the global random state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from tensordict.utils import NestedKey

from splice.layout import as_key_tuple
from splice.replay._structures import I64, State
from splice.replay.index import ReplayIndex, WriteReport

__all__ = ["Draw", "RandomSampler", "Sampler"]

Key = tuple[str, ...]


@dataclass(frozen=True)
class Draw:
    """What a sampler picked.

    Attributes:
        rows: ``[B]`` storage rows (single steps), or ``[S, W]`` for slices: row ``i`` holds
            ``length[i]`` consecutive steps of one trajectory, oldest first, then ``-1``.
        length: ``[S]`` real steps of each slice, burn-in included (slices only).
        burn: ``[S]`` burn-in steps at the start of each slice (slices only).
        weight: ``[S]`` importance weights (prioritised samplers only).
    """

    rows: np.ndarray
    length: np.ndarray | None = None
    burn: np.ndarray | None = None
    weight: np.ndarray | None = None


def make_generator(generator: torch.Generator | None, seed: int | None) -> torch.Generator:
    if generator is not None and seed is not None:
        raise TypeError("pass either generator= or seed=, not both")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator
    out = torch.Generator()
    if seed is None:
        out.seed()  # fresh entropy; the global RNG is left alone
    else:
        out.manual_seed(int(seed))
    return out


def key_or_none(key: NestedKey | None) -> Key | None:
    return None if key is None else as_key_tuple(key)


class Sampler:
    """Base class of the samplers (see module docs).

    Args:
        generator: the random generator to draw from.
        seed: seed of a fresh generator (exclusive with ``generator``); without either, the
            generator is seeded from fresh entropy.
    """

    #: whether the sampler needs trajectory boundaries (ids or end flags) in the data.
    needs_trajectories: ClassVar[bool] = False
    traj_key: Key | None = None
    end_key: Key | None = None

    def __init__(
        self, *, generator: torch.Generator | None = None, seed: int | None = None
    ) -> None:
        self.generator = make_generator(generator, seed)
        #: True when the last draw finished an epoch (samplers without replacement).
        self.ran_out = False
        self._index: ReplayIndex | None = None
        self._default_batch: int | None = None

    # ------------------------------------------------------------------ buffer hooks
    def _attach(self, index: ReplayIndex, batch_size: int | None) -> None:
        """Bind to a buffer's index and build the sampler's structures from its content."""
        self._index = index
        self._default_batch = batch_size
        self._rebuild()

    def _rebuild(self) -> None:
        """Recompute every derived structure from the index (O(capacity), rare)."""

    def _on_write(self, report: WriteReport) -> None:
        """Update after a write (O(batch))."""

    def _draw(self, batch_size: int) -> Draw:
        raise NotImplementedError

    def update_priority(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Ignored: only prioritised samplers use priorities (as in TorchRL)."""

    @property
    def index(self) -> ReplayIndex:
        if self._index is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a replay buffer")
        return self._index

    # ------------------------------------------------------------------ randomness
    def _uniform(self, n: int) -> np.ndarray:
        return torch.rand(n, dtype=torch.float64, generator=self.generator).numpy()

    def _randint(self, high: np.ndarray | int, n: int) -> np.ndarray:
        """``n`` integers uniform in ``[0, high)`` (``high`` scalar or per draw)."""
        # u < 1 - 2**-53, so u * high < high for every high below 2**52: no clipping needed.
        return (self._uniform(n) * high).astype(I64)

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, object]:
        """The constructor settings that a restored buffer must share."""
        return {"type": type(self).__name__}

    def state_dict(self) -> State:
        return {"rng": self.generator.get_state().numpy().copy(), "ran_out": int(self.ran_out)}

    def load_state_dict(self, state: State) -> None:
        self.generator.set_state(torch.from_numpy(np.asarray(state["rng"], dtype=np.uint8)))
        self.ran_out = bool(state["ran_out"])


class RandomSampler(Sampler):
    """Uniform sampling of single steps, with replacement, in O(batch).

    Args:
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

    def _draw(self, batch_size: int) -> Draw:
        index = self.index
        n = len(index)
        if n == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        pos = index.lo + self._randint(n, batch_size)
        return Draw(rows=pos % index.capacity)
