"""``split_trajectories`` (steps -> one row per trajectory) and its inverse ``cat_trajectories``."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice._gather import take_rows
from splice.contract import flatten_steps
from splice.layout import NEXT, PADDING_ID, Key, LayoutError, as_key_tuple, fmt_key
from splice.trajectories._index import TrajectoryIndex, ids_from_done, index_by_id
from splice.trajectories._tensordict import leaves, map_leaves, resolve_trajectory_keys

Columns = dict[Key, Tensor]

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
            mismatch (the batch contract of :mod:`splice.contract`).
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
    ids_key, mask_key = resolve_trajectory_keys(td, trajectory_key, prefix)
    steps = flatten_steps(
        td, ids_key=ids_key, mask_key=mask_key, context="split_trajectories' input"
    )
    columns = dict(steps.columns)
    ids = steps.ids
    if ids is None:
        done_key = (NEXT, *as_key_tuple(done_key if done_key is not None else "done"))
        done = steps.flag(done_key)
        if done is None:
            raise LayoutError(
                f"no trajectory ids at {fmt_key(ids_key)} and no done flags at "
                f"{fmt_key(done_key)} to derive them from"
            )
        ids = ids_from_done(done, steps.batch_shape).reshape(-1)
        columns[ids_key] = ids
    if steps.real is not None:
        keep = steps.real.nonzero().squeeze(1)
        columns = {key: take_rows(x, keep) for key, x in columns.items()}
        ids = ids[keep]
    index = index_by_id(ids)
    if as_nested is False:
        return to_padded(columns, index, ids_key=ids_key, mask_key=mask_key, device=td.device)
    return to_nested(
        columns, index, mask_key=mask_key, layout=_nested_layout(as_nested), device=td.device
    )


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
        TypeError: ``td`` is not a TensorDict.
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
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"cat_trajectories expects a TensorDict, got {type(td).__name__}")
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
    columns: Columns,
    index: TrajectoryIndex,
    *,
    ids_key: Key | None,
    mask_key: Key,
    device: torch.device | None = None,
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

    out = {key: scatter(key, x) for key, x in columns.items()}
    mask = torch.zeros(n_rows * max_len, dtype=torch.bool, device=dest.device)
    mask[dest] = True
    out[mask_key] = mask.view(n_rows, max_len)
    return TensorDict(out, batch_size=[n_rows, max_len], device=device)


def to_nested(
    columns: Columns,
    index: TrajectoryIndex,
    *,
    mask_key: Key,
    layout: torch.layout,
    device: torch.device | None = None,
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
        columns = {key: take_rows(x, order) for key, x in columns.items()}
    columns = dict(columns)
    columns[mask_key] = torch.ones(index.n_steps, dtype=torch.bool, device=index.row.device)
    if layout == torch.jagged:
        offsets = index.offsets()
        min_len = int(index.lengths.min()) if index.n_rows else 0
        return TensorDict(
            {
                key: torch.nested.nested_tensor_from_jagged(
                    x, offsets, min_seqlen=min_len, max_seqlen=index.max_len
                )
                for key, x in columns.items()
            },
            batch_size=[index.n_rows],
            device=device,
        )
    lengths = index.lengths
    # A nested tensor whose rows all have the same length reports a regular size.
    ragged = index.n_rows > 0 and bool((lengths != index.max_len).any())
    batch_size = [index.n_rows, -1 if ragged else index.max_len]
    return TensorDict(
        {key: _strided_view(x, lengths) for key, x in columns.items()},
        batch_size=batch_size,
        device=device,
    )


def _strided_view(values: Tensor, lengths: Tensor) -> Tensor:
    """A strided nested tensor viewing ``values`` (``[sum(lengths), *feature]``), no copy.

    torch has no public zero-copy constructor for strided nested tensors
    (``torch.nested.nested_tensor`` copies), so this uses the two private helpers TorchRL's
    ``split_trajectories`` uses too.
    """
    values = values.contiguous()
    feature = torch.tensor(values.shape[1:], dtype=torch.int64)
    sizes = torch.cat([lengths[:, None], feature.expand(lengths.numel(), feature.numel())], 1)
    strides, offsets = torch._nested_compute_contiguous_strides_offsets(sizes)
    return torch._nested_view_from_buffer(values.reshape(-1), sizes, strides, offsets)


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
