"""Returns and advantages: discounted and n-step returns, TD(λ) returns and GAE."""

from __future__ import annotations

from tensordict import TensorDictBase
from torch import Tensor

from splice.targets import _backend
from splice.targets._inputs import TargetKeys, check_rate, read, tensor, work_dtype


def continues(td: TensorDictBase, keys: TargetKeys | None = None) -> Tensor:
    """Whether each step's target runs on into the next position of its row (bool ``[*batch]``).

    True where the next position along the last batch dim is the same trajectory's next step
    (see the module docs for the rule); False at episode ends, cuts, trajectory changes, the
    last real step before padding, on padding and at the end of every row. The target
    functions are all built on this one rule.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> ids = torch.tensor([3, 3, 3, 4, 4, -1])  # cat layout, then padding
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(6, 1),
        ...     ("next", "terminated"): torch.zeros(6, 1, dtype=torch.bool),
        ...     ("collector", "traj_ids"): ids,
        ...     ("collector", "mask"): ids >= 0,
        ... }, batch_size=[6])
        >>> continues(batch)
        tensor([ True,  True, False,  True, False, False])
    """
    rows = read(td, keys or TargetKeys())
    cont, _ = _backend.for_device(rows.device).continuation(rows)
    return cont.reshape(rows.batch)


def gae(
    td: TensorDictBase,
    value: Tensor | None = None,
    next_value: Tensor | None = None,
    *,
    gamma: float,
    lmbda: float,
    keys: TargetKeys | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Generalized advantage estimates and their value targets.

    :math:`\delta_t = r_t + \gamma (1 - d^{term}_t) V'_t - V_t` and
    :math:`A_t = \delta_t + \gamma \lambda c_t A_{t+1}`, with :math:`c_t` from
    :func:`continues`; the value target is :math:`A_t + V_t` (TorchRL's ``value_target``).

    Args:
        td: the batch (any layout of the module docs).
        value: ``V(observation)`` per step, ``[*batch]`` or ``[*batch, 1]``; default: read
            from ``keys.value`` (``"state_value"``).
        next_value: ``V(("next", "observation"))`` per step; default: read from
            ``keys.next_value`` (``("next", "state_value")``).
        gamma: discount, in ``[0, 1]``.
        lmbda: GAE's lambda, in ``[0, 1]``.
        keys: where to read the inputs (:class:`TargetKeys`).

    Returns:
        ``(advantage, value_target)``, each ``[*batch, 1]`` in the values' dtype, zero on
        padding.

    Raises:
        TypeError: ``td`` is not a TensorDict, or a value is not a tensor.
        ValueError: a value has the wrong shape, gamma or lmbda is out of range, or the batch
            lacks a key it needs (:class:`~splice.LayoutError`, naming the key).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(2, 1),
        ...     ("next", "terminated"): torch.tensor([[False], [True]]),
        ...     ("next", "done"): torch.tensor([[False], [True]]),
        ... }, batch_size=[2])
        >>> adv, target = gae(batch, torch.zeros(2), torch.full((2,), 4.0), gamma=0.5, lmbda=0.5)
        >>> adv.squeeze(-1), target.squeeze(-1)
        (tensor([3.2500, 1.0000]), tensor([3.2500, 1.0000]))
    """
    keys = keys or TargetKeys()
    gamma, lmbda = check_rate("gamma", gamma), check_rate("lmbda", lmbda)
    rows = read(td, keys)
    v = tensor(td, rows, value, keys.value, "value")
    nv = tensor(td, rows, next_value, keys.next_value, "next_value")
    dtype, work = work_dtype(v, nv)
    advantage, value_target = _backend.for_device(rows.device).gae(
        rows, rows.reward.to(work), v.to(work), nv.to(work), gamma, lmbda
    )
    return rows.output(advantage, dtype), rows.output(value_target, dtype)


def td_lambda_return(
    td: TensorDictBase,
    next_value: Tensor | None = None,
    *,
    gamma: float,
    lmbda: float,
    keys: TargetKeys | None = None,
) -> Tensor:
    r"""TD(λ) returns: :math:`G_t = r_t + \gamma (1 - d^{term}_t)[(1 - \lambda c_t) V'_t]
    + \gamma \lambda c_t G_{t+1}`.

    Inside an episode this is :math:`r_t + \gamma((1-\lambda) V'_t + \lambda G_{t+1})`; where
    the target stops (:func:`continues` False) it is the one-step target
    :math:`r_t + \gamma (1 - d^{term}_t) V'_t`. ``lmbda=0`` gives TD(0) targets, ``lmbda=1``
    the discounted return bootstrapped at the end (:func:`discounted_return`).

    Args:
        td: the batch (any layout of the module docs).
        next_value: ``V(("next", "observation"))`` per step, ``[*batch]`` or
            ``[*batch, 1]``; default: read from ``keys.next_value``.
        gamma: discount, in ``[0, 1]``.
        lmbda: lambda, in ``[0, 1]``.
        keys: where to read the inputs (:class:`TargetKeys`).

    Returns:
        ``[*batch, 1]`` returns, zero on padding.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(3, 1),
        ...     ("next", "terminated"): torch.tensor([[False], [False], [True]]),
        ...     ("next", "done"): torch.tensor([[False], [False], [True]]),
        ... }, batch_size=[3])
        >>> td_lambda_return(batch, torch.ones(3), gamma=1.0, lmbda=0.0).squeeze(-1)
        tensor([2., 2., 1.])
    """
    keys = keys or TargetKeys()
    gamma, lmbda = check_rate("gamma", gamma), check_rate("lmbda", lmbda)
    rows = read(td, keys)
    nv = tensor(td, rows, next_value, keys.next_value, "next_value")
    dtype, work = work_dtype(nv)
    out = _backend.for_device(rows.device).td_lambda(
        rows, rows.reward.to(work), nv.to(work), gamma, lmbda
    )
    return rows.output(out, dtype)


def discounted_return(
    td: TensorDictBase,
    next_value: Tensor | None = None,
    *,
    gamma: float,
    keys: TargetKeys | None = None,
) -> Tensor:
    r"""Discounted returns to the end of each step's segment: :math:`G_t = r_t + \gamma c_t
    G_{t+1}`, plus :math:`\gamma (1 - d^{term}_t) V'_t` where the segment stops, if values are
    given.

    Without ``next_value`` (and without a ``keys.next_value`` entry) this is the plain
    reward-to-go (Monte Carlo); it is exact for terminated episodes and *biased low* where an
    episode was truncated or cut. With ``next_value`` truncated and cut steps bootstrap.

    Args:
        td: the batch (any layout of the module docs).
        next_value: optional ``V(("next", "observation"))`` per step.
        gamma: discount, in ``[0, 1]``.
        keys: where to read the inputs (:class:`TargetKeys`).

    Returns:
        ``[*batch, 1]`` returns (reward dtype, or the values' if given), zero on padding.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(4, 1),
        ...     ("next", "terminated"): torch.zeros(4, 1, dtype=torch.bool),
        ...     ("next", "truncated"): torch.tensor([[False], [True], [False], [True]]),
        ... }, batch_size=[4])
        >>> discounted_return(batch, gamma=0.5).squeeze(-1)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
        >>> discounted_return(batch, torch.full((4,), 2.0), gamma=0.5).squeeze(-1)
        tensor([2., 2., 2., 2.])
    """
    keys = keys or TargetKeys()
    gamma = check_rate("gamma", gamma)
    rows = read(td, keys)
    if next_value is None and td.get(keys.next_value, None) is None:
        reward = rows.reward
        dtype, work = work_dtype(reward if reward.is_floating_point() else reward.float())
        out = _backend.for_device(rows.device).reward_to_go(rows, reward.to(work), gamma)
        return rows.output(out, dtype)
    return td_lambda_return(td, next_value, gamma=gamma, lmbda=1.0, keys=keys)


def n_step_return(
    td: TensorDictBase,
    next_value: Tensor | None = None,
    *,
    n: int,
    gamma: float,
    keys: TargetKeys | None = None,
) -> Tensor:
    r"""n-step returns: up to ``n`` rewards, then the bootstrap of the last step used.

    :math:`G^{(n)}_t = \sum_{k=0}^{m-1} \gamma^k r_{t+k} + \gamma^m (1 - d^{term}_{t+m-1})
    V'_{t+m-1}`, where :math:`m \le n` stops early at the end of the step's segment (the
    first step at which :func:`continues` is False).

    Args:
        td: the batch (any layout of the module docs).
        next_value: ``V(("next", "observation"))`` per step; default: read from
            ``keys.next_value``.
        n: steps, ``>= 1`` (``n=1``: TD(0) targets).
        gamma: discount, in ``[0, 1]``.
        keys: where to read the inputs (:class:`TargetKeys`).

    Returns:
        ``[*batch, 1]`` returns, zero on padding.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(4, 1),
        ...     ("next", "terminated"): torch.tensor([[False], [True], [False], [False]]),
        ...     ("next", "done"): torch.tensor([[False], [True], [False], [False]]),
        ... }, batch_size=[4])
        >>> n_step_return(batch, torch.full((4,), 10.0), n=2, gamma=0.5).squeeze(-1)
        tensor([1.5000, 1.0000, 4.0000, 6.0000])
    """
    keys = keys or TargetKeys()
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    gamma = check_rate("gamma", gamma)
    rows = read(td, keys)
    nv = tensor(td, rows, next_value, keys.next_value, "next_value")
    dtype, work = work_dtype(nv)
    out = _backend.for_device(rows.device).n_step(rows, rows.reward.to(work), nv.to(work), n, gamma)
    return rows.output(out, dtype)
