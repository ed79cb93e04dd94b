"""The sampler contract: the hooks a sampler implements, and what a draw returns."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import numpy as np
import torch
from tensordict.utils import NestedKey

from splice._args import positive_int
from splice._rng import seed_from_torch
from splice.layout import IS_INIT, TRUNCATED, Key, as_key_tuple
from splice.replay._state import flatten, from_tensors, to_tensors, unflatten
from splice.replay._structures import I64
from splice.replay.index import ReplayIndex, WriteReport

__all__ = ["Draw", "Sampler", "SamplerState", "SliceMarks", "make_generator"]


@dataclass(frozen=True)
class Draw:
    """What a sampler picked (returned by :meth:`Sampler.draw`).

    Attributes:
        rows: ``[B]`` storage rows (single steps), or ``[S, W]`` for slices: row ``i`` holds
            ``length[i]`` consecutive steps of one trajectory, oldest first, from column
            ``start[i]`` on, and ``-1`` in its other columns.
        length: ``[S]`` real steps of each slice, burn-in included (slices only; default:
            every row's steps up to its first ``-1``).
        burn: ``[S]`` burn-in steps at the start of each slice (slices only; default 0).
        weight: importance weights, ``[B]`` per step or ``[S]`` per slice (prioritised
            samplers only).
        start: ``[S]`` column of each slice's first step (slices only; default 0: every
            slice left-aligned).
    """

    rows: np.ndarray
    length: np.ndarray | None = None
    burn: np.ndarray | None = None
    weight: np.ndarray | None = None
    start: np.ndarray | None = None


@dataclass(frozen=True)
class SliceMarks:
    """How the buffer marks slices in a sample (see :attr:`Sampler.marks`).

    Attributes:
        truncated_key: set True (with the ``done`` key next to it) at every slice's last real
            step; None leaves the flags alone.
        init_key: set True at every slice's first step, when stored; None leaves it alone.
        pad_output: pad a flat sample to ``num_slices * width`` steps, with a mask.
        as_sequences: return ``[num_slices, width]`` instead of a flat sample.
        burn_in: the largest burn-in (``("collector", "burn_in")`` marks it when > 0).
        state_keys: keys returned at every slice's first step in ``info["initial_state"]``.
        burn_in_keys: the only keys read at burn-in steps (the others are zero there);
            None: every key.
    """

    truncated_key: Key | None = TRUNCATED
    init_key: Key | None = (IS_INIT,)
    pad_output: bool = False
    as_sequences: bool = False
    burn_in: int = 0
    state_keys: tuple[Key, ...] = ()
    burn_in_keys: tuple[Key, ...] | None = None


@dataclass
class SamplerState:
    """What every sampler saves: its generator's state and the epoch flag."""

    rng: np.ndarray
    ran_out: bool


def make_generator(generator: torch.Generator | None, seed: int | None) -> torch.Generator:
    """The generator a sampler draws from.

    ``generator`` is used as is; ``seed`` seeds a fresh one; with neither, a fresh generator
    is seeded from torch's global RNG (one draw, as ``torch.utils.data`` samplers do), so
    ``torch.manual_seed`` at the top of a script reproduces the run.

    Raises:
        TypeError: both given, or ``generator`` is not a ``torch.Generator``.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> a = torch.rand(3, generator=make_generator(None, None))
        >>> _ = torch.manual_seed(0)
        >>> bool((a == torch.rand(3, generator=make_generator(None, None))).all())
        True
    """
    if generator is not None and seed is not None:
        raise TypeError("pass either generator= or seed=, not both")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    out = torch.Generator()
    if seed is None:
        seed = seed_from_torch()
    out.manual_seed(seed)
    return out


S = TypeVar("S", bound="SamplerState")


def expect_state(state: SamplerState, kind: type[S]) -> S:
    """``state`` if it is a ``kind``, else TypeError (a state saved by another sampler)."""
    if not isinstance(state, kind):
        raise TypeError(f"expected a {kind.__name__}, got {type(state).__name__}")
    return state


def key_or_none(key: NestedKey | None) -> Key | None:
    return None if key is None else as_key_tuple(key)


class Sampler:
    """Base class of the samplers: the contract between a sampler and its replay buffer.

    A sampler decides which stored rows a batch is made of. The buffer owns the storage and
    a :class:`~splice.replay.ReplayIndex` (the trajectory and step of every stored row, the
    live range, segment links); the sampler owns whatever it needs to draw fast (sets,
    trees, epoch orders) and keeps it current through the hooks below. The buffer calls them
    while holding its lock, in this order:

    1. :meth:`attach` ``(index, batch_size)`` — when the buffer is built, and again after
       ``rb.empty()``, ``rb.load_state_dict()`` and ``rb.loads()``. It binds the sampler to
       the index and calls :meth:`rebuild`, where a sampler computes its structures from
       the index's current content (O(capacity), rare).
    2. :meth:`on_write` ``(report)`` — after every ``extend``/``add``, once the index has
       recorded the write; the :class:`~splice.replay.WriteReport` says which rows were
       evicted and written and which trajectories changed, so updates cost O(batch).
    3. :meth:`draw` ``(batch_size)`` — for every ``sample()``; returns a :class:`Draw`
       (storage rows, ``[B]`` for single steps or ``[S, W]`` for slices). It must not change
       the index. Set :attr:`ran_out` to True when the draw completes an epoch (iteration
       over the buffer stops there).
    4. :meth:`update_priority` ``(rows, priority)`` — on ``rb.update_priority``; ignored by
       default.
    5. After ``attach``, when restoring: :meth:`restore` ``(state)`` with what :meth:`state`
       returned (a :class:`SamplerState` subclass named by :attr:`state_type`). A state read
       from a file or a state dict is checked first, before the buffer changes anything:
       :meth:`check_restore` restores it into a detached copy of the sampler, so
       :meth:`restore` must raise ``ValueError`` for a state that does not fit the index.

    The buffer also reads :attr:`needs_trajectories`, :attr:`traj_key` and :attr:`end_key`
    (which data delimits trajectories, decided at the first write), calls
    :meth:`check_batch_size` when a batch size is set, and asks :attr:`marks` how to mark
    slices in the output. Draw randomness from :attr:`generator` (helpers :meth:`random`
    and :meth:`randint`) so that ``seed=`` and checkpoints reproduce a run.

    Args:
        generator: the random generator to draw from.
        seed: seed of a fresh generator (exclusive with ``generator``). Without either, a
            fresh generator is seeded from torch's global RNG at construction.

    Examples:
        A sampler that returns the newest ``batch_size`` steps (the index's live rows are
        the global positions ``[index.lo, index.write_count)``):

        >>> import numpy as np, torch
        >>> from tensordict import TensorDict
        >>> from splice.replay import Draw, LazyTensorStorage, ReplayBuffer, Sampler
        >>> class Newest(Sampler):
        ...     def draw(self, batch_size):
        ...         index = self.index
        ...         start = max(index.lo, index.write_count - batch_size)
        ...         return Draw(rows=np.arange(start, index.write_count) % index.capacity)
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=Newest(), batch_size=3)
        >>> _ = rb.extend(TensorDict({"x": torch.arange(7)}, batch_size=[7]))
        >>> rb.sample()["x"]
        tensor([4, 5, 6])
    """

    #: Whether the sampler needs trajectory boundaries (ids or end flags) in the data.
    needs_trajectories: ClassVar[bool] = False
    #: The dataclass :meth:`state` returns (subclasses extend :class:`SamplerState`).
    state_type: ClassVar[type[SamplerState]] = SamplerState
    #: Key of the trajectory ids (None: ``("collector", "traj_ids")``, then ``"episode"``).
    traj_key: NestedKey | None = None
    #: Key of the end-of-trajectory flag for data without ids (None: ``("next", "done")``).
    end_key: NestedKey | None = None

    def __init__(
        self, *, generator: torch.Generator | None = None, seed: int | None = None
    ) -> None:
        self.generator = make_generator(generator, seed)
        #: True when the last draw finished an epoch (samplers without replacement).
        self.ran_out = False
        self._index: ReplayIndex | None = None
        self._default_batch: int | None = None

    # ------------------------------------------------------------------ contract
    def attach(self, index: ReplayIndex, batch_size: int | None) -> None:
        """Bind to a buffer's index (and default batch size), then :meth:`rebuild`.

        Raises:
            ValueError: the sampler already belongs to another buffer.
        """
        if self._index is not None and self._index is not index:
            raise ValueError(f"this {type(self).__name__} already belongs to a replay buffer")
        before = self._index, self._default_batch
        self._index = index
        self._default_batch = batch_size
        try:
            self.rebuild()
        except BaseException:
            self._index, self._default_batch = before  # a failed attach binds nothing
            raise

    @property
    def attached(self) -> bool:
        """Whether a buffer has attached this sampler."""
        return self._index is not None

    @property
    def index(self) -> ReplayIndex:
        """The index of the buffer this sampler is attached to.

        Raises:
            RuntimeError: not attached.
        """
        if self._index is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a replay buffer")
        return self._index

    @property
    def default_batch_size(self) -> int | None:
        """The buffer's ``batch_size`` given to :meth:`attach`."""
        return self._default_batch

    def rebuild(self) -> None:
        """Recompute every derived structure from :attr:`index` (O(capacity), rare)."""

    def on_write(self, report: WriteReport) -> None:
        """Update after a write, from what it changed (O(batch))."""

    def draw(self, batch_size: int) -> Draw:
        """Pick the rows of a batch of ``batch_size`` steps."""
        raise NotImplementedError(f"{type(self).__name__} must implement draw(batch_size)")

    def update_priority(self, rows: np.ndarray, priority: np.ndarray) -> None:
        """Ignored: only prioritised samplers use priorities (as in TorchRL).

        Args:
            rows: int64 storage rows, as the user gave them (any shape; -1 is padding).
            priority: float64 priorities as the user gave them: ``rows``'s shape, or
                broadcastable to it (the sampler broadcasts).
        """

    def check_batch_size(self, batch_size: int) -> None:
        """Raise if this sampler cannot draw batches of ``batch_size``: ``TypeError`` for
        something else than an int (a bool included), ``ValueError`` for a value it cannot
        draw (below 1 here; subclasses add their own rules). Nothing changes either way."""
        positive_int("batch_size", batch_size)

    def empty_error(self) -> RuntimeError:
        """The error to raise when asked to draw from an empty buffer (TorchRL's wording)."""
        return RuntimeError("Cannot sample from an empty storage: the replay buffer holds no step")

    @property
    def marks(self) -> SliceMarks | None:
        """How slices are marked in samples (None: single steps; slice samplers override)."""
        return None

    # ------------------------------------------------------------------ randomness
    def random(self, n: int) -> np.ndarray:
        """``n`` float64 numbers uniform in ``[0, 1)`` from :attr:`generator`."""
        return torch.rand(n, dtype=torch.float64, generator=self.generator).numpy()

    def randint(self, high: np.ndarray | int, n: int) -> np.ndarray:
        """``n`` int64 numbers uniform in ``[0, high)`` (``high`` a scalar or per draw)."""
        # u < 1 - 2**-53, so u * high < high for every high below 2**52: no clipping needed.
        return (self.random(n) * high).astype(I64)

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, object]:
        """The constructor settings that a restored buffer must share (JSON-able)."""
        return {"type": type(self).__name__}

    def state(self) -> SamplerState:
        """Everything needed to continue exactly where this sampler is."""
        return SamplerState(self.generator.get_state().numpy().copy(), self.ran_out)

    def restore(self, state: SamplerState) -> None:
        """Load :meth:`state` (after :meth:`attach` to an identical index).

        Raises:
            ValueError: the state does not fit (here: a generator state of the wrong size);
                subclasses check their own structures against the index.
        """
        rng = np.asarray(state.rng)
        size = self.generator.get_state().numel()
        if rng.dtype != np.uint8 or rng.shape != (size,):
            raise ValueError(
                f"rng: expected {size} uint8 values (a generator state), got {rng.dtype} of "
                f"shape {list(rng.shape)}"
            )
        probe = torch.Generator(device=self.generator.device)
        try:
            probe.set_state(torch.from_numpy(rng.copy()))
        except RuntimeError as err:
            raise ValueError(f"rng: not a generator state ({err})") from err
        self.generator.set_state(torch.from_numpy(rng.copy()))
        self.ran_out = state.ran_out

    def check_restore(self, index: ReplayIndex, state: SamplerState) -> None:
        """Raise if ``state`` cannot be restored on ``index``, changing nothing.

        A buffer calls it before ``loads``/``load_state_dict`` change anything. The default
        attaches a detached copy of this sampler to ``index`` and restores ``state`` into it;
        so a :meth:`restore` that raises ``ValueError`` for a state that does not fit its
        index is all a sampler needs.

        Raises:
            ValueError: the state does not fit the index.
            TypeError: a state of another sampler type.
        """
        trial = copy.deepcopy(self, {id(self._index): None})
        trial._index = None
        trial.attach(index, self._default_batch)
        trial.restore(state)

    def state_dict(self) -> dict[str, object]:
        """:meth:`state` as a flat dict of tensors and numbers (``torch.save``-able)."""
        return to_tensors(flatten(self.state()))

    def load_state_dict(self, state_dict: Mapping[str, object]) -> None:
        """The inverse of :meth:`state_dict` (checked first: on error nothing changes)."""
        state = unflatten(self.state_type, from_tensors(state_dict))
        self.check_restore(self.index, state)
        self.restore(state)
