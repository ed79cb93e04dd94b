"""The torch implementation of every target, for tensors on an accelerator.

Whole-tensor operations only: each target's linear recurrence :math:`x_t = b_t + a_t
x_{t+1}` runs as a parallel scan (:func:`reverse_scan`), ``log2`` levels instead of ``T``
sequential steps, which suits a GPU. CPU tensors take the compiled loops of
:mod:`splice.targets._cpu`; both give the same targets.
"""

from __future__ import annotations

import torch
from torch import Tensor

from splice.targets._inputs import Rows


def continuation(rows: Rows) -> tuple[Tensor, Tensor]:
    """``(cont, valid)``: the rule of :func:`splice.targets.continues` and the real steps."""
    stop = rows.terminated.reshape(rows.shape).clone()
    for flags in (rows.done, rows.truncated, rows.cut):
        if flags is not None:
            stop |= flags.reshape(rows.shape)
    valid = None if rows.mask is None else rows.mask.reshape(rows.shape)
    ids = None if rows.traj_ids is None else rows.traj_ids.reshape(rows.shape)
    if ids is not None:
        valid = ids >= 0 if valid is None else valid & (ids >= 0)
    if valid is None:
        valid = torch.ones_like(stop)
    cont = torch.zeros_like(valid)
    runs_on = valid[:, :-1] & valid[:, 1:] & ~stop[:, :-1]
    if ids is not None:
        runs_on &= ids[:, :-1] == ids[:, 1:]
    cont[:, :-1] = runs_on
    return cont, valid


def gae(
    rows: Rows, reward: Tensor, value: Tensor, next_value: Tensor, gamma: float, lmbda: float
) -> tuple[Tensor, Tensor]:
    cont, valid = continuation(rows)
    reward = reward.reshape(rows.shape)
    value = value.reshape(rows.shape)
    next_value = next_value.reshape(rows.shape)
    delta = reward + gamma * _bootstrap(next_value, rows.terminated, valid) - value
    advantage = reverse_scan(torch.where(valid, delta, 0.0), (gamma * lmbda) * cont.to(value.dtype))
    return advantage, torch.where(valid, advantage + value, 0.0)


def td_lambda(rows: Rows, reward: Tensor, next_value: Tensor, gamma: float, lmbda: float) -> Tensor:
    cont, valid = continuation(rows)
    reward = reward.reshape(rows.shape)
    next_value = next_value.reshape(rows.shape)
    c = cont.to(next_value.dtype)
    boot = _bootstrap(next_value, rows.terminated, valid)
    b = reward + gamma * (1.0 - lmbda * c) * boot
    return reverse_scan(torch.where(valid, b, 0.0), (gamma * lmbda) * c)


def reward_to_go(rows: Rows, reward: Tensor, gamma: float) -> Tensor:
    cont, valid = continuation(rows)
    reward = reward.reshape(rows.shape)
    return reverse_scan(torch.where(valid, reward, 0.0), gamma * cont.to(reward.dtype))


def n_step(rows: Rows, reward: Tensor, next_value: Tensor, n: int, gamma: float) -> Tensor:
    # Reward-to-go R inside each segment (float64: R_t - gamma^n R_{t+n} cancels), the
    # segment's last step e_t, and m_t = min(n, e_t - t + 1) rewards.
    cont, valid = continuation(rows)
    reward, next_value = reward.reshape(rows.shape), next_value.reshape(rows.shape)
    reward64 = torch.where(valid, reward.to(torch.float64), 0.0)
    togo = reverse_scan(reward64, gamma * cont.to(torch.float64))
    length = cont.shape[-1]
    position = torch.arange(length, device=cont.device).expand_as(cont)
    last = segment_end(cont)
    ahead = position + n
    inside = ahead <= last
    later = togo.gather(-1, ahead.clamp(max=length - 1))
    rewards = togo - torch.where(inside, gamma**n * later, 0.0)
    used = torch.where(inside, position + n - 1, last)  # last step whose reward is used
    boot = _bootstrap(next_value.to(torch.float64), rows.terminated, valid).gather(-1, used)
    m = (used - position + 1).to(torch.float64)
    out = torch.where(valid, rewards + torch.pow(gamma, m) * boot, 0.0)
    return out.to(next_value.dtype)


def vtrace(
    rows: Rows,
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    log_pi: Tensor,
    log_mu: Tensor | None,
    gamma: float,
    rho_thresh: float,
    c_thresh: float,
) -> tuple[Tensor, Tensor]:
    cont, valid = continuation(rows)
    reward = reward.reshape(rows.shape)
    value = value.reshape(rows.shape)
    next_value = next_value.reshape(rows.shape)
    log_pi = log_pi.reshape(rows.shape)
    log_mu = None if log_mu is None else log_mu.reshape(rows.shape)
    ratio = (log_pi if log_mu is None else log_pi - log_mu).exp()
    rho = ratio.clamp(max=rho_thresh)
    boot = _bootstrap(next_value, rows.terminated, valid)
    delta = torch.where(valid, rho * (reward + gamma * boot - value), 0.0)
    trace = torch.where(cont, gamma * ratio.clamp(max=c_thresh), 0.0)
    vs = torch.where(valid, reverse_scan(delta, trace) + value, 0.0)
    after = torch.where(cont, torch.nn.functional.pad(vs[:, 1:], (0, 1)), boot)
    advantage = torch.where(valid, rho * (reward + gamma * after - value), 0.0)
    return advantage, vs


def retrace(
    rows: Rows,
    reward: Tensor,
    q: Tensor,
    next_value: Tensor,
    log_pi: Tensor,
    log_mu: Tensor | None,
    gamma: float,
    lmbda: float,
    c_thresh: float,
) -> Tensor:
    cont, valid = continuation(rows)
    reward = reward.reshape(rows.shape)
    q = q.reshape(rows.shape)
    next_value = next_value.reshape(rows.shape)
    log_pi = log_pi.reshape(rows.shape)
    log_mu = None if log_mu is None else log_mu.reshape(rows.shape)
    ratio = (log_pi if log_mu is None else log_pi - log_mu).exp()
    c_next = torch.nn.functional.pad(ratio[:, 1:].clamp(max=c_thresh), (0, 1))
    boot = _bootstrap(next_value, rows.terminated, valid)
    b = torch.where(valid, reward + gamma * boot - q, 0.0)
    trace = torch.where(cont, (gamma * lmbda) * c_next, 0.0)
    return torch.where(valid, reverse_scan(b, trace) + q, 0.0)


def reverse_scan(b: Tensor, c: Tensor) -> Tensor:
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


def segment_end(cont: Tensor) -> Tensor:
    """For every position, the index of the last step of its segment (first ``t' >= t``
    with ``cont[t']`` False); the last column is always an end."""
    length = cont.shape[-1]
    position = torch.arange(length, device=cont.device).expand_as(cont)
    end_at = torch.where(cont, length - 1, position)
    return end_at.flip(-1).cummin(-1).values.flip(-1)


def _bootstrap(next_value: Tensor, terminated: Tensor, valid: Tensor) -> Tensor:
    """``next_value`` where a step may bootstrap, 0 where it terminated or is padding."""
    return torch.where(terminated.reshape(valid.shape) | ~valid, 0.0, next_value)
