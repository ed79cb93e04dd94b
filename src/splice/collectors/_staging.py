"""The staging arrays of one rollout loop, and everything that touches them between steps.

:class:`Staging` is the single owner of the time-major numpy arrays ``[C, B, ...]`` (a column
per vector step) that the hot loop writes each step into: it allocates them (the env's leaves
up front, the policy's outputs once they are known), hands out the views the loop and the env
adapter write through, keeps the *dead-step* mask (gymnasium's NEXT_STEP autoreset inserts a
reset step that is not part of the data), and makes room for new columns (moving the columns
still needed to the front, or growing). Nothing else allocates, grows or moves staging memory.

**Rows advance on their own.** Each env row ``b`` has its own first untaken column
``start[b]``: a batch is the first ``T`` valid (non-dead) steps of every row from there
(:meth:`Staging.span`); afterwards ``start`` moves past them (:meth:`Staging.advance`).
Columns are never reordered, so a row's steps between two dead steps are one *run* of
consecutive columns, and any selection of steps (a batch, a set of episodes) is a list of
runs, gathered with one ``np.take`` per key (:func:`runs_flat`). Columns before the *floor*
(the smallest ``start``, or an older column someone asked to :attr:`Staging.keep`) may be
reused; a column's *logical* number (``physical + base``) never changes when columns move.

Examples:
    >>> import numpy as np
    >>> staging = Staging(num_envs=2, batched=True, steps=3)
    >>> staging.add(("reward",), (), np.dtype(np.float32))
    >>> reward = staging.column(("reward",))
    >>> for c in range(3):
    ...     reward[c] = [c, 10 + c]
    >>> staging.used = 3
    >>> staging.take()[("reward",)]
    array([[ 0.,  1.,  2.],
           [10., 11., 12.]], dtype=float32)
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from splice._gather import stable_order
from splice._non_tensor import to_non_tensor
from splice.envs import EnvAdapter, StepTargets
from splice.envs.spaces import OBJECT, Leaf
from splice.layout import (
    ACTION,
    CONTRACT,
    CUT,
    DONE,
    IS_INIT,
    NEXT,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
    as_key_tuple,
)

__all__ = ["BATCH_KEYS", "FLAG_KEYS", "Span", "Staging", "nested_tensordict", "runs_flat"]

Key = tuple[str, ...]

# Every key, flag and dtype below comes from the data contract (splice.layout.CONTRACT),
# read once at import: nothing here is looked up per step or per batch.
_CONTRACT = {as_key_tuple(key): spec for key, spec in CONTRACT.items()}
#: The dtype a collector writes for each dtype class of the contract (ids int64, as the
#: contract's ``TRAJ_IDS`` says; rewards float32, TorchRL's).
_WRITTEN_DTYPES = {
    "bool": np.dtype(np.bool_),
    "integer": np.dtype(np.int64),
    "float": np.dtype(np.float32),
}


def _contract_dtype(key: Key) -> np.dtype[Any]:
    return _WRITTEN_DTYPES[_CONTRACT[key].dtype]


#: The keys of a batch stored with a trailing ``[1]`` dim (the data contract's flags).
FLAG_KEYS: tuple[Key, ...] = tuple(key for key, spec in _CONTRACT.items() if spec.trailing_one)
#: The contract's keys staged at every step, by the env adapter (reward, terminated,
#: truncated) and the loop (``is_init``), in their staging order.
_STEP_KEYS: tuple[Key, ...] = (REWARD, TERMINATED, TRUNCATED, (IS_INIT,))
#: The keys of a batch computed when it is copied out (not staged): per-step shape, dtype.
BATCH_KEYS: dict[Key, tuple[tuple[int, ...], Any]] = {
    key: ((), _contract_dtype(key)) for key in (DONE, TRAJ_IDS, CUT)
}


def runs_flat(row: np.ndarray, first: np.ndarray, length: np.ndarray, num_envs: int) -> np.ndarray:
    """The flat staging positions (``column * B + row``) of the steps of consecutive-column
    runs, run after run: ``row``, ``first`` (physical column) and ``length`` per run.

    One ``np.repeat`` and one add: within a run the position grows by ``B`` per step.

    Examples:
        >>> runs_flat(np.array([1, 0]), np.array([2, 0]), np.array([2, 3]), num_envs=2)
        array([5, 7, 0, 2, 4])
    """
    n = int(length.sum())
    offset = np.cumsum(length) - length
    flat = np.repeat(first * num_envs + row - offset * num_envs, length)
    flat += np.arange(0, n * num_envs, num_envs)
    return flat


@dataclass(frozen=True)
class Span:
    """The next batch of a :class:`Staging`: the first ``T`` valid steps of every row.

    Attributes:
        start: ``[B]`` physical column of each row's first step.
        stop: ``[B]`` physical column after each row's last step.
        run_row, run_first, run_length: the runs of consecutive valid columns that hold the
            steps, env-major (row 0's runs in time order, then row 1's ...): a dead step
            inside a row's range splits it.
        dead_after: ``[B]`` dead steps of each row after ``stop`` (in columns already run).
    """

    start: np.ndarray
    stop: np.ndarray
    run_row: np.ndarray
    run_first: np.ndarray
    run_length: np.ndarray
    dead_after: np.ndarray

    def flat(self, num_envs: int) -> np.ndarray:
        """The flat staging position of every step, env-major (``[B * T]``)."""
        return runs_flat(self.run_row, self.run_first, self.run_length, num_envs)


class Staging:
    """Time-major staging arrays ``[C, B, ...]`` for ``B`` envs and ``T = steps`` per batch.

    Args:
        num_envs: ``B``.
        batched: False for a single env: :meth:`column` then gives ``[C, ...]`` views (a scalar
            write into a 1-D view costs ~40 ns, a broadcast into a ``[1]`` row ~300 ns).
        steps: ``T``, the valid steps of every env row in a batch.

    Attributes:
        used: physical columns ``[0, used)`` hold steps (the write cursor of the loop).
        dead: bool ``[C, B]``: True where a column is not a step of that env (a dead reset
            step). Columns at and after ``used`` are False.
        start: ``[B]`` the physical column of each row's first untaken step.
        pending_dead: ``[B]`` dead steps of each row in ``[start[b], used)``.
        base: the logical number of physical column 0 (grows when columns move to the front).
        keep: a logical column to keep, with the columns after it, when room is made (the
            oldest step of an episode still needed), or None.
        version: bumped when the arrays are reallocated or keys are added (views and
            step targets taken before are stale).
    """

    def __init__(self, num_envs: int, batched: bool, steps: int) -> None:
        self.num_envs = num_envs
        self.batched = batched
        self.steps = steps
        self.margin = max(8, steps // 4)
        self.capacity = steps + self.margin
        self.arrays: dict[Key, np.ndarray] = {}
        self.dead = np.zeros((self.capacity, num_envs), np.bool_)
        self.start = np.zeros(num_envs, np.int64)
        self.pending_dead = np.zeros(num_envs, np.int64)
        self.used = 0
        self.base = 0
        self.keep: int | None = None
        self.version = 0
        #: The observation keys (``("observation", ...)`` leaves) and their ``("next", ...)``.
        self.obs_keys: list[Key] = []
        self.next_obs_keys: list[Key] = []
        #: The info keys (:attr:`EnvAdapter.info_leaves`) and their ``("next", ...)``.
        self.info_keys: list[Key] = []
        self.next_info_keys: list[Key] = []
        self._rows = np.arange(num_envs)
        self._recycler = _Recycler()

    @classmethod
    def for_env(cls, adapter: EnvAdapter, steps: int) -> Staging:
        """Staging for an env adapter's steps: observation leaves (entering and next), reward,
        terminated, truncated, ``is_init`` and the action (info leaves and policy outputs are
        added once known: :meth:`add_info`, :meth:`add`)."""
        staging = cls(adapter.num_envs, adapter.batched, steps)
        staging.obs_keys = [(OBSERVATION, *leaf.key) for leaf in adapter.obs_leaves]
        staging.next_obs_keys = [(NEXT, *key) for key in staging.obs_keys]
        for keys in (staging.obs_keys, staging.next_obs_keys):
            for key, leaf in zip(keys, adapter.obs_leaves, strict=True):
                staging.add(key, leaf.shape, leaf.dtype)
        staging.add_info(adapter.info_leaves)
        for key in _STEP_KEYS:
            staging.add(key, (), _contract_dtype(key))
        staging.add((ACTION,), adapter.act_leaf.shape, adapter.act_leaf.dtype)
        return staging

    @property
    def input_keys(self) -> list[Key]:
        """The keys of the values entering a step (the policy's input, in the order of
        :attr:`EnvAdapter.obs`): observation keys, then info keys."""
        return self.obs_keys + self.info_keys

    def add_info(self, leaves: list[Leaf]) -> None:
        """Allocate the info leaves (entering and next) not allocated yet; bumps
        :attr:`version` if any is new (the adapter must be re-bound to :meth:`step_targets`)."""
        new = [leaf for leaf in leaves if leaf.key not in self.info_keys]
        for leaf in new:
            self.add(leaf.key, leaf.shape, leaf.dtype)
            self.add((NEXT, *leaf.key), leaf.shape, leaf.dtype)
            self.info_keys.append(leaf.key)
            self.next_info_keys.append((NEXT, *leaf.key))
        if new:
            self.version += 1

    # ---------------------------------------------------------------- arrays
    def add(self, key: Key, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        """Allocate the arrays of ``key`` (per-env ``shape``, ``dtype``); a no-op if they exist
        with that layout.

        Raises:
            ValueError: ``key`` exists with another shape or dtype.
        """
        existing = self.arrays.get(key)
        if existing is not None:
            if existing.shape[2:] != tuple(shape) or existing.dtype != dtype:
                raise ValueError(
                    f"key {key!r} is written twice with different layouts: "
                    f"{list(existing.shape[2:])} {existing.dtype} vs {list(shape)} {dtype}"
                )
            return
        self.arrays[key] = np.zeros((self.capacity, self.num_envs, *shape), dtype)

    def column(self, key: Key) -> np.ndarray:
        """The view the loop writes ``key`` through: ``[C, B, ...]``, or ``[C, ...]`` for a
        single env. Stale after the arrays are reallocated (see :attr:`version`)."""
        arr = self.arrays[key]
        return arr if self.batched else arr[:, 0]

    def step_targets(self) -> StepTargets:
        """The views an env adapter writes each step's results through (:meth:`for_env`)."""
        return StepTargets(
            next_obs=[self.column(k) for k in self.next_obs_keys],
            reward=self.column(REWARD),
            terminated=self.column(TERMINATED),
            truncated=self.column(TRUNCATED),
            next_info=[self.column(k) for k in self.next_info_keys],
        )

    def fill_entering(self, start: int, stop: int) -> None:
        """Write the values entering the steps of columns ``[start, stop)`` where no episode
        starts (``is_init`` False in every row): the previous column's next values.

        The rollout loop writes the entering values only at episode starts (and at the first
        column of each run); elsewhere they equal the values the env returned with the
        previous step (the step stream's rule, :mod:`splice.envs.base`), which staging
        already holds as ``("next", ...)``: copied here, once per run, instead of once per step.
        """
        if stop <= start:
            return
        arrays = self.arrays
        init = arrays[(IS_INIT,)][start:stop]
        keys = zip(self.input_keys, self.next_obs_keys + self.next_info_keys, strict=True)
        if not init.any():
            for key, next_key in keys:
                arrays[key][start:stop] = arrays[next_key][start - 1 : stop - 1]
            return
        starts = init.any(axis=1)
        at = np.flatnonzero(starts) + start
        if 2 * at.size <= stop - start:
            # Few episode starts: one slice copy, then the starts' own values put back (two
            # small gathers instead of two gathers of nearly every column).
            for key, next_key in keys:
                arr = arrays[key]
                kept = arr[at]
                arr[start:stop] = arrays[next_key][start - 1 : stop - 1]
                arr[at] = kept
            return
        cols = np.flatnonzero(~starts) + start
        for key, next_key in keys:
            arrays[key][cols] = arrays[next_key][cols - 1]

    def zero_from(self, keys: list[Key], start: int) -> None:
        """Zero the physical columns ``[start, C)`` of ``keys``."""
        for key in keys:
            self.arrays[key][start:] = 0

    def clear(self) -> None:
        """Forget every column (a fresh start: no steps, no dead steps, nothing kept)."""
        self.dead[:] = False  # also after `used`: a failed run may have marked columns there
        self.base += self.used
        self.used = 0
        self.start[:] = 0
        self.pending_dead[:] = 0
        self.keep = None

    def restart_rows(self) -> None:
        """Drop every row's untaken steps (new episodes start at the next column); columns
        already written stay until room is made (what :attr:`keep` asks for survives)."""
        self.dead[self.used :] = False  # marks a failed run left after `used`
        self.start[:] = self.used
        self.pending_dead[:] = 0

    # ------------------------------------------------------------ making room
    def target(self) -> int:
        """The physical column up to which the loop must run for every row to hold ``T`` valid
        steps (counting the dead steps known so far)."""
        return int((self.start + self.pending_dead).max()) + self.steps

    def floor(self) -> int:
        """The first physical column still needed."""
        floor = int(self.start.min()) if self.num_envs else self.used
        if self.keep is not None:
            floor = min(floor, self.keep - self.base)
        return max(floor, 0)

    def make_room(self, need: int) -> None:
        """Make at least ``need`` free columns after :attr:`used`: move the columns still
        needed (from :meth:`floor`) to the front, or reallocate with more capacity when they
        would fill more than a third of it (so that, amortized, a column moves at most about
        once every two columns written). Views of columns (e.g. the adapter's current
        observation) are stale afterwards."""
        if self.capacity - self.used >= need:
            return
        floor = self.floor()
        live = self.used - floor
        if live + need > self.capacity or 3 * live > self.capacity:
            capacity = max(2 * self.capacity, 3 * live + need)
            for key, old in list(self.arrays.items()):
                new = np.zeros((capacity, *old.shape[1:]), old.dtype)
                new[:live] = old[floor : self.used]
                self.arrays[key] = new
            dead = np.zeros((capacity, self.num_envs), np.bool_)
            dead[:live] = self.dead[floor : self.used]
            self.dead = dead
            self.capacity = capacity
            self.version += 1
        else:  # a memmove per key; the freed columns keep stale values, except `dead`
            for a in self.arrays.values():
                a[:live] = a[floor : self.used]
            self.dead[:live] = self.dead[floor : self.used]
            self.dead[live : self.used] = False
        self.start -= floor
        self.base += floor
        self.used = live

    def count_dead(self, start: int, stop: int) -> np.ndarray:
        """The dead columns of every row in ``[start, stop)`` (int ``[B]``)."""
        return np.count_nonzero(self.dead[start:stop], axis=0)

    # ------------------------------------------------------------------ batches
    def span(self) -> Span:
        """Where the next batch's steps are (every row must hold ``T`` valid steps from its
        ``start``: see :meth:`target`). Dead steps are few (one per episode end), so they are
        found sparsely and the runs between them computed on them alone."""
        steps, b, start = self.steps, self.num_envs, self.start
        lo = int(start.min()) if b else 0
        # Flat positions (column-major order); a 2-D np.nonzero costs ~10x more.
        dead_col, dead_row = np.divmod(np.flatnonzero(self.dead[lo : self.used]), b)
        if dead_col.size:
            dead_col += lo
            after = dead_col >= start[dead_row]
            dead_row, dead_col = dead_row[after], dead_col[after]
            by_row = stable_order(dead_row, b)  # rows in order, columns in order within
            dead_row, dead_col = dead_row[by_row], dead_col[by_row]
            counts = np.bincount(dead_row, minlength=b)
            rank = np.arange(dead_row.size) - (np.cumsum(counts) - counts)[dead_row]
            inside = dead_col - start[dead_row] - rank < steps  # before the row's T-th step
            dead_row, dead_col, rank = dead_row[inside], dead_col[inside], rank[inside]
            n_inside = np.bincount(dead_row, minlength=b)
            dead_after = counts - n_inside
        else:
            n_inside = dead_after = np.zeros(b, np.int64)
        stop = start + steps + n_inside
        # Runs: row b has n_inside[b] + 1 of them, split at its dead steps.
        n_runs = n_inside + 1
        first_run = np.cumsum(n_runs) - n_runs
        run_first = np.empty(int(n_runs.sum()), np.int64)
        run_end = np.empty_like(run_first)
        run_first[first_run] = start
        run_end[first_run + n_inside] = stop
        if dead_row.size:
            at = first_run[dead_row] + rank
            run_end[at] = dead_col
            run_first[at + 1] = dead_col + 1
        run_row = np.repeat(self._rows, n_runs)
        return Span(start.copy(), stop, run_row, run_first, run_end - run_first, dead_after)

    def advance(self, span: Span) -> None:
        """The span's steps are taken: each row's next batch starts after them."""
        self.start = span.stop.copy()
        self.pending_dead = span.dead_after.copy()

    def gather(
        self, flat: np.ndarray, shape: tuple[int, ...], extra: dict[Key, Any] | None = None
    ) -> dict[Key, np.ndarray]:
        """Copy the steps at flat staging positions ``flat`` (``column * B + row``) out of
        every array, as ``[*shape, ...]`` per key (``prod(shape) == len(flat)``); ``extra``
        maps more keys to ``(per-step shape, dtype)``: uninitialised outputs for the caller
        to fill, in the same memory block (see :class:`_Recycler`)."""
        out = self._outputs(shape, extra)
        for key, a in self.arrays.items():
            rows = a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])
            # mode="clip": with mode="raise" (the default) numpy buffers `out` (a second copy);
            # the positions are in range, so nothing is clipped.
            target = out[key].reshape(len(flat), *a.shape[2:])
            np.take(rows, flat, axis=0, out=target, mode="clip")
        return out

    def _outputs(
        self, shape: tuple[int, ...], extra: dict[Key, Any] | None
    ) -> dict[Key, np.ndarray]:
        """Uninitialised ``[*shape, ...]`` outputs for every array and ``extra`` key."""
        layout = [(k, a.shape[2:], a.dtype) for k, a in self.arrays.items()]
        layout += [(k, tuple(f), np.dtype(d)) for k, (f, d) in (extra or {}).items()]
        return self._recycler.outputs(layout, shape)

    def take(self, extra: dict[Key, Any] | None = None) -> dict[Key, np.ndarray]:
        """Copy the next batch (the first ``T`` valid steps of every row) out of the columns,
        ``[B, T, ...]`` per key, and advance past it. ``extra``: as for :meth:`gather`."""
        steps, b = self.steps, self.num_envs
        if not self.batched:  # one env, never any dead step: one slice copy per key
            first = int(self.start[0])
            out = self._outputs((1, steps), extra)
            for key, a in self.arrays.items():
                out[key][0] = a[first : first + steps, 0]
            self.start += steps
        else:
            span = self.span()
            out = self.gather(span.flat(b), (b, steps), extra)
            self.advance(span)
        return out

    def to_tensordict(self, columns: dict[Key, np.ndarray], flags: tuple[Key, ...]) -> TensorDict:
        """The ``[B, T]`` (``[T]`` for a single env) batch of ``[B, T, ...]`` columns, without
        copies; the ``flags`` keys get a trailing ``[1]`` dim (the data contract's flags);
        object columns become non-tensor entries (:func:`splice._non_tensor.to_non_tensor`)."""
        size = [self.num_envs, self.steps] if self.batched else [self.steps]
        if not self.batched:
            columns = {key: value[0] for key, value in columns.items()}
        return nested_tensordict(columns, flags, size)


class _Recycler:
    """Output blocks for copied-out batches, reused once nothing refers to them any more.

    Every key of a batch is a view into one block. A block whose batch is still held
    anywhere (a tensor, a view, a TensorDict, an array) is referenced through those views
    and is never reused: a new block is allocated instead. Once the caller dropped every
    piece of the batch, only this object refers to the block (``sys.getrefcount``), and the
    next batch is written into it. Fresh memory costs a page fault per 4 KiB on first
    write, and the C allocator returns freed blocks of this size to the system, so at 1024
    envs a new block per batch cost as much as the copy itself.

    The two newest blocks are kept: ``for batch in collector`` holds the previous batch while
    the next one is made (the loop variable), and ``trajs_per_batch`` can emit two batches
    before the caller sees the first; with one block, each of those made a fresh block.
    """

    KEPT = 2

    def __init__(self) -> None:
        self._blocks: list[np.ndarray] = []

    def _free_block(self, nbytes: int) -> np.ndarray:
        """A kept block of at least ``nbytes`` that nothing else refers to, or a new one."""
        for block in self._blocks:
            # 3 references: the list, the loop variable and getrefcount's argument; more: a
            # batch holds it
            if block.nbytes >= nbytes and sys.getrefcount(block) <= 3:
                return block
        # a quarter more: sets of whole episodes (trajs_per_batch) vary in size
        block = np.empty(nbytes + nbytes // 4, np.uint8)
        self._blocks = [block, *self._blocks][: self.KEPT]
        return block

    def outputs(
        self, layout: list[tuple[Key, tuple[int, ...], np.dtype[Any]]], shape: tuple[int, ...]
    ) -> dict[Key, np.ndarray]:
        n = math.prod(shape)
        sizes = [
            0 if d == OBJECT else -(-n * math.prod(f) * d.itemsize // 64) * 64 for _, f, d in layout
        ]
        block = self._free_block(max(sum(sizes), 1))
        out, offset = {}, 0
        for (key, feature, dtype), size in zip(layout, sizes, strict=True):
            if dtype == OBJECT:  # Python objects cannot live in a byte block
                out[key] = np.empty((*shape, *feature), OBJECT)
                continue
            view = block[offset : offset + n * math.prod(feature) * dtype.itemsize]
            out[key] = view.view(dtype).reshape(*shape, *feature)
            offset += size
        return out


def nested_tensordict(
    columns: dict[Key, np.ndarray], flags: tuple[Key, ...], batch_size: list[int]
) -> TensorDict:
    """A TensorDict of numpy columns (shared memory, no copy), built from nested dicts
    (a third cheaper than setting nested keys one by one): ``flags`` get a trailing ``[1]``
    dim, object columns become non-tensor entries.

    The entries are made here with the batch's leading dims, so the TensorDict skips its
    per-entry validation (``_new_unsafe``, as in :mod:`splice.replay._output`): 4 us instead
    of 45 us for a batch's 14 entries. The trailing dim is added in numpy (``reshape``: the
    same strides as ``Tensor.unsqueeze``, at a tenth of its cost).
    """
    nested: dict[str, Any] = {}
    for key, value in columns.items():
        if value.dtype == OBJECT:
            entry: Any = to_non_tensor(value)
        else:
            entry = torch.from_numpy(value.reshape(*value.shape, 1) if key in flags else value)
        node = nested
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = entry
    return TensorDict._new_unsafe(nested, batch_size=torch.Size(batch_size))
