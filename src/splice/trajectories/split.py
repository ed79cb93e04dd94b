"""``split_trajectories`` (steps -> one row per trajectory) and its inverse ``cat_trajectories``."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice._gather import take_rows
from splice.layout import NEXT, PADDING_ID, LayoutError, as_key_tuple, check_trajectory_ids
from splice.trajectories._index import TrajectoryIndex, ids_from_done, index_by_id
from splice.trajectories._tensordict import (
    Key,
    flatten_batch,
    leaves,
    map_leaves,
    resolve_trajectory_keys,
)

__all__ = ["cat_trajectories", "split_trajectories", "to_nested", "to_padded"]


def split_trajectories(
    td: TensorDictBase,
    *,
    trajectory_key: NestedKey | None = None,
    done_key: NestedKey | None = None,
    prefix: NestedKey | None = None,
    as_nested: bool | torch.layout = False,
) -> TensorDict:
    """Regroup a batch of steps into one row per trajectory.

    A drop-in replacement for ``torchrl.collectors.utils.split_trajectories``: same arguments,
    defaults, key resolution and output keys, with the rows in the same order. It also fixes
    TorchRL's defects: ids that repeat non-adjacently are grouped by id, padded positions of the
    id key hold ``-1`` (never a valid id), and nested output carries a mask too.

    The input may have any batch shape ``[N]``, ``[B, T]`` or ``[..., T]`` (time last); it is
    flattened env-major. Trajectory boundaries come from the ids at ``trajectory_key`` (default
    ``(prefix, "traj_ids")``, prefix ``"collector"`` when present) or, when there are no ids,
    from ``("next", done_key)`` (default ``("next", "done")``); the derived ids are written to
    the output. Steps whose id is ``-1``, or whose existing mask is False, are padding and
    are dropped; an id below ``-1`` is refused (see :func:`splice.layout.check_trajectory_ids`).
    A batch without real steps (``[0]``, ``[B, 0]``, all padding) gives an empty output:
    ``[0, 0]`` padded, ``[0]`` jagged; a strided nested tensor cannot have zero rows, so
    ``as_nested=True`` refuses it.

    Args:
        td: the batch of steps.
        trajectory_key: key of the trajectory ids. Supersedes ``prefix``.
        done_key: key under ``"next"`` of the done flag, used only when there are no ids.
        prefix: where ``"traj_ids"`` and ``"mask"`` live when ``trajectory_key`` is not given.
        as_nested: ``False`` for zero-padded ``[n_traj, max_len]`` output; ``True`` or
            ``torch.strided`` for strided nested tensors (batch size ``[n_traj, -1]``);
            ``torch.jagged`` for jagged nested tensors (batch size ``[n_traj]``).

    Returns:
        A TensorDict with one row per trajectory, rows in order of first appearance, steps in
        time order, and a boolean mask (True on real steps) next to the ids.

    Raises:
        TypeError: ``td`` is not a TensorDict.
        LayoutError: missing ids and done flags, non-integer ids, ids below ``-1``, or a shape
            mismatch.
        ValueError: ``as_nested=True`` (strided) for a batch without real steps.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice import split_trajectories
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.arange(6.0),
        ...         ("collector", "traj_ids"): torch.tensor([4, 4, 4, 5, 5, 6]),
        ...     },
        ...     batch_size=[6],
        ... )
        >>> out = split_trajectories(batch)
        >>> out.batch_size
        torch.Size([3, 3])
        >>> out["observation"]
        tensor([[0., 1., 2.],
                [3., 4., 0.],
                [5., 0., 0.]])
        >>> out["collector", "traj_ids"]
        tensor([[ 4,  4,  4],
                [ 5,  5, -1],
                [ 6, -1, -1]])
        >>> out["collector", "mask"]
        tensor([[ True,  True,  True],
                [ True,  True, False],
                [ True, False, False]])
    """
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"split_trajectories expects a TensorDict, got {type(td).__name__}")
    if td.ndim == 0:
        raise LayoutError("split_trajectories needs a batch with at least one (time) dimension")
    ids_key, mask_key = resolve_trajectory_keys(td, trajectory_key, prefix)
    ids, derived = _read_ids(td, ids_key, done_key)
    flat = flatten_batch(td.exclude(mask_key))
    if derived:
        flat.set(ids_key, ids.reshape(-1))
    flat, ids = _drop_padding(flat, ids.reshape(-1), td.get(mask_key, None))
    index = index_by_id(ids)
    if as_nested is False:
        return to_padded(flat, index, ids_key=ids_key, mask_key=mask_key)
    return to_nested(flat, index, mask_key=mask_key, layout=_nested_layout(as_nested))


def cat_trajectories(
    td: TensorDictBase,
    *,
    trajectory_key: NestedKey | None = None,
    prefix: NestedKey | None = None,
) -> TensorDict:
    """Flatten trajectories back to the "cat" layout ``[sum of lengths]``: the inverse split.

    Accepts the padded ``[n_traj, max_len]`` output of :func:`~splice.split_trajectories`
    (padding is dropped using the mask) or its nested output. Steps come out trajectory after
    trajectory, in time order; the mask key is removed.
    ``cat_trajectories(split_trajectories(x))`` equals ``x`` with its steps reordered by
    trajectory, exactly.

    Args:
        td: padded or nested trajectories.
        trajectory_key: key of the trajectory ids; the mask is looked up next to it.
        prefix: where ``"mask"`` lives when ``trajectory_key`` is not given (as in split).

    Raises:
        LayoutError: a padded input without a mask, or a mask of the wrong shape or dtype.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from splice import cat_trajectories, split_trajectories
        >>> ids = torch.tensor([[0, 0, 2], [1, 3, 3]])
        >>> batch = TensorDict({("collector", "traj_ids"): ids}, batch_size=[2, 3])
        >>> cat_trajectories(split_trajectories(batch))["collector", "traj_ids"]
        tensor([0, 0, 2, 1, 3, 3])
    """
    _, mask_key = resolve_trajectory_keys(td, trajectory_key, prefix)
    if _is_nested(td):
        return _cat_nested(td, mask_key)
    if td.ndim != 2:
        raise LayoutError(
            f"cat_trajectories expects [n_traj, max_len] trajectories, got batch shape "
            f"{list(td.batch_size)}"
        )
    mask = td.get(mask_key, None)
    if mask is None:
        raise LayoutError(f"cat_trajectories: missing mask key {mask_key!r}")
    if mask.dtype != torch.bool or mask.shape != td.batch_size:
        raise LayoutError(
            f"key {mask_key!r}: expected dtype torch.bool and shape {list(td.batch_size)}, "
            f"got dtype {mask.dtype} and shape {list(mask.shape)}"
        )
    keep = mask.reshape(-1).nonzero().squeeze(1)
    rows = td.batch_size.numel()
    return map_leaves(
        td.exclude(mask_key),
        lambda _, x: take_rows(x.reshape(rows, *x.shape[2:]), keep),
        [keep.numel()],
    )


def to_padded(
    flat: TensorDictBase, index: TrajectoryIndex, *, ids_key: Key | None, mask_key: Key
) -> TensorDict:
    """Scatter flat steps into a zero-padded ``[n_rows, max_len]`` TensorDict with a mask.

    The id key (if given) is padded with ``-1``; every other key with zeros.
    """
    n_rows, max_len = index.n_rows, index.max_len
    dest = index.padded_dest()

    def scatter(key: Key, x: Tensor) -> Tensor:
        fill = PADDING_ID if key == ids_key else 0
        out = x.new_full((n_rows * max_len, *x.shape[1:]), fill)
        out.index_copy_(0, dest, x)
        return out.view(n_rows, max_len, *x.shape[1:])

    out = map_leaves(flat, scatter, [n_rows, max_len])
    mask = torch.zeros(n_rows * max_len, dtype=torch.bool, device=dest.device)
    mask[dest] = True
    out.set(mask_key, mask.view(n_rows, max_len))
    return out


def to_nested(
    flat: TensorDictBase, index: TrajectoryIndex, *, mask_key: Key, layout: torch.layout
) -> TensorDict:
    """One nested tensor per key (rows = trajectories) plus an all-True nested mask.

    Zero-copy when the steps are already laid out trajectory after trajectory.

    Raises:
        ValueError: no trajectory at all with the strided layout (torch has no zero-row strided
            nested tensor with per-step dims).
    """
    if index.n_rows == 0 and layout == torch.strided:
        raise ValueError(
            "split_trajectories(as_nested=True): the batch has no real steps (empty, or all "
            "padding), and a strided nested tensor cannot have zero rows; use "
            "as_nested=torch.jagged or the padded output (as_nested=False), which return an "
            "empty result"
        )
    if not index.cat_is_identity():
        order = index.cat_order()
        flat = map_leaves(flat, lambda _, x: take_rows(x, order), [index.n_steps])
    flat = flat.clone(recurse=False)
    flat.set(mask_key, torch.ones(index.n_steps, dtype=torch.bool, device=index.row.device))
    if layout == torch.jagged:
        offsets = index.offsets()
        min_len = int(index.lengths.min()) if index.n_rows else 0
        return map_leaves(
            flat,
            lambda _, x: torch.nested.nested_tensor_from_jagged(
                x, offsets, min_seqlen=min_len, max_seqlen=index.max_len
            ),
            [index.n_rows],
        )
    lengths = index.lengths
    # A nested tensor whose rows all have the same length reports a regular size.
    ragged = index.n_rows > 0 and bool((lengths != index.max_len).any())
    batch_size = [index.n_rows, -1 if ragged else index.max_len]
    return map_leaves(flat, lambda _, x: _strided_view(x, lengths), batch_size)


def _strided_view(values: Tensor, lengths: Tensor) -> Tensor:
    """A strided nested tensor viewing ``values`` (``[sum(lengths), *feature]``), no copy."""
    values = values.contiguous()
    feature = torch.tensor(values.shape[1:], dtype=torch.int64)
    sizes = torch.cat([lengths[:, None], feature.expand(lengths.numel(), feature.numel())], 1)
    strides, offsets = torch._nested_compute_contiguous_strides_offsets(sizes)
    return torch._nested_view_from_buffer(values.reshape(-1), sizes, strides, offsets)


def _read_ids(td: TensorDictBase, ids_key: Key, done_key: NestedKey | None) -> tuple[Tensor, bool]:
    """The int64 trajectory ids, and whether they were derived from done flags."""
    ids = td.get(ids_key, None)
    if ids is None:
        full_done_key = (NEXT, *as_key_tuple(done_key if done_key is not None else "done"))
        done = td.get(full_done_key, None)
        if done is None:
            raise LayoutError(
                f"no trajectory ids at {ids_key!r} and no done flags at {full_done_key!r} "
                "to derive them from"
            )
        if tuple(done.shape[: td.ndim]) != tuple(td.batch_size):
            raise LayoutError(
                f"key {full_done_key!r}: expected shape [{', '.join(map(str, td.batch_size))}"
                f", ...], got {list(done.shape)}"
            )
        return ids_from_done(done, td.batch_size), True
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise LayoutError(f"key {ids_key!r}: trajectory ids must be integers, got {ids.dtype}")
    if ids.shape != td.batch_size:
        raise LayoutError(
            f"key {ids_key!r}: expected shape {list(td.batch_size)} (the batch shape), "
            f"got {list(ids.shape)}"
        )
    check_trajectory_ids(ids, ids_key)
    return ids.to(torch.int64), False


def _drop_padding(
    flat: TensorDictBase, ids: Tensor, mask: Tensor | None
) -> tuple[TensorDictBase, Tensor]:
    valid = ids >= 0
    if mask is not None:
        valid &= mask.reshape(-1).to(torch.bool)
    if bool(valid.all()):
        return flat, ids
    keep = valid.nonzero().squeeze(1)
    return map_leaves(flat, lambda _, x: take_rows(x, keep), [keep.numel()]), ids[keep]


def _nested_layout(as_nested: bool | torch.layout) -> torch.layout:
    if as_nested is True or as_nested == torch.strided:
        return torch.strided
    if as_nested == torch.jagged:
        return torch.jagged
    raise ValueError(
        f"as_nested must be False, True, torch.strided or torch.jagged, got {as_nested!r}"
    )


def _is_nested(td: TensorDictBase) -> bool:
    return any(x.is_nested for _, x in leaves(td))


def _cat_nested(td: TensorDictBase, mask_key: Key) -> TensorDict:
    def values(_: Key, x: Tensor) -> Tensor:
        if x.layout == torch.jagged:
            return x.values()
        feature = [x.size(d) for d in range(2, x.dim())]
        if x.is_contiguous():
            return x.values().view(-1, *feature)
        return torch.cat(x.unbind(0))

    body = td.exclude(mask_key)
    first = next(iter(leaves(body)), None)
    total = 0 if first is None else values(first[0], first[1]).shape[0]
    return map_leaves(body, values, [total])
