"""Checks of everything a replay buffer reads back before it trusts it.

A buffer restores state from three places: a directory written by ``dumps`` (``loads``), a
``state_dict`` (``load_state_dict``) and the files of a ``LazyMemmapStorage`` (reopening).
None of them is trusted: every number is range-checked, every array's dtype and size, and the
derived structures are checked against the one thing they are derived from — the stored
trajectory key of every live row:

* :func:`check_index` rebuilds a reference index from the keys (the same incremental code that
  built the original) and accepts the saved index only if it describes the same trajectories,
  steps and segments (slots and segment ids may be numbered differently; free lists must be
  exactly the unused ids);
* :func:`check_keys` checks the keys against the stored data: with ids, every live row's key
  is its stored id; with end flags, a flagged step is the last of its trajectory;
* :func:`recover_commit` checks a memory-mapped directory's commit state against the write
  sequence numbers of its rows (the rows of an interrupted extend are dropped, anything else
  out of order is refused);
* the samplers check their own saved sets, trees and epochs against the index (they call
  :func:`check_members`, :func:`check_epoch`, :func:`check_weights`);
* :func:`splice.replay._persist.check_snapshot` checks a whole dump or state dict with these.

Every error is a ``ValueError`` that names the file (or state-dict entry) and the field. Nothing
here changes a buffer: the caller installs a state only once every check has passed.

Examples:
    >>> import numpy as np
    >>> from splice.replay.index import ReplayIndex
    >>> ix = ReplayIndex(4)
    >>> _ = ix.write(np.array([5, 5, 6]))
    >>> state = ix.state()
    >>> check_index(state, 4, Source()).describe(2)
    (6, 0)
    >>> state.row_slot[1] = 1  # row 1 claims the other trajectory's slot
    >>> try:
    ...     check_index(state, 4, Source())
    ... except ValueError as err:
    ...     print(err)
    state dict: index['row_slot']: rows of one trajectory have different slots (row 0: 0, row 1: 1)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from splice.layout import CUT, Key, fmt_key
from splice.replay._state import as_int
from splice.replay._structures import I64, KeyMapState, PoolState
from splice.replay.index import IndexState, ReplayIndex

if TYPE_CHECKING:
    from torch import Tensor

    from splice.replay._boundaries import Boundaries
    from splice.replay._structures import DenseSet, EpochState

__all__ = [
    "MAX_POSITION",
    "Source",
    "check_epoch",
    "check_index",
    "check_keys",
    "check_members",
    "check_weights",
    "float_array",
    "int_array",
    "int_in",
    "recover_commit",
    "weight_limit",
]

#: The largest write count (and step number) accepted: far beyond any real run, far below
#: int64 overflow.
MAX_POSITION = 1 << 62


class Source:
    """Where the parts of a snapshot come from, to name them in error messages.

    Args:
        root: the directory given to ``loads`` (None: a state dict).
        data: the directory holding the dump's files (under ``root``).

    Examples:
        >>> Source().entry("index", "lo")
        "state dict: index['lo']"
        >>> Source(Path("/d"), Path("/d/v-1")).entry("index", "row_slot", array=True)
        '/d/v-1/index/row_slot.npy'
    """

    def __init__(self, root: Path | None = None, data: Path | None = None) -> None:
        self.root = root
        self.data = data if data is not None else root

    @property
    def header(self) -> str:
        """The document holding the header (the state dict, or ``buffer.json``)."""
        return "state dict" if self.root is None else str(self.root / "buffer.json")

    def field(self, name: str) -> str:
        """A header field."""
        return f"{self.header}: {name}"

    def entry(self, group: str, name: str, *, array: bool = False) -> str:
        """An entry of the index or sampler state (``array``: stored as a ``.npy`` file)."""
        if self.root is None:
            return f"state dict: {group}[{name!r}]"
        if array:
            assert self.data is not None
            return str(self.data / group / f"{name}.npy")
        return f"{self.header}: {group}.{name}"

    def group(self, group: str) -> str:
        """The index or sampler state as a whole."""
        if self.root is None:
            return f"state dict: {group}"
        assert self.data is not None
        return f"{self.data / group} (and {self.header})"

    def column(self, i: int, key: Key) -> str:
        """A stored column."""
        if self.root is None:
            return f"state dict: columns[{i}] ({fmt_key(key)})"
        assert self.data is not None
        return f"{self.data / 'storage' / f'col_{i:03d}.bin'} ({fmt_key(key)})"


# ---------------------------------------------------------------------- scalars and arrays
def int_in(value: object, where: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``, else ``ValueError`` naming ``where``."""
    number = as_int(value, where)
    if not low <= number <= high:
        raise ValueError(f"{where}: {number} is out of range [{low}, {high}]")
    return number


def int_array(value: object, where: str, size: int | None = None) -> np.ndarray:
    """``value`` as a 1-D int64 array (a copy), else ``ValueError`` naming ``where``:
    only integer dtypes are accepted (no bool, float or object arrays)."""
    array = np.asarray(value)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ValueError(
            f"{where}: expected a 1-D integer array, got {array.dtype} of shape {list(array.shape)}"
        )
    if size is not None and array.size != size:
        raise ValueError(f"{where}: expected {size} entries, got {array.size}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(I64).max:
        raise ValueError(f"{where}: values beyond int64")
    return array.astype(I64)


def float_array(value: object, where: str, size: int, limit: float) -> np.ndarray:
    """``value`` as a 1-D float64 array of ``size`` finite numbers in ``[0, limit]``."""
    array = np.asarray(value)
    if array.ndim != 1 or array.dtype.kind not in "fiu":
        raise ValueError(
            f"{where}: expected a 1-D float array, got {array.dtype} of shape {list(array.shape)}"
        )
    if array.size != size:
        raise ValueError(f"{where}: expected {size} entries, got {array.size}")
    out = array.astype(np.float64)
    bad = ~np.isfinite(out) | (out < 0) | (out > limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{where}: entry {i} is {float(out[i])!r}, not a number in [0, {limit:.3g}]"
        )
    return out


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _present(ids: np.ndarray, size: int) -> np.ndarray:
    """Which of ``0 .. size-1`` occur in ``ids`` (all within range): O(n + size), no sort."""
    mask = np.zeros(size, dtype=bool)
    mask[ids] = True
    return mask


def _distinct(ids: np.ndarray, size: int) -> bool:
    """Whether ``ids`` (all in ``[0, size)``) has no repeats: O(n + size), no sort."""
    return int(np.count_nonzero(_present(ids, size))) == ids.size


# ---------------------------------------------------------------------- the index
def _pool(
    state: PoolState, fields: tuple[str, ...], capacity: int, src: Source, name: str
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """The checked arrays of a saved :class:`~splice.replay._structures.Pool`."""
    free = int_array(state.free, src.entry("index", f"{name}.free", array=True))
    size = free.size
    # A pool grows by doubling from 64 while it holds at most one id per stored row.
    if size > 2 * capacity + 64:
        raise ValueError(
            f"{src.entry('index', f'{name}.free', array=True)}: {size} ids for {capacity} rows"
        )
    arrays = {
        f: int_array(
            state.fields.get(f), src.entry("index", f"{name}.fields.{f}", array=True), size
        )
        for f in fields
    }
    n_free = int_in(state.n_free, src.entry("index", f"{name}.n_free"), 0, size)
    return arrays, free, n_free


def _bijection(
    saved: np.ndarray,
    ref: np.ndarray,
    rows: np.ndarray,
    sizes: tuple[int, int],
    where: str,
    what: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check that ``saved`` labels the live ``rows`` as ``ref`` does, up to renaming (``what``:
    slots of trajectories or ids of segments); return the renaming ``ref id -> saved id`` and
    the used ids ``(ref, saved)``."""
    saved_size, ref_size = sizes
    outside = (saved < 0) | (saved >= saved_size)
    if outside.any():
        i = _first(outside)
        raise ValueError(f"{where}: row {rows[i]} has {what} {saved[i]}, beyond [0, {saved_size})")
    rename = np.full(ref_size, -1, dtype=I64)
    rename[ref] = saved
    split = rename[ref] != saved
    if split.any():
        i = _first(split)
        a, b = sorted((i, _first((ref == ref[i]) & (saved != saved[i]))))
        raise ValueError(
            f"{where}: rows of one {'trajectory' if what == 'slot' else 'segment'} have "
            f"different {what}s (row {rows[a]}: {saved[a]}, row {rows[b]}: {saved[b]})"
        )
    used_ref = np.flatnonzero(_present(ref, ref_size))
    used_saved = rename[used_ref]
    if not _distinct(used_saved, saved_size):
        raise ValueError(
            f"{where}: two {'trajectories' if what == 'slot' else 'segments'} share a {what}"
        )
    return rename, used_ref, used_saved


def _free_list(free: np.ndarray, n_free: int, used: np.ndarray, size: int, where: str) -> None:
    listed = free[:n_free]
    expected = np.ones(size, dtype=bool)
    expected[used] = False
    ok = (
        listed.size == int(expected.sum())
        and ((listed >= 0) & (listed < size)).all()
        and _distinct(listed, size)
        and expected[listed].all()
    )
    if not ok:
        raise ValueError(
            f"{where}: the free list is not exactly the {int(expected.sum())} unused ids"
        )


def _same(saved: np.ndarray, expected: np.ndarray, where: str, what: str) -> None:
    differ = saved != expected
    if differ.any():
        i = _first(differ)
        raise ValueError(f"{where}: {what} {saved[i]}, expected {expected[i]} from the stored keys")


def check_index(state: IndexState, capacity: int, src: Source) -> ReplayIndex:
    """Check a saved index against a reference rebuilt from its rows' trajectory keys, and
    return a new :class:`ReplayIndex` holding it.

    Accepted differences: slots and segment ids may be numbered differently (the saved
    numbering is kept, so that a sampler's saved state still refers to the right
    trajectories), step numbers may be offset per trajectory, ids that are not in use may hold
    anything but a trajectory key, and the first segment of a trajectory may start before its
    first live row (rows overwritten since).

    Raises:
        ValueError: anything else, naming the entry (the ``.npy`` file of a dump).
    """

    def arr(name: str) -> str:
        return src.entry("index", name, array=True)

    wc = int_in(state.write_count, src.entry("index", "write_count"), 0, MAX_POSITION)
    lo = int_in(state.lo, src.entry("index", "lo"), max(0, wc - capacity), wc)
    row_key = int_array(state.row_key, arr("row_key"), capacity)
    row_slot = int_array(state.row_slot, arr("row_slot"), capacity)
    row_step = int_array(state.row_step, arr("row_step"), capacity)
    row_seg = int_array(state.row_seg, arr("row_seg"), capacity)
    ref = ReplayIndex(capacity, row_key=row_key.copy())
    live = np.arange(lo, wc, dtype=I64) % capacity
    negative = row_key[live] < 0
    if negative.any():
        i = int(live[_first(negative)])
        raise ValueError(f"{arr('row_key')}: row {i} holds a step but key {row_key[i]} < 0")
    ref.rebuild(lo, wc)
    dead = np.ones(capacity, dtype=bool)
    dead[live] = False
    if (row_slot[dead] != -1).any():
        i = _first(dead & (row_slot != -1))
        raise ValueError(f"{arr('row_slot')}: row {i} holds no step but has slot {row_slot[i]}")

    T, t_free, t_nfree = _pool(state.traj, ref.traj.fields, capacity, src, "traj")
    S, s_free, s_nfree = _pool(state.seg, ref.seg.fields, capacity, src, "seg")
    P, Q = t_free.size, s_free.size
    r_slot, r_seg = ref.row_slot[live], ref.row_seg[live]
    _, used_r, used_s = _bijection(
        row_slot[live], r_slot, live, (P, ref.traj.size), arr("row_slot"), "slot"
    )
    seg_of, used_rseg, used_sseg = _bijection(
        row_seg[live], r_seg, live, (Q, ref.seg.size), arr("row_seg"), "segment id"
    )
    # Steps: consecutive in write order, offset by one number per trajectory.
    if live.size and int(np.abs(row_step[live]).max()) >= MAX_POSITION:
        raise ValueError(f"{arr('row_step')}: step numbers out of range")
    delta = row_step[live] - ref.row_step[live]
    offset = np.zeros(ref.traj.size, dtype=I64)
    offset[r_slot] = delta
    if (offset[r_slot] != delta).any():
        i = int(live[_first(offset[r_slot] != delta)])
        raise ValueError(
            f"{arr('row_step')}: row {i}: the steps of a trajectory are not consecutive in "
            "write order"
        )

    def renamed_seg(ids: np.ndarray) -> np.ndarray:
        return np.where(ids >= 0, seg_of[np.maximum(ids, 0)], -1)

    R = ref.traj.a
    for name, expected in (
        ("key", R["key"][used_r]),
        ("first", R["first"][used_r] + offset[used_r]),
        ("last", R["last"][used_r] + offset[used_r]),
        ("first_row", R["first_row"][used_r]),
        ("last_row", R["last_row"][used_r]),
        ("last_seg", renamed_seg(R["last_seg"][used_r])),
    ):
        _same(T[name][used_s], expected, arr(f"traj.fields.{name}"), "a trajectory has")
    unused = np.ones(P, dtype=bool)
    unused[used_s] = False
    if (T["key"][unused] != -1).any():
        i = _first(unused & (T["key"] != -1))
        raise ValueError(
            f"{arr('traj.fields.key')}: slot {i} holds no stored step but key {T['key'][i]}"
        )
    _free_list(t_free, t_nfree, used_s, P, arr("traj.free"))

    RS = ref.seg.a
    for name in ("hi", "back", "fwd"):
        expected = RS[name][used_rseg]
        if name != "hi":
            expected = renamed_seg(expected)
        _same(S[name][used_sseg], expected, arr(f"seg.fields.{name}"), "a segment has")
    saved_lo, ref_lo = S["lo"][used_sseg], RS["lo"][used_rseg]
    # The first segment of a trajectory may start at rows overwritten since.
    bad_lo = (saved_lo != ref_lo) & ~((RS["back"][used_rseg] < 0) & (saved_lo <= ref_lo))
    if bad_lo.any():
        i = _first(bad_lo)
        raise ValueError(
            f"{arr('seg.fields.lo')}: a segment starts at row {saved_lo[i]}, expected "
            f"{ref_lo[i]} from the stored keys"
        )
    _free_list(s_free, s_nfree, used_sseg, Q, arr("seg.free"))

    keys = int_array(state.keys.keys, arr("keys.keys"))
    vals = int_array(state.keys.vals, arr("keys.vals"), keys.size)
    n_dead = int_in(state.keys.n_dead, src.entry("index", "keys.n_dead"), 0, keys.size)
    if keys.size > 1 and (keys[1:] <= keys[:-1]).any():
        raise ValueError(f"{arr('keys.keys')}: keys are not sorted and distinct")
    alive = vals >= 0
    if (vals[~alive] != -1).any() or int((~alive).sum()) != n_dead:
        raise ValueError(f"{arr('keys.vals')}: bad tombstones (or keys.n_dead)")
    order = np.argsort(R["key"][used_r])
    if not (
        np.array_equal(keys[alive], R["key"][used_r][order])
        and np.array_equal(vals[alive], used_s[order])
    ):
        raise ValueError(f"{arr('keys.vals')}: the key map does not map each key to its slot")

    out = ReplayIndex(capacity, row_key=row_key)
    out.restore(
        IndexState(
            row_slot=row_slot,
            row_step=row_step,
            row_seg=row_seg,
            row_key=row_key,
            write_count=wc,
            lo=lo,
            traj=PoolState(T, t_free, t_nfree),
            seg=PoolState(S, s_free, s_nfree),
            keys=KeyMapState(keys, vals, n_dead),
        )
    )
    return out


# ---------------------------------------------------------------------- keys against data
def check_keys(
    row_key: np.ndarray,
    lo: int,
    write_count: int,
    bounds: Boundaries | None,
    columns: Mapping[Key, Tensor],
    *,
    keys_where: str,
    column_where: Mapping[Key, str],
) -> None:
    """Check the trajectory keys of the live rows (global positions ``[lo, write_count)``)
    against the stored data and the boundary state.

    * ids: each key is the row's stored id (garbage keys would join or split trajectories);
    * end flags: a flagged step (not a collector cut) is the last of its trajectory, and every
      key is below the next key to hand out;
    * open keys (flags) are -1 or below the next key; ids keep none.

    Raises:
        ValueError: naming the keys file (``keys_where``) or the column.
    """
    capacity = row_key.size
    n = write_count - lo
    if n > 0 and bounds is None:
        raise ValueError(f"{keys_where}: rows are stored but there is no boundary state")
    if bounds is None:
        return
    rows = np.arange(lo, write_count, dtype=I64) % capacity
    keys = row_key[rows]
    if (keys < 0).any():
        i = int(rows[_first(keys < 0)])
        raise ValueError(f"{keys_where}: row {i} holds a step but key {row_key[i]} < 0")
    if bounds.mode == "ids":
        if bounds.open_keys.size or bounds.next_key != 0:
            raise ValueError(f"{keys_where}: boundaries from ids keep no open or next key")
        key = bounds.key
        if n == 0:
            return
        if key is None or key not in columns:
            raise ValueError(f"{keys_where}: the trajectory ids {key} are not stored")
        ids = columns[key].reshape(columns[key].shape[0], -1)
        if ids.shape[1] != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex:
            raise ValueError(f"{column_where[key]}: trajectory ids must be one integer per step")
        stored = ids[:, 0].numpy()[rows].astype(I64)
        differ = stored != keys
        if differ.any():
            i = _first(differ)
            raise ValueError(
                f"{keys_where}: row {rows[i]} has trajectory key {keys[i]}, but its stored id "
                f"{fmt_key(key)} is {stored[i]} ({column_where[key]})"
            )
        return
    open_keys = bounds.open_keys
    if ((open_keys < -1) | (open_keys >= max(bounds.next_key, 0))).any() or bounds.next_key < 0:
        raise ValueError(f"{keys_where}: open keys {open_keys.tolist()} beyond next_key")
    if n and int(keys.max()) >= bounds.next_key:
        raise ValueError(
            f"{keys_where}: key {int(keys.max())} is not below next_key {bounds.next_key}"
        )
    if bounds.mode != "flags" or n == 0:
        return
    flag = bounds.key
    if flag is None or flag not in columns:
        raise ValueError(f"{keys_where}: the end flags {flag} are not stored")
    ends = columns[flag].reshape(columns[flag].shape[0], -1).any(1).numpy()[rows]
    if CUT in columns:
        ends &= ~columns[CUT].reshape(columns[CUT].shape[0], -1).any(1).numpy()[rows]
    # The last position of each key among the live rows.
    _, from_end = np.unique(keys[::-1], return_index=True)
    last = np.zeros(n, dtype=bool)
    last[n - 1 - from_end] = True
    wrong = ends & ~last
    if wrong.any():
        i = _first(wrong)
        raise ValueError(
            f"{keys_where}: row {rows[i]} ends a trajectory ({fmt_key(flag)} is set, "
            f"{column_where[flag]}) but later rows carry the same key {keys[i]}"
        )


# ---------------------------------------------------------------------- memory-mapped commits
def recover_commit(
    write_count: object,
    lo: object,
    seq: object,
    row_seq: np.ndarray,
    *,
    meta_where: str,
    seq_where: str,
) -> tuple[int, int, int]:
    """The checked ``(write_count, lo, seq)`` of a memory-mapped storage, ``lo`` moved past
    the rows of an interrupted extend.

    Every extend marks the rows it is about to write with the next sequence number, writes
    them, then commits that number. So, in write order, the live rows carry: first, possibly,
    the rows an interrupted extend had begun to overwrite (marked ``seq + 1``: dropped), then
    non-decreasing numbers ending with ``seq`` (the last completed extend). Anything else
    means the files and the metadata do not belong together.

    Raises:
        ValueError: naming ``meta.json`` (``meta_where``) or ``rows_seq.bin`` (``seq_where``).
    """
    capacity = row_seq.size
    wc = int_in(write_count, f"{meta_where}: buffer.write_count", 0, MAX_POSITION)
    first = int_in(lo, f"{meta_where}: buffer.lo", max(0, wc - capacity), wc)
    committed = int_in(seq, f"{meta_where}: seq", 0, MAX_POSITION)
    beyond = (row_seq < 0) | (row_seq > committed + 1)
    if beyond.any():
        i = _first(beyond)
        raise ValueError(
            f"{seq_where}: row {i} has write sequence number {row_seq[i]}, outside "
            f"[0, {committed + 1}] (seq {committed} in {meta_where})"
        )
    rows = np.arange(first, wc, dtype=I64) % capacity
    marks = row_seq[rows]
    torn = marks == committed + 1
    n_torn = int(np.argmin(torn)) if not torn.all() else torn.size
    rest = marks[n_torn:]
    if rest.size:
        if (rest == committed + 1).any():
            i = int(rows[n_torn + _first(rest == committed + 1)])
            raise ValueError(
                f"{seq_where}: row {i} is marked by an interrupted write but follows rows "
                "written before it"
            )
        down = np.diff(rest) < 0
        if down.any():
            i = int(rows[n_torn + _first(down) + 1])
            raise ValueError(
                f"{seq_where}: rows are not in write order at row {i} (the live range "
                f"[{first}, {wc}) of {meta_where} does not match the files)"
            )
        if rest[-1] != committed:
            raise ValueError(
                f"{seq_where}: the newest row was written by extend {rest[-1]}, but "
                f"{meta_where} committed extend {committed}"
            )
    return wc, first + n_torn, committed


# ---------------------------------------------------------------------- sampler states
def check_members(
    items: object, universe: object, expected: DenseSet, name: str, *, built: bool = True
) -> tuple[np.ndarray, int]:
    """Check a saved :class:`~splice.replay._structures.DenseSet` (``name.items``,
    ``name.universe``) against the set a sampler derives from the index: same universe,
    same members (the saved order is kept: it decides the draws). A set the sampler has not
    built yet (``built=False``, empty) kept the universe it was made with, which may be
    smaller than the index's (it grows with the index only once built)."""
    low = expected.pos.size if built else 0
    size = int_in(universe, f"{name}.universe", low, expected.pos.size)
    members = int_array(items, f"{name}.items")
    inside = (members >= 0) & (members < size)
    if not inside.all():
        raise ValueError(f"{name}.items: member {members[_first(~inside)]} beyond [0, {size})")
    if not _distinct(members, size):
        raise ValueError(f"{name}.items: repeated members")
    if members.size != len(expected) or not expected.contains(members).all():
        raise ValueError(
            f"{name}.items: {members.size} members, not the {len(expected)} the index implies"
        )
    return members, size


def check_epoch(state: EpochState, name: str, high: int, *, tagged: bool) -> None:
    """Check a saved epoch: items in ``[0, high)`` (global positions or slots), one tag per
    item when ``tagged`` (none otherwise), a cursor within the items."""
    items = int_array(state.items, f"{name}.items")
    tags = int_array(state.tags, f"{name}.tags", items.size if tagged else 0)
    del tags
    outside = (items < 0) | (items >= high)
    if outside.any():
        raise ValueError(f"{name}.items: item {items[_first(outside)]} beyond [0, {high})")
    int_in(state.cursor, f"{name}.cursor", 0, items.size)


def weight_limit(capacity: int) -> float:
    """The largest sampling weight of one stored row: ``capacity`` of them (and the running
    sums over them) stay finite."""
    return sys.float_info.max / (2 * capacity)


def check_weights(priority: np.ndarray, weight: np.ndarray, limit: float) -> None:
    """Refuse priorities whose sampling weight (``(p + eps) ** alpha``, or ``p + eps``
    itself for a slice's mean) is not finite or above ``limit`` (:func:`weight_limit`).

    Raises:
        ValueError: naming the first such priority.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        bad = ~np.isfinite(weight) | (weight > limit)
    if bad.any():
        i = _first(bad.reshape(-1))
        raise ValueError(
            f"priority {float(priority.reshape(-1)[i])!r} gives a sampling weight "
            f"{float(weight.reshape(-1)[i])!r} above {limit:.3g}, the largest whose sum over the "
            "buffer stays finite: priorities that large are refused (nothing was updated)"
        )
