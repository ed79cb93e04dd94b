"""Value targets on splice's data as it comes: returns, n-step, TD(λ) and GAE.

Every function takes a batch of steps (a TensorDict, time along its **last** batch dim) and
value estimates, and returns targets with the reward's shape ``[*batch, 1]``. The same call
works on every layout splice produces:

* a collector chunk ``[B, T]`` (or ``[T]``): episodes end inside rows, the last one is cut at
  the batch edge (``("collector", "cut")``) and goes on in the next batch;
* padded trajectories ``[N, L]`` with ``("collector", "mask")`` (``split_trajectories``,
  ``trajs_per_batch``);
* the flat "cat" layout ``[N]`` (``cat_trajectories``), trajectories told apart by
  ``("collector", "traj_ids")``;
* sampled slices ``[S, L]`` (``SliceSampler(as_sequences=True)``: left-aligned, mask and
  burn-in mask) or their flat ``[S * L]`` form.

**The rule.** A step's target runs on into the next position of its row when that position
is the same trajectory's next step: both are real steps (mask), the ids agree (when there are
ids), and the step is neither an episode end (``terminated``, ``truncated`` or ``done``) nor
a cut. Where it does not run on, the target *bootstraps*: from ``next_value`` — the value of
the step's ``("next", "observation")`` — unless the step is **terminated** (no bootstrap).
So a **truncated** step bootstraps from its true final observation, a **cut** step from the
observation the episode continues from, a slice's last step from the state after it, and
padding or another trajectory's steps never enter a target. Data collected with
``set_truncated=True`` (done and truncated also set at cuts) gives the same targets: both
marks mean "bootstrap from the next observation". The formulas are on the docs page
"Value targets".

``value`` is ``V(observation)`` and ``next_value`` is ``V(("next", "observation"))`` for
every step (``[*batch]`` or ``[*batch, 1]``); inside an episode ``next_value[t]`` is
``value[t + 1]``, at an episode's end it is the value of the true final observation, which
only ``next_value`` holds. A terminated step's ``next_value`` is never read (it may be any
finite or non-finite number). Targets are constants: they are computed without gradient.

Examples:
    A chunk of one env: an episode ends (truncated) at step 1, the next is cut at step 2.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> from splice import targets
    >>> flag = lambda *x: torch.tensor(x).unsqueeze(-1)
    >>> batch = TensorDict({
    ...     ("next", "reward"): torch.ones(3, 1),
    ...     ("next", "terminated"): flag(False, False, False),
    ...     ("next", "truncated"): flag(False, True, False),
    ...     ("collector", "traj_ids"): torch.tensor([7, 7, 8]),
    ...     ("collector", "cut"): torch.tensor([False, False, True]),
    ... }, batch_size=[3])
    >>> next_value = torch.tensor([10.0, 20.0, 30.0])
    >>> targets.td_lambda_return(batch, next_value, gamma=0.5, lmbda=1.0).squeeze(-1)
    tensor([ 6.5000, 11.0000, 16.0000])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from splice.layout import (
    CUT,
    DONE,
    MASK,
    NEXT,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
    LayoutError,
)

__all__ = [
    "TargetKeys",
    "continues",
    "discounted_return",
    "gae",
    "n_step_return",
    "td_lambda_return",
]


@dataclass(frozen=True)
class TargetKeys:
    """Where the target functions read their inputs (TorchRL's names by default).

    Only ``reward`` and ``terminated`` are required, and at least one of ``done``,
    ``truncated`` and ``traj_ids`` (something must say where episodes end). ``value`` and
    ``next_value`` are read when the value tensors are not passed.

    Examples:
        >>> TargetKeys().next_value
        ('next', 'state_value')
        >>> TargetKeys(reward=("next", "intrinsic_reward")).reward
        ('next', 'intrinsic_reward')
    """

    reward: NestedKey = REWARD
    terminated: NestedKey = TERMINATED
    truncated: NestedKey = TRUNCATED
    done: NestedKey = DONE
    cut: NestedKey = CUT
    traj_ids: NestedKey = TRAJ_IDS
    mask: NestedKey = MASK
    value: NestedKey = "state_value"
    next_value: NestedKey = (NEXT, "state_value")


@dataclass(frozen=True)
class _Steps:
    """A batch reduced to what targets need, every tensor ``[rows, T]`` (time last)."""

    reward: Tensor  # float
    terminated: Tensor  # bool
    continues: Tensor  # bool: the target runs on into t + 1
    valid: Tensor  # bool: a real step (not padding)
    batch: torch.Size  # the batch size, to shape outputs


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
    steps = _read(td, keys or TargetKeys())
    return steps.continues.reshape(steps.batch)


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
    _check_rate("gamma", gamma)
    _check_rate("lmbda", lmbda)
    steps = _read(td, keys)
    v = _values(td, value, keys.value, "value", steps)
    nv = _values(td, next_value, keys.next_value, "next_value", steps)
    with torch.no_grad():
        dtype = torch.promote_types(v.dtype, nv.dtype)
        v, nv = v.to(dtype), nv.to(dtype)
        delta = steps.reward.to(dtype) + gamma * _bootstrap(nv, steps) - v
        advantage = _reverse_scan(
            torch.where(steps.valid, delta, 0.0), (gamma * lmbda) * steps.continues.to(dtype)
        )
        value_target = torch.where(steps.valid, advantage + v, 0.0)
    return _shape(advantage, steps), _shape(value_target, steps)


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
    _check_rate("gamma", gamma)
    _check_rate("lmbda", lmbda)
    steps = _read(td, keys)
    nv = _values(td, next_value, keys.next_value, "next_value", steps)
    with torch.no_grad():
        cont = steps.continues.to(nv.dtype)
        b = steps.reward.to(nv.dtype) + gamma * (1.0 - lmbda * cont) * _bootstrap(nv, steps)
        out = _reverse_scan(torch.where(steps.valid, b, 0.0), (gamma * lmbda) * cont)
    return _shape(out, steps)


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
    _check_rate("gamma", gamma)
    steps = _read(td, keys)
    if next_value is None and td.get(keys.next_value, None) is None:
        with torch.no_grad():
            reward = steps.reward if steps.reward.is_floating_point() else steps.reward.float()
            cont = steps.continues.to(reward.dtype)
            out = _reverse_scan(torch.where(steps.valid, reward, 0.0), gamma * cont)
        return _shape(out, steps)
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
    _check_rate("gamma", gamma)
    steps = _read(td, keys)
    nv = _values(td, next_value, keys.next_value, "next_value", steps)
    with torch.no_grad():
        # Reward-to-go R inside each segment (float64: R_t - gamma^n R_{t+n} cancels), the
        # segment's last step e_t, and m_t = min(n, e_t - t + 1) rewards.
        reward = torch.where(steps.valid, steps.reward.to(torch.float64), 0.0)
        cont = steps.continues
        togo = _reverse_scan(reward, gamma * cont.to(torch.float64))
        length = cont.shape[-1]
        position = torch.arange(length, device=cont.device).expand_as(cont)
        last = _segment_end(cont)
        ahead = position + n
        inside = ahead <= last
        later = togo.gather(-1, ahead.clamp(max=length - 1))
        rewards = togo - torch.where(inside, gamma**n * later, 0.0)
        used = torch.where(inside, position + n - 1, last)  # last step whose reward is used
        boot = _bootstrap(nv.to(torch.float64), steps).gather(-1, used)
        m = (used - position + 1).to(torch.float64)
        out = torch.where(steps.valid, rewards + torch.pow(gamma, m) * boot, 0.0).to(nv.dtype)
    return _shape(out, steps)


# --------------------------------------------------------------------------- internals


def _reverse_scan(b: Tensor, c: Tensor) -> Tensor:
    """Solve ``x_t = b_t + c_t x_{t+1}`` along the last dim (``x`` past the end is 0).

    A parallel (Hillis-Steele) scan: after the level with offset ``d``, ``x_t`` holds the
    sum over ``t .. t + 2d - 1`` and ``a_t`` the product of ``c`` over the same span, so
    ``ceil(log2(T))`` whole-tensor levels replace ``T`` sequential steps. It stops as soon as
    every product is zero (every span crosses a segment end), which for episodes much shorter
    than the rows takes ``log2`` of the longest segment. Only products of ``c`` (no
    division), so it is as accurate as the sequential loop.
    """
    x, a = b.clone(), c.clone()
    length = x.shape[-1]
    x_next, a_next = torch.empty_like(x), torch.empty_like(a)
    d = 1
    while d < length:
        torch.addcmul(x[..., :-d], a[..., :-d], x[..., d:], out=x_next[..., :-d])
        x_next[..., -d:] = x[..., -d:]
        x, x_next = x_next, x
        if 2 * d >= length:
            break
        torch.mul(a[..., :-d], a[..., d:], out=a_next[..., :-d])
        a_next[..., -d:] = 0.0  # past the end nothing is added: the span is closed
        a, a_next = a_next, a
        if not bool(a.any()):
            break
        d *= 2
    return x


def _segment_end(cont: Tensor) -> Tensor:
    """For every position, the index of the last step of its segment (first ``t' >= t``
    with ``cont[t']`` False); the last column is always an end."""
    length = cont.shape[-1]
    position = torch.arange(length, device=cont.device).expand_as(cont)
    end_at = torch.where(cont, length - 1, position)
    return end_at.flip(-1).cummin(-1).values.flip(-1)


def _bootstrap(next_value: Tensor, steps: _Steps) -> Tensor:
    """``next_value`` where a step may bootstrap, 0 where it terminated or is padding."""
    return torch.where(steps.terminated | ~steps.valid, 0.0, next_value)


def _check_rate(name: str, x: float) -> None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {x}")


def _fmt(key: NestedKey) -> str:
    return repr(key)


def _flag(td: TensorDictBase, key: NestedKey, batch: torch.Size) -> Tensor | None:
    """A bool entry of shape ``[*batch]`` or ``[*batch, 1]`` as ``[*batch]``, or None."""
    value = td.get(key, None)
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        raise LayoutError(f"key {_fmt(key)}: expected a bool tensor, got {_describe(value)}")
    return _drop_feature(value, batch, f"key {_fmt(key)}")


def _drop_feature(
    value: Tensor, batch: torch.Size, what: str, error: type[ValueError] = LayoutError
) -> Tensor:
    """``value`` as ``[*batch]``: it may carry a trailing feature dim of 1."""
    if value.shape == batch:
        return value
    if value.shape == (*batch, 1):
        return value.squeeze(-1)
    raise error(f"{what}: expected shape {list(batch)} or {[*batch, 1]}, got {list(value.shape)}")


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"dtype {value.dtype} and shape {list(value.shape)}"
    return type(value).__name__


def _read(td: TensorDictBase, keys: TargetKeys) -> _Steps:
    """Validate ``td`` and reduce it to rows of steps, with the continuation rule applied."""
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"td must be a TensorDict, got {type(td).__name__}")
    if not isinstance(keys, TargetKeys):
        raise TypeError(f"keys must be a TargetKeys, got {type(keys).__name__}")
    batch = td.batch_size
    if td.batch_dims == 0:
        raise ValueError("td must have at least one batch dim (time is the last), got []")
    if any(s < 0 for s in batch):
        raise ValueError(
            f"td has a ragged batch size {list(batch)}: nested layouts are not supported, "
            "use split_trajectories(..., as_nested=False) (padded with a mask)"
        )
    reward = td.get(keys.reward, None)
    if reward is None:
        raise LayoutError(f"missing key {_fmt(keys.reward)} (the reward)")
    if not isinstance(reward, Tensor) or reward.is_nested:
        raise LayoutError(f"key {_fmt(keys.reward)}: expected a tensor, got {_describe(reward)}")
    reward = _drop_feature(reward, batch, f"key {_fmt(keys.reward)}")
    terminated = _flag(td, keys.terminated, batch)
    if terminated is None:
        raise LayoutError(
            f"missing key {_fmt(keys.terminated)}: without it a time limit cannot be told "
            "from the end of the MDP"
        )
    ends = [_flag(td, k, batch) for k in (keys.done, keys.truncated)]
    ids = td.get(keys.traj_ids, None)
    if all(e is None for e in ends) and ids is None:
        raise LayoutError(
            f"the batch has none of {_fmt(keys.done)}, {_fmt(keys.truncated)} and "
            f"{_fmt(keys.traj_ids)}: nothing says where truncated episodes end"
        )
    stop = terminated.clone()
    for e in ends:
        if e is not None:
            stop |= e
    cut = _flag(td, keys.cut, batch)
    if cut is not None:
        stop |= cut
    valid = _flag(td, keys.mask, batch)
    if ids is not None:
        if not isinstance(ids, Tensor) or ids.dtype != torch.int64:
            raise LayoutError(f"key {_fmt(keys.traj_ids)}: expected int64, got {_describe(ids)}")
        ids = _drop_feature(ids, batch, f"key {_fmt(keys.traj_ids)}")
        real = ids >= 0
        valid = real if valid is None else valid & real
    if valid is None:
        valid = torch.ones(batch, dtype=torch.bool, device=reward.device)
    length = batch[-1]
    rows = batch.numel() // length if length else 0

    def as_rows(x: Tensor) -> Tensor:
        return x.reshape(rows, length)

    valid, stop = as_rows(valid), as_rows(stop)
    cont = torch.zeros_like(valid)
    runs_on = valid[:, :-1] & valid[:, 1:] & ~stop[:, :-1]
    if ids is not None:
        flat_ids = as_rows(ids)
        runs_on &= flat_ids[:, :-1] == flat_ids[:, 1:]
    cont[:, :-1] = runs_on
    return _Steps(as_rows(reward), as_rows(terminated), cont, valid, batch)


def _values(
    td: TensorDictBase, value: Tensor | None, key: NestedKey, name: str, steps: _Steps
) -> Tensor:
    """A value argument (or the entry at ``key``) as float ``[rows, T]``."""
    error: type[ValueError]
    if value is None:
        value = td.get(key, None)
        if value is None:
            raise LayoutError(f"{name} not given and key {_fmt(key)} missing from the batch")
        what, error = f"key {_fmt(key)}", LayoutError
    else:
        what, error = name, ValueError
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor, got dtype {value.dtype}")
    value = _drop_feature(value.detach(), steps.batch, what, error)
    return value.reshape(steps.valid.shape)


def _shape(x: Tensor, steps: _Steps) -> Tensor:
    return x.reshape(*steps.batch, 1)
