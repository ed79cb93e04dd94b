"""The CPU implementation of every target: numba kernels, one loop over time per row.

This module is imported on the first target computed on a CPU tensor (``import splice``
does not import numba). Each kernel is compiled for float32 or float64 on its first call
with that dtype and cached on disk (numba's cache: a ``__pycache__`` folder next to this
file, or, where that is not writable, numba's per-user cache directory; ``NUMBA_CACHE_DIR``
sets another), so the compile cost is paid once per install. Where no cache location is
writable the kernels compile in every process.

Each kernel takes the batch's flags as they are (``flags``: a tuple of terminated, done,
truncated, cut, traj_ids and mask, ``[rows, T]`` each, an absent one ``[rows, 0]``) and
applies the rule of :func:`splice.targets.continues` itself (:func:`_rule`). Every target
is a linear recurrence :math:`x_t = b_t + a_t x_{t+1}` along time: a kernel computes ``b``
and ``a`` in one pass (vectorisable), then :func:`_scan` runs the recurrence with four rows
interleaved — their chains are independent, so the CPU overlaps them instead of waiting on
each multiply-add.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numba
import numpy as np
import torch
from torch import Tensor

from splice.targets._inputs import Rows

F = TypeVar("F", bound=Callable[..., Any])
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def _jit(fn: F) -> F:
    """Compile without the GIL, multiply-adds fused (as accurate or more), cached on disk."""
    options: dict[str, Any] = {"nogil": True, "fastmath": {"contract"}}
    try:
        return numba.njit(cache=True, **options)(fn)  # type: ignore[no-any-return]
    except RuntimeError:  # no writable cache location at all (tested by hand: see the docs)
        if not _uncached:
            _uncached.append(fn.__name__)
            warnings.warn(
                "splice.targets: no writable directory for numba's cache of the compiled "
                "kernels, so they are compiled again in every process (seconds per kernel); "
                "set NUMBA_CACHE_DIR to a writable directory to keep them",
                RuntimeWarning,
                stacklevel=2,
            )
        return numba.njit(**options)(fn)  # type: ignore[no-any-return]


_uncached: list[str] = []


# --------------------------------------------------------------------------- the rule


@_jit
def _continuation(terminated, done, truncated, cut, ids, mask, cont, valid):
    """Fill ``cont`` (the target runs on into ``t + 1``) and ``valid`` (a real step)."""
    rows, length = terminated.shape
    for r in range(rows):
        c, ok, term = cont[r], valid[r], terminated[r]
        if mask.shape[1]:
            m = mask[r]
            for t in range(length):
                ok[t] = m[t]
        else:
            for t in range(length):
                ok[t] = True
        for t in range(length):  # c: the step stops its target
            c[t] = term[t]
        for flags in (done, truncated, cut):
            if flags.shape[1]:
                f = flags[r]
                for t in range(length):
                    c[t] = c[t] | f[t]
        if ids.shape[1]:  # padding (id < 0) is not real; an id change stops
            i = ids[r]
            for t in range(length):
                ok[t] = ok[t] & (i[t] >= 0)
            for t in range(length - 1):
                c[t] = c[t] | (i[t] != i[t + 1])
        for t in range(length - 1):
            c[t] = ok[t] & ok[t + 1] & (not c[t])
        if length:
            c[length - 1] = False


@_jit
def _rule(flags):
    """``(cont, valid)`` from ``flags``."""
    terminated, done, truncated, cut, ids, mask = flags
    cont = np.empty(terminated.shape, np.bool_)
    valid = np.empty(terminated.shape, np.bool_)
    _continuation(terminated, done, truncated, cut, ids, mask, cont, valid)
    return cont, valid


# --------------------------------------------------------------------------- the recurrence


@_jit
def _scan(x, a):
    """``x_t <- x_t + a_t x_{t+1}`` along each row, in place (0 past the row's end)."""
    rows, length = x.shape
    zero = x.dtype.type(0.0)
    r = 0
    while r + 4 <= rows:
        x0, x1, x2, x3 = x[r], x[r + 1], x[r + 2], x[r + 3]
        a0, a1, a2, a3 = a[r], a[r + 1], a[r + 2], a[r + 3]
        y0 = y1 = y2 = y3 = zero
        for t in range(length - 1, -1, -1):
            y0 = x0[t] + a0[t] * y0
            y1 = x1[t] + a1[t] * y1
            y2 = x2[t] + a2[t] * y2
            y3 = x3[t] + a3[t] * y3
            x0[t], x1[t], x2[t], x3[t] = y0, y1, y2, y3
        r += 4
    while r < rows:
        x0, a0 = x[r], a[r]
        y0 = zero
        for t in range(length - 1, -1, -1):
            y0 = x0[t] + a0[t] * y0
            x0[t] = y0
        r += 1


@_jit
def _plus_value(x, value, valid, out):
    """``out = x + value`` on real steps, 0 on padding."""
    rows, length = x.shape
    zero = x.dtype.type(0.0)
    for r in range(rows):
        xr, v, ok, o = x[r], value[r], valid[r], out[r]
        for t in range(length):
            o[t] = xr[t] + v[t] if ok[t] else zero


# --------------------------------------------------------------------------- targets


@_jit
def _gae(flags, reward, value, next_value, gamma, lmbda, adv, target):
    cont, valid = _rule(flags)
    terminated = flags[0]
    rows, length = reward.shape
    g, gl, zero = value.dtype.type(gamma), value.dtype.type(gamma * lmbda), value.dtype.type(0.0)
    for r in range(rows):  # target holds the trace coefficients until the end
        rw, term, c, ok = reward[r], terminated[r], cont[r], valid[r]
        v, nv, x, a = value[r], next_value[r], adv[r], target[r]
        for t in range(length):
            delta = rw[t] + g * (zero if term[t] else nv[t]) - v[t]
            x[t] = delta if ok[t] else zero
            a[t] = gl if c[t] else zero
    _scan(adv, target)
    _plus_value(adv, value, valid, target)


@_jit
def _td_lambda(flags, reward, next_value, gamma, lmbda, out):
    cont, valid = _rule(flags)
    terminated = flags[0]
    rows, length = reward.shape
    dt = next_value.dtype.type
    g, g_on, gl, zero = dt(gamma), dt(gamma * (1.0 - lmbda)), dt(gamma * lmbda), dt(0.0)
    trace = np.empty_like(next_value)
    for r in range(rows):
        rw, term, c, ok = reward[r], terminated[r], cont[r], valid[r]
        nv, x, a = next_value[r], out[r], trace[r]
        for t in range(length):
            boot = zero if term[t] else nv[t]
            b = rw[t] + (g_on if c[t] else g) * boot
            x[t] = b if ok[t] else zero
            a[t] = gl if c[t] else zero
    _scan(out, trace)


@_jit
def _reward_to_go(flags, reward, gamma, out):
    cont, valid = _rule(flags)
    rows, length = reward.shape
    g, zero = reward.dtype.type(gamma), reward.dtype.type(0.0)
    trace = np.empty_like(reward)
    for r in range(rows):
        rw, c, ok, x, a = reward[r], cont[r], valid[r], out[r], trace[r]
        for t in range(length):
            x[t] = rw[t] if ok[t] else zero
            a[t] = g if c[t] else zero
    _scan(out, trace)


@_jit
def _n_step(flags, reward, next_value, n, gamma, out):
    cont, valid = _rule(flags)
    terminated = flags[0]
    rows, length = reward.shape
    powers = np.empty(min(n, length) + 1)
    for k in range(powers.size):
        powers[k] = gamma**k
    gamma_n = gamma**n
    # reward-to-go inside each segment, in float64: togo[t] - gamma^n togo[t + n] cancels
    togo, trace = np.empty((rows, length)), np.empty((rows, length))
    for r in range(rows):
        rw, c, ok, x, a = reward[r], cont[r], valid[r], togo[r], trace[r]
        for t in range(length):
            x[t] = rw[t] if ok[t] else 0.0
            a[t] = gamma if c[t] else 0.0
    _scan(togo, trace)
    end = np.empty(length, np.int64)
    for r in range(rows):
        term, c, ok, nv, x, o = terminated[r], cont[r], valid[r], next_value[r], togo[r], out[r]
        last = length - 1
        for t in range(length - 1, -1, -1):  # the last step of each step's segment
            last = last if c[t] else t
            end[t] = last
        for t in range(length):
            if not ok[t]:
                o[t] = 0.0
                continue
            if t + n <= end[t]:  # n rewards, then the bootstrap of step t + n - 1
                total, used = x[t] - gamma_n * x[t + n], t + n - 1
            else:  # the segment ends first
                total, used = x[t], end[t]
            boot = 0.0 if term[used] else nv[used]
            o[t] = total + powers[used - t + 1] * boot


@_jit
def _vtrace(flags, reward, value, next_value, ratio, gamma, rho_thresh, c_thresh, adv, target):
    cont, valid = _rule(flags)
    terminated = flags[0]
    rows, length = reward.shape
    dt = value.dtype.type
    g, rho_bar, c_bar, zero = dt(gamma), dt(rho_thresh), dt(c_thresh), dt(0.0)
    for r in range(rows):  # target holds the trace coefficients until the scan is done
        rw, term, c, ok = reward[r], terminated[r], cont[r], valid[r]
        v, nv, w, x, a = value[r], next_value[r], ratio[r], adv[r], target[r]
        for t in range(length):
            delta = min(rho_bar, w[t]) * (rw[t] + g * (zero if term[t] else nv[t]) - v[t])
            x[t] = delta if ok[t] else zero
            a[t] = g * min(c_bar, w[t]) if c[t] else zero
    _scan(adv, target)  # adv: v_s - V(x_s)
    _plus_value(adv, value, valid, target)  # v_s
    for r in range(rows):  # the policy-gradient advantage
        rw, term, c, ok = reward[r], terminated[r], cont[r], valid[r]
        v, nv, vs, w, x = value[r], next_value[r], target[r], ratio[r], adv[r]
        for t in range(length):
            boot = zero if term[t] else nv[t]
            after = vs[t + 1] if c[t] else boot
            x[t] = min(rho_bar, w[t]) * (rw[t] + g * after - v[t]) if ok[t] else zero


@_jit
def _retrace(flags, reward, q, next_value, ratio, gamma, lmbda, c_thresh, out):
    cont, valid = _rule(flags)
    terminated = flags[0]
    rows, length = reward.shape
    dt = q.dtype.type
    g, gl, c_bar, zero = dt(gamma), dt(gamma * lmbda), dt(c_thresh), dt(0.0)
    for r in range(rows):  # ratio becomes the trace coefficients, in place
        rw, term, c, ok = reward[r], terminated[r], cont[r], valid[r]
        qr, nv, w, x = q[r], next_value[r], ratio[r], out[r]
        for t in range(length):
            b = rw[t] + g * (zero if term[t] else nv[t]) - qr[t]
            x[t] = b if ok[t] else zero
            # the next step's truncated importance weight (read before it is overwritten)
            w[t] = gl * min(c_bar, w[t + 1]) if c[t] else zero
    _scan(out, ratio)
    _plus_value(out, q, valid, out)


# --------------------------------------------------------------------------- entry points


def _array(x: Tensor, shape: tuple[int, int]) -> np.ndarray:
    """A CPU tensor as a C-contiguous ``[rows, T]`` array (a view when it can be)."""
    return np.ascontiguousarray(x.numpy().reshape(shape))


def _flags(rows: Rows) -> tuple[np.ndarray, ...]:
    shape = rows.shape
    absent = np.empty((shape[0], 0), np.bool_)

    def flag(x: Tensor | None) -> np.ndarray:
        return absent if x is None else _array(x, shape)

    ids = rows.traj_ids
    return (
        _array(rows.terminated, shape),
        flag(rows.done),
        flag(rows.truncated),
        flag(rows.cut),
        np.empty((shape[0], 0), np.int64) if ids is None else _array(ids, shape),
        flag(rows.mask),
    )


def _ratio(log_pi: Tensor, log_mu: Tensor | None, shape: tuple[int, int]) -> np.ndarray:
    """``pi / mu`` as a new array (numpy's exp: vectorised, unlike a compiled loop's)."""
    out = np.array(_array(log_pi, shape))
    if log_mu is not None:
        out -= _array(log_mu, shape)
    return np.exp(out, out=out)


def continuation(rows: Rows) -> tuple[Tensor, Tensor]:
    cont, valid = _rule(_flags(rows))
    return torch.from_numpy(cont), torch.from_numpy(valid)


def gae(
    rows: Rows, reward: Tensor, value: Tensor, next_value: Tensor, gamma: float, lmbda: float
) -> tuple[Tensor, Tensor]:
    shape = rows.shape
    adv, target = np.empty(shape, _NUMPY[value.dtype]), np.empty(shape, _NUMPY[value.dtype])
    _gae(
        _flags(rows),
        _array(reward, shape),
        _array(value, shape),
        _array(next_value, shape),
        gamma,
        lmbda,
        adv,
        target,
    )
    return torch.from_numpy(adv), torch.from_numpy(target)


def td_lambda(rows: Rows, reward: Tensor, next_value: Tensor, gamma: float, lmbda: float) -> Tensor:
    shape = rows.shape
    out = np.empty(shape, _NUMPY[next_value.dtype])
    _td_lambda(_flags(rows), _array(reward, shape), _array(next_value, shape), gamma, lmbda, out)
    return torch.from_numpy(out)


def reward_to_go(rows: Rows, reward: Tensor, gamma: float) -> Tensor:
    shape = rows.shape
    out = np.empty(shape, _NUMPY[reward.dtype])
    _reward_to_go(_flags(rows), _array(reward, shape), gamma, out)
    return torch.from_numpy(out)


def n_step(rows: Rows, reward: Tensor, next_value: Tensor, n: int, gamma: float) -> Tensor:
    shape = rows.shape
    out = np.empty(shape, _NUMPY[next_value.dtype])
    _n_step(_flags(rows), _array(reward, shape), _array(next_value, shape), n, gamma, out)
    return torch.from_numpy(out)


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
    shape = rows.shape
    adv, target = np.empty(shape, _NUMPY[value.dtype]), np.empty(shape, _NUMPY[value.dtype])
    _vtrace(
        _flags(rows),
        _array(reward, shape),
        _array(value, shape),
        _array(next_value, shape),
        _ratio(log_pi, log_mu, shape),
        gamma,
        rho_thresh,
        c_thresh,
        adv,
        target,
    )
    return torch.from_numpy(adv), torch.from_numpy(target)


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
    shape = rows.shape
    out = np.empty(shape, _NUMPY[q.dtype])
    _retrace(
        _flags(rows),
        _array(reward, shape),
        _array(q, shape),
        _array(next_value, shape),
        _ratio(log_pi, log_mu, shape),
        gamma,
        lmbda,
        c_thresh,
        out,
    )
    return torch.from_numpy(out)
