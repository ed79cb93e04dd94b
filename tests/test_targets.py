"""splice.targets: every layout against a per-episode pure-Python reference, and TorchRL.

The reference knows nothing about layouts: it takes one *segment* (the steps of one episode,
or of the fragment of one that the data holds) with how it ends — ``terminated`` (no
bootstrap), ``truncated`` (time limit: bootstrap from the final observation's value) or
``cut`` (collector batch edge or slice end: bootstrap from the next observation's value) —
and computes every target with Python floats. Each test lays random segments out the way
splice's producers do (collector chunk, padded, cat, sampled slices, flat slices), with and
without ``set_truncated`` marks, fills padding with garbage, and checks every real step, on
both implementations: the compiled CPU kernels and the torch one that accelerator tensors
take (forced onto CPU tensors here).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import Collector, LayoutError, ReplayBuffer, SliceSampler, split_trajectories
from splice import targets as T
from splice.layout import CUT, DONE, MASK, REWARD, TERMINATED, TRAJ_IDS, TRUNCATED
from splice.targets import _backend, _cpu, _torch

KINDS = ("terminated", "truncated", "cut")
PATHS = ("compiled", "torch")


@contextlib.contextmanager
def on_path(path: str) -> Iterator[None]:
    """Compute targets with the given implementation: "compiled" (what CPU tensors take) or
    "torch" (what accelerator tensors take)."""
    if path == "compiled":
        yield
        return
    saved = _backend.for_device
    _backend.for_device = lambda device: _torch  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        _backend.for_device = saved


# --------------------------------------------------------------------------- the reference


@dataclass
class Segment:
    reward: list[float]
    value: list[float]  # V(s_t), and Q(s_t, a_t) for Retrace
    next_value: list[float]
    kind: str  # how the segment's last step ends: one of KINDS
    log_pi: list[float] | None = None  # the learned policy's log-probability of a_t
    log_mu: list[float] | None = None  # the behaviour policy's

    def ratio(self, k: int) -> float:
        assert self.log_pi is not None and self.log_mu is not None
        return math.exp(self.log_pi[k] - self.log_mu[k])

    def boot(self, k: int) -> float:
        """What step ``k`` may bootstrap from where its target stops there."""
        last = k == len(self.reward) - 1
        return 0.0 if (last and self.kind == "terminated") else self.next_value[k]


def ref_gae(s: Segment, gamma: float, lmbda: float) -> tuple[list[float], list[float]]:
    adv = [0.0] * len(s.reward)
    running = 0.0
    for k in reversed(range(len(s.reward))):
        delta = s.reward[k] + gamma * s.boot(k) - s.value[k]
        running = delta + (gamma * lmbda * running if k < len(s.reward) - 1 else 0.0)
        adv[k] = running
    return adv, [a + v for a, v in zip(adv, s.value, strict=True)]


def ref_td_lambda(s: Segment, gamma: float, lmbda: float) -> list[float]:
    out = [0.0] * len(s.reward)
    g = 0.0
    for k in reversed(range(len(s.reward))):
        if k == len(s.reward) - 1:
            g = s.reward[k] + gamma * s.boot(k)
        else:
            g = s.reward[k] + gamma * ((1 - lmbda) * s.boot(k) + lmbda * g)
        out[k] = g
    return out


def ref_n_step(s: Segment, n: int, gamma: float) -> list[float]:
    out = []
    for k in range(len(s.reward)):
        m = min(n, len(s.reward) - k)
        total = sum(gamma**i * s.reward[k + i] for i in range(m))
        out.append(total + gamma**m * s.boot(k + m - 1))
    return out


def ref_return(s: Segment, gamma: float, bootstrap: bool) -> list[float]:
    length = len(s.reward)
    out = []
    for k in range(length):
        total = sum(gamma**i * s.reward[k + i] for i in range(length - k))
        out.append(total + (gamma ** (length - k) * s.boot(length - 1) if bootstrap else 0.0))
    return out


def ref_vtrace(s: Segment, gamma: float, rho_bar: float,
               c_bar: float) -> tuple[list[float], list[float]]:  # fmt: skip
    """IMPALA's V-trace, eq. (1) and the policy-gradient advantage, on one segment."""
    n = len(s.reward)
    rho = [min(rho_bar, s.ratio(k)) for k in range(n)]
    c = [min(c_bar, s.ratio(k)) for k in range(n)]
    vs = [0.0] * n
    for k in reversed(range(n)):
        delta = rho[k] * (s.reward[k] + gamma * s.boot(k) - s.value[k])
        vs[k] = s.value[k] + delta
        if k < n - 1:
            vs[k] += gamma * c[k] * (vs[k + 1] - s.value[k + 1])
    after = [vs[k + 1] if k < n - 1 else s.boot(k) for k in range(n)]
    adv = [rho[k] * (s.reward[k] + gamma * after[k] - s.value[k]) for k in range(n)]
    return adv, vs


def ref_retrace(s: Segment, gamma: float, lmbda: float, c_bar: float) -> list[float]:
    """Munos et al.'s Retrace target for Q(s_t, a_t) (``s.value``), on one segment."""
    n = len(s.reward)
    out = [0.0] * n
    for k in reversed(range(n)):
        out[k] = s.reward[k] + gamma * s.boot(k)
        if k < n - 1:
            trace = lmbda * min(c_bar, s.ratio(k + 1))
            out[k] += gamma * trace * (out[k + 1] - s.value[k + 1])
    return out


# --------------------------------------------------------------------------- layouts


@dataclass
class Laid:
    """A layout of segments: the batch, the value tensors, and where each segment's steps are."""

    td: TensorDict  # the behaviour log-probabilities at "action_log_prob"
    value: torch.Tensor
    next_value: torch.Tensor
    log_pi: torch.Tensor
    where: list[list[tuple[int, ...]]]  # per segment, the batch index of each step


def _fill(batch: tuple[int, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Garbage everywhere (padding keeps it): random rewards and flags, NaN values."""
    return {
        "reward": rng.normal(size=batch).astype(np.float32) * 100,
        "terminated": rng.random(batch) < 0.5,
        "truncated": rng.random(batch) < 0.5,
        "cut": rng.random(batch) < 0.5,
        "value": np.full(batch, np.nan, np.float32),
        "next_value": np.full(batch, np.nan, np.float32),
        "log_pi": np.full(batch, np.nan, np.float32),
        "log_mu": np.full(batch, np.nan, np.float32),
        "ids": np.full(batch, -1, np.int64),
        "mask": np.zeros(batch, bool),
    }


def _write(a: dict[str, np.ndarray], s: Segment, idx: list[tuple[int, ...]], traj: int,
           set_truncated: bool, slice_marks: bool) -> None:  # fmt: skip
    last = len(idx) - 1
    for k, i in enumerate(idx):
        end = k == last
        a["reward"][i], a["value"][i], a["next_value"][i] = s.reward[k], s.value[k], s.next_value[k]
        if s.log_pi is not None and s.log_mu is not None:
            a["log_pi"][i], a["log_mu"][i] = s.log_pi[k], s.log_mu[k]
        a["terminated"][i] = end and s.kind == "terminated"
        a["truncated"][i] = end and (
            s.kind == "truncated" or (s.kind == "cut" and (set_truncated or slice_marks))
        )
        if slice_marks and end:  # the sampler marks every slice end truncated
            a["truncated"][i] = a["truncated"][i] or s.kind != "terminated"
        a["cut"][i] = end and s.kind == "cut"
        a["ids"][i], a["mask"][i] = traj, True


def _to_td(a: dict[str, np.ndarray], batch: tuple[int, ...], *, mask: bool, ids: bool,
           cut: bool, feature_values: bool) -> Laid:  # fmt: skip
    flag = lambda x: torch.from_numpy(x).unsqueeze(-1)  # noqa: E731
    entries = {
        "action_log_prob": torch.from_numpy(a["log_mu"]),
        REWARD: flag(a["reward"]),
        TERMINATED: flag(a["terminated"]),
        TRUNCATED: flag(a["truncated"]),
        DONE: flag(a["terminated"] | a["truncated"]),
    }
    if cut:
        entries[CUT] = torch.from_numpy(a["cut"])
    if ids:
        entries[TRAJ_IDS] = torch.from_numpy(a["ids"])
    if mask:
        entries[MASK] = torch.from_numpy(a["mask"])
    value, next_value = torch.from_numpy(a["value"]), torch.from_numpy(a["next_value"])
    log_pi = torch.from_numpy(a["log_pi"])
    if feature_values:
        value, next_value = value.unsqueeze(-1), next_value.unsqueeze(-1)
        log_pi = log_pi.unsqueeze(-1)
    return Laid(TensorDict(entries, batch_size=list(batch)), value, next_value, log_pi, [])


def lay_chunk(rows: list[list[Segment]], rng: np.random.Generator, *, set_truncated: bool,
              feature_values: bool) -> Laid:  # fmt: skip
    """A collector chunk ``[B, T]``: segments end to end in each row (rows equally long)."""
    length = sum(len(s.reward) for s in rows[0])
    a = _fill((len(rows), length), rng)
    where, traj = [], 0
    for b, row in enumerate(rows):
        t = 0
        for s in row:
            idx = [(b, t + k) for k in range(len(s.reward))]
            _write(a, s, idx, traj, set_truncated, False)
            where.append(idx)
            t, traj = t + len(s.reward), traj + 1
    laid = _to_td(a, (len(rows), length), mask=False, ids=True, cut=True,
                  feature_values=feature_values)  # fmt: skip
    laid.where = where
    return laid


def lay_padded(segs: list[Segment], rng: np.random.Generator, *, set_truncated: bool,
               slices: bool, feature_values: bool) -> Laid:  # fmt: skip
    """``[N, L]`` rows, one segment each, left-aligned, garbage padding with a mask.

    ``slices``: marked as ``SliceSampler(as_sequences=True)`` marks its output (every row's
    last real step truncated, a cut kept there), padding repeating the last real step.
    """
    width = max(len(s.reward) for s in segs) + int(rng.integers(0, 3))
    a = _fill((len(segs), width), rng)
    where = []
    for n, s in enumerate(segs):
        idx = [(n, k) for k in range(len(s.reward))]
        _write(a, s, idx, 100 + n, set_truncated, slices)
        if slices:  # padding repeats the last real row (finite), mask False
            last = idx[-1]
            for k in range(len(s.reward), width):
                for key in ("reward", "terminated", "truncated", "value", "next_value", "ids",
                            "log_pi", "log_mu"):  # fmt: skip
                    a[key][n, k] = a[key][last]
                a["cut"][n, k] = False
        where.append(idx)
    laid = _to_td(a, (len(segs), width), mask=True, ids=True, cut=True,
                  feature_values=feature_values)  # fmt: skip
    laid.where = where
    return laid


def lay_flat(segs: list[Segment], rng: np.random.Generator, *, set_truncated: bool,
             slices: bool, feature_values: bool, ids: bool) -> Laid:  # fmt: skip
    """The "cat" layout ``[N]`` (``slices``: flat slice samples, where the same trajectory
    may be sampled twice in a row: ids repeat across a slice boundary)."""
    n = sum(len(s.reward) for s in segs)
    a = _fill((n,), rng)
    where, t, traj = [], 0, 0
    for j, s in enumerate(segs):
        if j and (slices or segs[j - 1].kind == "cut") and rng.random() < 0.5:
            pass  # same id as the previous piece: a fragment's continuation, or a re-sample
        else:
            traj += 1
        idx = [(t + k,) for k in range(len(s.reward))]
        _write(a, s, idx, traj, set_truncated, slices)
        where.append(idx)
        t += len(s.reward)
    laid = _to_td(a, (n,), mask=False, ids=ids, cut=True, feature_values=feature_values)
    laid.where = where
    return laid


# --------------------------------------------------------------------------- strategies


def _segment(rng: np.random.Generator, length: int, kind: str) -> Segment:
    r = rng.normal(size=length).round(3).tolist()
    v = rng.normal(size=length).round(3).tolist()
    nv = rng.normal(size=length).round(3).tolist()
    log_mu = (-rng.exponential(size=length)).round(3).tolist()  # ratios in about [0.1, 10]
    log_pi = (np.array(log_mu) + rng.normal(size=length)).round(3).tolist()
    return Segment(r, v, nv, kind, log_pi, log_mu)


@st.composite
def segment_lists(draw: st.DrawFn) -> tuple[list[Segment], np.random.Generator]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=7))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=len(lengths), max_size=len(lengths)))
    return [_segment(rng, n, k) for n, k in zip(lengths, kinds, strict=True)], rng


@st.composite
def chunk_rows(draw: st.DrawFn) -> tuple[list[list[Segment]], np.random.Generator]:
    """Rows of equal length; episodes end inside rows, the last one ends or is cut."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    length = draw(st.integers(1, 14))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        row, left = [], length
        while left:
            n = draw(st.integers(1, left))
            left -= n
            inner = ("terminated", "truncated")
            row.append(_segment(rng, n, draw(st.sampled_from(inner if left else KINDS))))
        rows.append(row)
    return rows, rng


rates = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])
thresholds = st.sampled_from([0.5, 1.0, 2.0, math.inf])


# --------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Params:
    gamma: float
    lmbda: float
    n: int
    rho_bar: float
    c_bar: float


params = st.builds(Params, rates, rates, st.integers(1, 6), thresholds, thresholds)


def check(laid: Laid, segs: list[Segment], p: Params, path: str) -> None:
    td, v, nv, lp = laid.td, laid.value, laid.next_value, laid.log_pi
    with on_path(path):
        adv, target = T.gae(td, v, nv, gamma=p.gamma, lmbda=p.lmbda)
        lam = T.td_lambda_return(td, nv, gamma=p.gamma, lmbda=p.lmbda)
        nstep = T.n_step_return(td, nv, n=p.n, gamma=p.gamma)
        mc = T.discounted_return(td, gamma=p.gamma)
        boot = T.discounted_return(td, nv, gamma=p.gamma)
        pg, vs = T.vtrace(td, v, nv, log_pi=lp, gamma=p.gamma, rho_thresh=p.rho_bar,
                          c_thresh=p.c_bar)  # fmt: skip
        ret = T.retrace(td, v, nv, log_pi=lp, gamma=p.gamma, lmbda=p.lmbda, c_thresh=p.c_bar)
    outputs = [adv, target, lam, nstep, mc, boot, pg, vs, ret]
    for out in outputs:
        assert out.shape == (*td.batch_size, 1)
        assert torch.isfinite(out).all()  # NaN values on padding never leak
    real = torch.zeros(td.batch_size, dtype=torch.bool)
    for s, idx in zip(segs, laid.where, strict=True):
        refs = [
            *ref_gae(s, p.gamma, p.lmbda),
            ref_td_lambda(s, p.gamma, p.lmbda),
            ref_n_step(s, p.n, p.gamma),
            ref_return(s, p.gamma, False),
            ref_return(s, p.gamma, True),
            *ref_vtrace(s, p.gamma, p.rho_bar, p.c_bar),
            ref_retrace(s, p.gamma, p.lmbda, p.c_bar),
        ]
        for out, ref in zip(outputs, refs, strict=True):
            got = torch.stack([out[i].squeeze(-1) for i in idx]).double()
            torch.testing.assert_close(got, torch.tensor(ref, dtype=torch.float64),
                                       rtol=1e-4, atol=1e-4)  # fmt: skip
        for i in idx:
            real[i] = True
    for out in outputs:  # zero on padding
        assert (out.squeeze(-1)[~real] == 0).all()


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=80, deadline=None)
@given(chunk_rows(), params, st.booleans(), st.booleans())
def test_chunk_matches_reference(path, data, p, set_truncated, feature) -> None:
    rows, rng = data
    laid = lay_chunk(rows, rng, set_truncated=set_truncated, feature_values=feature)
    check(laid, [s for row in rows for s in row], p, path)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=80, deadline=None)
@given(segment_lists(), params, st.booleans(), st.booleans(), st.booleans())
def test_padded_and_slices_match_reference(path, data, p, set_truncated, slices,
                                           feature) -> None:  # fmt: skip
    segs, rng = data
    laid = lay_padded(segs, rng, set_truncated=set_truncated, slices=slices,
                      feature_values=feature)  # fmt: skip
    check(laid, segs, p, path)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=80, deadline=None)
@given(segment_lists(), params, st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_flat_layouts_match_reference(path, data, p, set_truncated, slices, feature,
                                      ids) -> None:  # fmt: skip
    segs, rng = data
    laid = lay_flat(segs, rng, set_truncated=set_truncated, slices=slices,
                    feature_values=feature, ids=ids)  # fmt: skip
    check(laid, segs, p, path)


@settings(max_examples=30, deadline=None)
@given(chunk_rows(), rates, rates)
def test_extra_batch_dims_and_single_env(data, gamma, lmbda) -> None:
    """``[..., B, T]`` and ``[T]`` give the targets of the same rows laid as ``[B, T]``."""
    rows, rng = data
    laid = lay_chunk(rows, rng, set_truncated=False, feature_values=False)
    adv, _ = T.gae(laid.td, laid.value, laid.next_value, gamma=gamma, lmbda=lmbda)
    b, t = laid.td.batch_size
    stacked = torch.stack([laid.td, laid.td])  # [2, B, T]
    adv2, _ = T.gae(stacked, torch.stack([laid.value] * 2), torch.stack([laid.next_value] * 2),
                    gamma=gamma, lmbda=lmbda)  # fmt: skip
    assert adv2.shape == (2, b, t, 1)
    torch.testing.assert_close(adv2[1], adv)
    one, _ = T.gae(laid.td[0], laid.value[0], laid.next_value[0], gamma=gamma, lmbda=lmbda)
    torch.testing.assert_close(one, adv[0])


def test_set_truncated_gives_the_same_targets() -> None:
    rng = np.random.default_rng(0)
    rows = [[_segment(rng, 3, "truncated"), _segment(rng, 4, "cut")],
            [_segment(rng, 7, "cut")]]  # fmt: skip
    plain = lay_chunk(rows, np.random.default_rng(1), set_truncated=False, feature_values=False)
    marked = lay_chunk(rows, np.random.default_rng(1), set_truncated=True, feature_values=False)
    assert marked.td[TRUNCATED].sum() > plain.td[TRUNCATED].sum()
    for fn in (
        lambda laid: T.gae(laid.td, laid.value, laid.next_value, gamma=0.9, lmbda=0.8)[0],
        lambda laid: T.n_step_return(laid.td, laid.next_value, n=3, gamma=0.9),
        lambda laid: T.td_lambda_return(laid.td, laid.next_value, gamma=0.9, lmbda=0.5),
    ):
        torch.testing.assert_close(fn(plain), fn(marked))


def test_other_episodes_never_leak() -> None:
    """Changing one episode's data changes no other episode's targets."""
    rng = np.random.default_rng(3)
    segs = [_segment(rng, n, k) for n, k in [(4, "truncated"), (5, "cut"), (3, "terminated")]]
    laid = lay_flat(segs, rng, set_truncated=False, slices=False, feature_values=False, ids=True)
    before = T.gae(laid.td, laid.value, laid.next_value, gamma=0.99, lmbda=0.95)[0]
    changed = laid.td.clone()
    changed[REWARD][4:9] += 1000.0  # the middle episode
    value = laid.value.clone()
    value[4:9] = -1000.0
    after = T.gae(changed, value, laid.next_value, gamma=0.99, lmbda=0.95)[0]
    assert torch.equal(after[:4], before[:4]) and torch.equal(after[9:], before[9:])
    assert not torch.equal(after[4:9], before[4:9])


# --------------------------------------------------------------------------- real data


def _policy(td: TensorDict) -> TensorDict:
    """Deterministic: push the cart towards the pole's lean (episodes of varied length)."""
    obs = td["observation"]
    td["action"] = ((obs[..., 2] + 0.3 * torch.sin(obs[..., 0] * 37.0)) > 0).long()
    return td


def _real_chunks(set_truncated: bool) -> list[TensorDict]:
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point",
                       max_episode_steps=40)  # fmt: skip
    collector = Collector(env, _policy, frames_per_batch=4 * 25, total_frames=4 * 25 * 6,
                          seed=0, set_truncated=set_truncated)  # fmt: skip
    try:
        return list(collector)
    finally:
        collector.shutdown()


def _value_fn(obs: torch.Tensor) -> torch.Tensor:
    return obs @ torch.tensor([0.3, -1.0, 2.0, 0.5]) + 5.0


def test_real_chunks_match_reference_on_their_fragments() -> None:
    """On CartPole chunks (terminations, 40-step time limits, cuts): every fragment matches."""
    for batch in _real_chunks(set_truncated=False):
        v, nv = _value_fn(batch["observation"]), _value_fn(batch["next", "observation"])
        adv, _ = T.gae(batch, v, nv, gamma=0.97, lmbda=0.9)
        frags = split_trajectories(batch.set("v", v).set("nv", nv).set("adv", adv))
        for row in frags.unbind(0):
            row = row[row[MASK]]
            end = row[-1]
            kind = ("terminated" if end[TERMINATED].item() else
                    "truncated" if end[TRUNCATED].item() else "cut")  # fmt: skip
            assert kind != "cut" or end[CUT].item()
            seg = Segment(row[REWARD].squeeze(-1).tolist(), row["v"].tolist(),
                          row["nv"].tolist(), kind)  # fmt: skip
            torch.testing.assert_close(row["adv"].squeeze(-1).double(),
                                       torch.tensor(ref_gae(seg, 0.97, 0.9)[0],
                                                    dtype=torch.float64),
                                       rtol=1e-5, atol=1e-4)  # fmt: skip
    kinds = torch.cat([b[TRUNCATED].flatten() for b in _real_chunks(False)])
    assert kinds.any()  # the time limit was hit: truncations were exercised


def test_real_set_truncated_chunks_give_the_same_targets() -> None:
    for plain, marked in zip(_real_chunks(False), _real_chunks(True), strict=True):
        assert torch.equal(plain["observation"], marked["observation"])
        assert (marked[TRUNCATED].sum() > plain[TRUNCATED].sum()) or not plain[CUT].any()
        v, nv = _value_fn(plain["observation"]), _value_fn(plain["next", "observation"])
        torch.testing.assert_close(T.gae(plain, v, nv, gamma=0.99, lmbda=0.95),
                                   T.gae(marked, v, nv, gamma=0.99, lmbda=0.95))  # fmt: skip


@pytest.mark.parametrize("as_sequences", [True, False])
def test_real_slices_bootstrap_at_their_ends(as_sequences: bool) -> None:
    """Slices from a replay buffer: each slice is a segment ending where the slice ends."""
    rb = ReplayBuffer(sampler=SliceSampler(slice_len=6, strict_length=True, seed=0,
                                           as_sequences=as_sequences),
                      batch_size=60)  # fmt: skip
    for batch in _real_chunks(set_truncated=False):
        rb.extend(batch)
    sample = rb.sample()
    nv = _value_fn(sample["next", "observation"])
    n_step = T.n_step_return(sample, nv, n=4, gamma=0.9)
    rows = sample if as_sequences else sample.reshape(10, 6)
    n_rows = n_step.reshape(10, 6)
    nv_rows = nv.reshape(10, 6)
    for j, row in enumerate(rows.unbind(0)):
        real = row[MASK] if MASK in row.keys(True) else torch.ones(6, dtype=torch.bool)
        row = row[real]
        kind = "terminated" if row[TERMINATED][-1].item() else "cut"
        seg = Segment(row[REWARD].squeeze(-1).tolist(), [0.0] * len(row),
                      nv_rows[j][real].tolist(), kind)  # fmt: skip
        torch.testing.assert_close(n_rows[j][real].double(),
                                   torch.tensor(ref_n_step(seg, 4, 0.9), dtype=torch.float64),
                                   rtol=1e-5, atol=1e-4)  # fmt: skip


def test_real_slices_with_burn_in() -> None:
    """R2D2's layout: ``[S, burn_in + slice_len]`` sequences, left-aligned (burn-in, training
    steps, padding). Every real step (burn-in ones too) gets its slice's targets."""
    sampler = SliceSampler(slice_len=5, burn_in=3, strict_length=False, seed=1,
                           as_sequences=True)  # fmt: skip
    rb = ReplayBuffer(sampler=sampler, batch_size=12 * 5)
    for batch in _real_chunks(set_truncated=False):
        rb.extend(batch)
    sample = rb.sample()
    assert sample.batch_size == (12, 8) and sample["collector", "burn_in"].any()
    assert not sample[MASK].all()  # some slices are shorter than the width: padding
    v, nv = _value_fn(sample["observation"]), _value_fn(sample["next", "observation"])
    log_mu = -0.1 * sample["observation"][..., 0].abs()
    log_pi = -0.2 * sample["observation"][..., 1].abs()
    adv, _ = T.gae(sample, v, nv, gamma=0.9, lmbda=0.8)
    pg, vs = T.vtrace(sample, v, nv, log_pi=log_pi, log_mu=log_mu, gamma=0.9)
    ret = T.retrace(sample, v, nv, log_pi=log_pi, log_mu=log_mu, gamma=0.9, lmbda=0.8)
    for j in range(12):
        real = sample[MASK][j]
        row = sample[j][real]
        kind = "terminated" if row[TERMINATED][-1].item() else "cut"
        seg = Segment(row[REWARD].squeeze(-1).tolist(), v[j][real].tolist(),
                      nv[j][real].tolist(), kind, log_pi[j][real].tolist(),
                      log_mu[j][real].tolist())  # fmt: skip
        want = [ref_gae(seg, 0.9, 0.8)[0], *ref_vtrace(seg, 0.9, 1.0, 1.0),
                ref_retrace(seg, 0.9, 0.8, 1.0)]  # fmt: skip
        for got, ref in zip((adv, pg, vs, ret), want, strict=True):
            torch.testing.assert_close(got[j][real].squeeze(-1).double(),
                                       torch.tensor(ref, dtype=torch.float64),
                                       rtol=1e-5, atol=1e-4)  # fmt: skip
            assert (got[j][~real] == 0).all()


# --------------------------------------------------------------------------- TorchRL


torchrl_value = pytest.importorskip("torchrl.objectives.value.functional")


def _torchrl(fn_name: str, laid: Laid, gamma: float, lmbda: float, done: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = getattr(torchrl_value, fn_name)
        v, nv = (
            laid.value.reshape(*laid.td.batch_size, 1),
            laid.next_value.reshape(*laid.td.batch_size, 1),
        )
        return fn(gamma, lmbda, v, nv, laid.td[REWARD], done, laid.td[TERMINATED])


@settings(max_examples=40, deadline=None)
@given(chunk_rows(), st.sampled_from([0.5, 0.9, 0.99]), st.sampled_from([0.0, 0.8, 0.95, 1.0]),
       st.booleans())  # fmt: skip
def test_gae_agrees_with_torchrl_on_chunks(data, gamma, lmbda, set_truncated) -> None:
    """[B, T] chunks: TorchRL's done marks every episode end and a row end stops it too."""
    rows, rng = data
    laid = lay_chunk(rows, rng, set_truncated=set_truncated, feature_values=True)
    ours = T.gae(laid.td, laid.value, laid.next_value, gamma=gamma, lmbda=lmbda)
    names = ["generalized_advantage_estimate", "vec_generalized_advantage_estimate"]
    for name in names[: 1 if lmbda == 0 else 2]:  # TorchRL's vec GAE fails at lmbda=0
        theirs = _torchrl(name, laid, gamma, lmbda, laid.td[DONE])
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(segment_lists(), st.sampled_from([0.9, 0.99]), st.sampled_from([0.5, 0.95]))
def test_td_lambda_agrees_with_torchrl_on_cat_with_set_truncated(data, gamma, lmbda) -> None:
    """The cat layout agrees once every boundary is marked done (``set_truncated=True``)."""
    segs, rng = data
    laid = lay_flat(segs, rng, set_truncated=True, slices=False, feature_values=True, ids=True)
    ours = T.td_lambda_return(laid.td, laid.next_value, gamma=gamma, lmbda=lmbda)
    nv = laid.next_value  # [N, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torchrl_value.td_lambda_return_estimate(
            gamma, lmbda, nv, laid.td[REWARD], laid.td[DONE], laid.td[TERMINATED], time_dim=-2
        )
    torch.testing.assert_close(ours.unsqueeze(0), theirs.unsqueeze(0), rtol=1e-4, atol=1e-4)


def test_where_torchrl_differs() -> None:
    """TorchRL reads only done: a cut without ``set_truncated`` in a flat layout, and a
    fragment followed by padding, leak into the next trajectory (splice: ids, cut, mask)."""
    rng = np.random.default_rng(0)
    segs = [_segment(rng, 3, "cut"), _segment(rng, 4, "terminated")]
    laid = lay_flat(segs, rng, set_truncated=False, slices=False, feature_values=True, ids=True)
    laid.td[TRAJ_IDS][3:] = 9  # a different trajectory after the cut
    ours = T.gae(laid.td, laid.value, laid.next_value, gamma=0.9, lmbda=0.9)[0]
    theirs = _torchrl("generalized_advantage_estimate", laid, 0.9, 0.9, laid.td[DONE])[0]
    torch.testing.assert_close(ours[3:], theirs[3:])  # the episode after the cut agrees
    assert not torch.allclose(ours[:3], theirs[:3])  # TorchRL runs on past the cut
    ref = torch.tensor(ref_gae(segs[0], 0.9, 0.9)[0])
    torch.testing.assert_close(ours[:3].squeeze(-1), ref)

    padded = lay_padded(segs[:1], rng, set_truncated=False, slices=False, feature_values=True)
    padded.value.nan_to_num_(3.0)
    padded.next_value.nan_to_num_(3.0)
    ours = T.gae(padded.td, padded.value, padded.next_value, gamma=0.9, lmbda=0.9)[0]
    theirs = _torchrl("generalized_advantage_estimate", padded, 0.9, 0.9, padded.td[DONE])[0]
    torch.testing.assert_close(ours[0, :3].squeeze(-1), ref)
    if padded.td.batch_size[1] > 3 and not padded.td[DONE][0, 2]:
        assert not torch.allclose(ours[0, :3], theirs[0, :3])  # padding leaked into TorchRL's


def _torchrl_vtrace(laid: Laid, gamma: float, rho_bar: float, c_bar: float, time_dim: int = -2):
    shape = (*laid.td.batch_size, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchrl_value.vtrace_advantage_estimate(
            gamma, laid.log_pi.reshape(shape), laid.td["action_log_prob"].reshape(shape),
            laid.value.reshape(shape), laid.next_value.reshape(shape), laid.td[REWARD],
            laid.td[DONE], laid.td[TERMINATED], rho_thresh=rho_bar, c_thresh=c_bar,
            time_dim=time_dim,
        )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(chunk_rows(), st.sampled_from([0.5, 0.9, 0.99]), thresholds, thresholds, st.booleans())
def test_vtrace_agrees_with_torchrl_on_chunks(data, gamma, rho_bar, c_bar, set_truncated) -> None:
    """[B, T] chunks: TorchRL's ``vtrace_advantage_estimate`` stops at every done and at a
    row's end, bootstraps truncations from the next value: the same targets."""
    rows, rng = data
    laid = lay_chunk(rows, rng, set_truncated=set_truncated, feature_values=True)
    ours = T.vtrace(laid.td, laid.value, laid.next_value, log_pi=laid.log_pi, gamma=gamma,
                    rho_thresh=rho_bar, c_thresh=c_bar)  # fmt: skip
    theirs = _torchrl_vtrace(laid, gamma, rho_bar, c_bar)  # (advantage, value target)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(segment_lists(), st.sampled_from([0.9, 0.99]), thresholds, thresholds)
def test_vtrace_agrees_with_torchrl_on_cat_with_set_truncated(data, gamma, rho_bar,
                                                               c_bar) -> None:  # fmt: skip
    """The cat layout agrees once every boundary is marked done (``set_truncated=True``)."""
    segs, rng = data
    laid = lay_flat(segs, rng, set_truncated=True, slices=False, feature_values=True, ids=True)
    ours = T.vtrace(laid.td, laid.value, laid.next_value, log_pi=laid.log_pi, gamma=gamma,
                    rho_thresh=rho_bar, c_thresh=c_bar)  # fmt: skip
    theirs = _torchrl_vtrace(laid, gamma, rho_bar, c_bar)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_vtrace_where_torchrl_differs() -> None:
    """TorchRL reads only done: a cut without ``set_truncated`` in a flat layout runs its
    trace into the next trajectory (splice stops at the cut and the id change)."""
    rng = np.random.default_rng(1)
    segs = [_segment(rng, 3, "cut"), _segment(rng, 4, "terminated")]
    laid = lay_flat(segs, rng, set_truncated=False, slices=False, feature_values=True, ids=True)
    laid.td[TRAJ_IDS][3:] = 9
    ours = T.vtrace(laid.td, laid.value, laid.next_value, log_pi=laid.log_pi, gamma=0.9)
    theirs = _torchrl_vtrace(laid, 0.9, 1.0, 1.0)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a[3:], b[3:])  # the episode after the cut agrees
        assert not torch.allclose(a[:3], b[:3])  # TorchRL runs on past the cut
    want = ref_vtrace(segs[0], 0.9, 1.0, 1.0)
    for a, ref in zip(ours, want, strict=True):
        torch.testing.assert_close(a[:3].squeeze(-1), torch.tensor(ref))


def test_on_policy_vtrace_is_gae_with_lambda_one() -> None:
    """With pi = mu (ratio 1) and c_bar >= 1, V-trace's value target is GAE's (lambda=1)
    value target; log_rho=0 gives the same as log_pi = log_mu."""
    rng = np.random.default_rng(2)
    rows = [[_segment(rng, 5, "truncated"), _segment(rng, 6, "cut")],
            [_segment(rng, 4, "terminated"), _segment(rng, 7, "cut")]]  # fmt: skip
    laid = lay_chunk(rows, rng, set_truncated=False, feature_values=False)
    log_mu = laid.td["action_log_prob"]
    adv, vs = T.vtrace(laid.td, laid.value, laid.next_value, log_pi=log_mu, gamma=0.9)
    _, target = T.gae(laid.td, laid.value, laid.next_value, gamma=0.9, lmbda=1.0)
    torch.testing.assert_close(vs, target)
    same, _ = T.vtrace(laid.td, laid.value, laid.next_value, log_rho=torch.zeros(2, 11),
                       gamma=0.9)  # fmt: skip
    torch.testing.assert_close(same, adv)
    # a feed-forward critic (next_value[t] = value[t + 1] inside episodes): advantages agree
    cont = T.continues(laid.td)
    nv = torch.where(cont, torch.nn.functional.pad(laid.value[:, 1:], (0, 1)), laid.next_value)
    adv, _ = T.vtrace(laid.td, laid.value, nv, log_pi=log_mu, gamma=0.9)
    torch.testing.assert_close(adv, T.gae(laid.td, laid.value, nv, gamma=0.9, lmbda=1.0)[0])


# --------------------------------------------------------------------------- errors


def _small() -> TensorDict:
    return TensorDict(
        {REWARD: torch.ones(2, 3, 1), TERMINATED: torch.zeros(2, 3, 1, dtype=torch.bool),
         DONE: torch.zeros(2, 3, 1, dtype=torch.bool)},
        batch_size=[2, 3],
    )  # fmt: skip


def test_errors_name_the_argument_and_leave_the_batch_unchanged() -> None:
    td = _small()
    before = td.clone()
    v = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="td must be a TensorDict"):
        T.gae({"a": 1}, v, v, gamma=0.9, lmbda=0.9)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="value must be a tensor"):
        T.gae(td, [0.0], v, gamma=0.9, lmbda=0.9)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"next_value: expected shape \[2, 3\]"):
        T.gae(td, v, torch.zeros(3, 2), gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="gamma must be in"):
        T.gae(td, v, v, gamma=1.5, lmbda=0.9)
    with pytest.raises(TypeError, match="lmbda must be a float"):
        T.gae(td, v, v, gamma=0.9, lmbda="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be >= 1"):
        T.n_step_return(td, v, n=0, gamma=0.9)
    with pytest.raises(TypeError, match="n must be an int"):
        T.n_step_return(td, v, n=2.0, gamma=0.9)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=r"'state_value'"):
        T.gae(td, gamma=0.9, lmbda=0.9)
    with pytest.raises(TypeError, match="floating-point"):
        T.gae(td, v.long(), v, gamma=0.9, lmbda=0.9)
    with pytest.raises(LayoutError, match=r"missing key .*terminated"):
        T.gae(td.exclude(TERMINATED), v, v, gamma=0.9, lmbda=0.9)
    with pytest.raises(LayoutError, match="nothing says where truncated episodes end"):
        T.gae(td.exclude(DONE), v, v, gamma=0.9, lmbda=0.9)
    bad = td.clone()
    bad[DONE] = torch.zeros(2, 3, 1)
    with pytest.raises(LayoutError, match=r"\('next', 'done'\): expected a bool tensor"):
        T.gae(bad, v, v, gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="at least one batch dim"):
        T.gae(TensorDict({}, []), v, v, gamma=0.9, lmbda=0.9)
    assert (td == before).all()


def test_off_policy_errors_name_the_argument_and_key() -> None:
    td = _small()
    before = td.clone()
    v, lp = torch.zeros(2, 3), torch.zeros(2, 3)
    for fn, kwargs in ((T.vtrace, {}), (T.retrace, {"lmbda": 0.9})):
        with pytest.raises(LayoutError, match=r"log_mu not given and key 'action_log_prob'"
                           r".*policy that collected the data must write"):  # fmt: skip
            fn(td, v, v, log_pi=lp, gamma=0.9, **kwargs)
        with pytest.raises(LayoutError, match="key 'my_log_prob'"):
            fn(td, v, v, log_pi=lp, gamma=0.9, keys=T.TargetKeys(sample_log_prob="my_log_prob"),
               **kwargs)  # fmt: skip
        with pytest.raises(ValueError, match="log_pi is required"):
            fn(td, v, v, log_mu=lp, gamma=0.9, **kwargs)
        with pytest.raises(ValueError, match="not both"):
            fn(td, v, v, log_pi=lp, log_rho=lp, gamma=0.9, **kwargs)
        with pytest.raises(ValueError, match=r"c_thresh must be > 0"):
            fn(td, v, v, log_pi=lp, log_mu=lp, gamma=0.9, c_thresh=0.0, **kwargs)
        with pytest.raises(ValueError, match=r"c_thresh must be > 0"):
            fn(td, v, v, log_pi=lp, log_mu=lp, gamma=0.9, c_thresh=math.nan, **kwargs)
        with pytest.raises(TypeError, match="c_thresh must be a float"):
            fn(td, v, v, log_pi=lp, log_mu=lp, gamma=0.9, c_thresh=True, **kwargs)
        with pytest.raises(TypeError, match="log_pi must be a floating-point tensor"):
            fn(td, v, v, log_pi=lp.long(), log_mu=lp, gamma=0.9, **kwargs)
        with pytest.raises(ValueError, match=r"log_rho: expected shape \[2, 3\]"):
            fn(td, v, v, log_rho=torch.zeros(3), gamma=0.9, **kwargs)
        with pytest.raises(ValueError, match="log_mu is on meta, the batch on cpu"):
            fn(td, v, v, log_pi=lp, log_mu=lp.to("meta"), gamma=0.9, **kwargs)
    with pytest.raises(ValueError, match=r"rho_thresh must be > 0 \(math.inf: no clipping\)"):
        T.vtrace(td, v, v, log_pi=lp, log_mu=lp, gamma=0.9, rho_thresh=-1.0)
    with pytest.raises(LayoutError, match="'state_action_value'"):
        T.retrace(td, next_value=v, log_pi=lp, log_mu=lp, gamma=0.9)
    with pytest.raises(ValueError, match="lmbda must be in"):
        T.retrace(td, v, v, log_pi=lp, log_mu=lp, gamma=0.9, lmbda=2.0)
    assert (td == before).all()


def test_values_may_come_from_the_batch_under_torchrl_names() -> None:
    td = _small()
    v, nv = torch.randn(2, 3), torch.randn(2, 3, 1)
    td["state_value"], td["next", "state_value"] = v, nv
    torch.testing.assert_close(T.gae(td, gamma=0.9, lmbda=0.7), T.gae(td, v, nv, gamma=0.9,
                                                                      lmbda=0.7))  # fmt: skip
    keys = T.TargetKeys(value="v", next_value="nv")
    td["v"], td["nv"] = v, nv
    torch.testing.assert_close(T.td_lambda_return(td, gamma=0.9, lmbda=0.7, keys=keys),
                               T.td_lambda_return(td, nv, gamma=0.9, lmbda=0.7))  # fmt: skip


def test_terminated_next_value_is_never_read() -> None:
    td = _small()
    td[TERMINATED][0, 1] = True
    td[DONE][0, 1] = True
    nv = torch.ones(2, 3)
    nv[0, 1] = math.nan
    out = T.gae(td, torch.zeros(2, 3), nv, gamma=0.9, lmbda=0.9)[0]
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("scan", [_torch.reverse_scan, _cpu._scan], ids=["torch", "compiled"])
def test_scan_matches_a_sequential_loop_on_long_rows(scan) -> None:
    """Each implementation's scan on [5, 3000] rows (four interleaved and one alone, for the
    compiled one) with a few long segments, in float32."""
    gen = torch.Generator().manual_seed(0)
    b = torch.randn(5, 3000, generator=gen)
    c = 0.999 * (torch.rand(5, 3000, generator=gen) > 0.001).float()
    want = torch.zeros(5, 3000, dtype=torch.float64)
    running = torch.zeros(5, dtype=torch.float64)
    for t in reversed(range(3000)):
        running = b[:, t].double() + c[:, t].double() * running
        want[:, t] = running
    if scan is _cpu._scan:
        got = b.clone()
        scan(got.numpy(), c.numpy())
    else:
        got = scan(b, c)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)


def test_dtypes_strides_and_both_paths() -> None:
    """float64 values give float64 targets, half precision is computed in float32 and cast
    back; a strided batch gives its contiguous copy's targets; the two paths agree."""
    rng = np.random.default_rng(5)
    rows = [[_segment(rng, 5, "truncated"), _segment(rng, 9, "cut")],
            [_segment(rng, 8, "terminated"), _segment(rng, 6, "cut")]]  # fmt: skip
    laid = lay_chunk(rows, rng, set_truncated=False, feature_values=False)
    td, v, nv, lp = laid.td, laid.value, laid.next_value, laid.log_pi

    def every(td, v, nv, lp):
        return [
            *T.gae(td, v, nv, gamma=0.9, lmbda=0.8),
            T.td_lambda_return(td, nv, gamma=0.9, lmbda=0.8),
            T.n_step_return(td, nv, n=3, gamma=0.9),
            T.discounted_return(td, gamma=0.9),
            *T.vtrace(td, v, nv, log_pi=lp, gamma=0.9),
            T.retrace(td, v, nv, log_pi=lp, gamma=0.9, lmbda=0.8),
        ]

    base = every(td, v, nv, lp)
    with on_path("torch"):
        for a, b in zip(base, every(td, v, nv, lp), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for path in PATHS:  # targets are constants, also from values that carry a gradient
        with on_path(path):
            grads = every(td, *(x.clone().requires_grad_() for x in (v, nv, lp)))
        assert not any(x.requires_grad for x in grads)
    for i, (a, b) in enumerate(zip(base, every(td, v.double(), nv.double(), lp), strict=True)):
        assert b.dtype == (torch.float32 if i == 4 else torch.float64)  # 4: rewards only
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5)
    for a, b in zip(base[:2], every(td, v.bfloat16(), nv.bfloat16(), lp)[:2], strict=True):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(a, b.float(), rtol=0.05, atol=0.1)
    # a strided view: every other row of a [4, T] stack, columns reversed twice
    big = torch.stack([td, td.clone()], 1).reshape(4, td.batch_size[1])[::2]
    assert not big[REWARD].is_contiguous()
    strided = [torch.stack([x, x], 1).reshape(4, -1)[::2] for x in (v, nv, lp)]
    for a, b in zip(base, every(big, *strided), strict=True):
        torch.testing.assert_close(a, b)


def test_cpu_tensors_take_the_compiled_kernels_other_devices_torch() -> None:
    assert _backend.for_device(torch.device("cpu")) is _cpu
    assert _backend.for_device(torch.device("cuda", 0)) is _torch
    assert _backend.for_device(torch.device("meta")) is _torch


def _run(code: str, env: dict[str, str] | None = None) -> str:
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240, check=True, env={**os.environ, **(env or {})})  # fmt: skip
    return out.stdout.strip()


def test_import_splice_does_not_import_numba() -> None:
    """numba is imported by the first target on a CPU tensor, not by ``import splice``."""
    code = (
        "import sys, torch, splice\n"
        "before = 'numba' in sys.modules\n"
        "from tensordict import TensorDict\n"
        "td = TensorDict({('next', 'reward'): torch.ones(3, 1),\n"
        "                 ('next', 'terminated'): torch.zeros(3, 1, dtype=torch.bool),\n"
        "                 ('next', 'done'): torch.zeros(3, 1, dtype=torch.bool)}, [3])\n"
        "splice.targets.discounted_return(td, gamma=0.5)\n"
        "print(before, 'numba' in sys.modules)"
    )
    assert _run(code) == "False True"


def test_kernels_are_cached_on_disk(tmp_path) -> None:
    """The first process compiles the kernels it uses and writes them to numba's cache; the
    next one loads them (no compile)."""
    code = (
        "import torch\n"
        "from tensordict import TensorDict\n"
        "from splice import targets\n"
        "from splice.targets import _cpu\n"
        "td = TensorDict({('next', 'reward'): torch.ones(2, 3, 1),\n"
        "                 ('next', 'terminated'): torch.zeros(2, 3, 1, dtype=torch.bool),\n"
        "                 ('next', 'done'): torch.zeros(2, 3, 1, dtype=torch.bool)}, [2, 3])\n"
        "targets.gae(td, torch.zeros(2, 3), torch.ones(2, 3), gamma=0.9, lmbda=0.9)\n"
        "stats = _cpu._gae.stats\n"
        "print(sum(stats.cache_misses.values()), sum(stats.cache_hits.values()))"
    )
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    assert _run(code, env) == "1 0"  # compiled, and written to the cache
    assert any(tmp_path.rglob("*.nbi")) and any(tmp_path.rglob("*.nbc"))
    assert _run(code, env) == "0 1"  # loaded from it
