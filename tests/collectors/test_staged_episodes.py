"""Whole episodes kept in staging (``Collector(trajs_per_batch=...)``) are exactly what a
``TrajectoryAssembler`` fed with the same collector's plain batches gives: same episodes,
same order, same ids, same marks, same end-of-run batch, same frame accounting."""

from __future__ import annotations

import torch
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import Collector, TrajectoryAssembler
from splice.layout import TRAJ_IDS
from splice.testing import CountingEnv, counting_vec, threshold_policy

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _reference(make_env, policy, *, frames_per_batch, total_frames, trajs, fmt, drop, **kwargs):
    """The old path: plain batches into a TrajectoryAssembler, emitted as the front end does."""
    assembler = TrajectoryAssembler()
    out, returns = [], []
    with Collector(
        make_env(),
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        track_episodes=True,
        **kwargs,
    ) as c:
        for batch in c:
            assembler.ingest(batch)
            while len(assembler) >= trajs:
                out.append(assembler.emit(trajs, fmt))
        drained = assembler.drain(fmt, drop_incomplete=drop)
        returns = [r for _, r in c.episode_log]
    if drained.batch is not None:
        out.append(drained.batch)
    return out, returns, drained


def _assert_same(got: TensorDict, want: TensorDict) -> None:
    assert got.batch_size == want.batch_size
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert got.get(key).dtype == want.get(key).dtype, key
        assert torch.equal(got.get(key), want.get(key)), key


CASE = {
    "lengths": st.lists(st.integers(1, 9), min_size=1, max_size=5),
    "steps": st.integers(1, 7),
    "trajs": st.integers(1, 4),
    "mode": st.sampled_from([*MODES, None]),  # None: one gymnasium.Env (lengths[0])
    "max_len": st.one_of(st.none(), st.integers(1, 6)),
    "fmt": st.sampled_from(["cat", "padded"]),
    "set_truncated": st.booleans(),
    "drop": st.booleans(),
    "random_batches": st.integers(0, 2),
}


@settings(max_examples=30, deadline=None)
@given(n_batches=st.integers(1, 6), **CASE)
def test_staged_episodes_equal_the_assembler_on_plain_batches(**case):
    _assert_same_as_assembler(**case)


@settings(max_examples=6, deadline=None)
@given(n_batches=st.integers(25, 45), **CASE)
def test_staged_episodes_equal_the_assembler_on_long_runs(**case):
    """Long enough for staging to move its kept columns to the front, and to grow, while
    episodes wait in it."""
    _assert_same_as_assembler(**case)


def _assert_same_as_assembler(
    lengths, steps, n_batches, trajs, mode, max_len, fmt, set_truncated, drop, random_batches
):
    if mode is None:
        b, lengths_ = 1, lengths[0]

        def make_env():
            return CountingEnv(lengths_)
    else:
        b = len(lengths)

        def make_env():
            return counting_vec(lengths, mode)

    common = {
        "frames_per_batch": b * steps,
        "total_frames": b * steps * n_batches,
        "max_frames_per_traj": max_len,
        "set_truncated": set_truncated,
        "init_random_frames": b * steps * random_batches,
        "seed": 3,
    }
    want, want_returns, drained = _reference(
        make_env,
        threshold_policy,
        trajs=trajs,
        fmt=fmt,
        drop=drop,
        worker_id=90,
        **common,
    )
    with Collector(
        make_env(),
        threshold_policy,
        trajs_per_batch=trajs,
        traj_format=fmt,
        drop_incomplete=drop,
        worker_id=91,
        track_episodes=True,
        **common,
    ) as c:
        got = list(c)
        assert c.frames == b * steps * n_batches
        assert c.frames_buffered == 0
        assert c.dropped_trajs == drained.dropped_trajs
        assert c.dropped_frames == drained.dropped_frames
        got_returns = [r for _, r in c.episode_log]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        # the two collectors draw ids from different spaces (worker 90 vs 91): same counters
        g, w = g.clone(), w.clone()
        for x in (g, w):
            ids = x.get(TRAJ_IDS)
            x.set(TRAJ_IDS, torch.where(ids >= 0, ids & (2**40 - 1), ids))
        _assert_same(g, w)
    assert got_returns == want_returns


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    steps=st.integers(1, 7),
    n_batches=st.integers(1, 6),
    trajs=st.integers(1, 4),
    mode=st.sampled_from(MODES),
    max_len=st.one_of(st.none(), st.integers(1, 6)),
)
def test_staged_episodes_hold_every_transition_once_in_order(
    lengths, steps, n_batches, trajs, mode, max_len
):
    """Without the assembler as a reference: the emitted episodes (complete ones, then the
    flushed in-flight ones) hold every step the envs took exactly once; each episode is one
    env's consecutive steps under one id, starting at an episode start, ending with done
    (complete) or the cut mark (flushed); an env's episodes come out in time order."""
    b = len(lengths)
    with Collector(
        counting_vec(lengths, mode),
        threshold_policy,
        frames_per_batch=b * steps,
        total_frames=b * steps * n_batches,
        max_frames_per_traj=max_len,
        trajs_per_batch=trajs,
        traj_format="cat",
        worker_id=92,
    ) as c:
        outs = list(c)
    seen = {tag: [] for tag in range(b)}  # per env: the total-step counts, in emission order
    flushed_from = None
    for k, out in enumerate(outs):
        ids = out.get(TRAJ_IDS)
        assert bool((ids >> 40 == 92).all())  # the collector's own id space
        bounds = torch.diff(ids, prepend=ids[:1] - 1).nonzero().flatten()
        for first, stop in zip(bounds.tolist(), [*bounds[1:].tolist(), ids.numel()], strict=True):
            ep = out[first:stop]
            obs, nxt = ep["observation"], ep["next", "observation"]
            tag = int(obs[0, 2])
            assert bool((obs[:, 2] == tag).all())  # one env
            assert torch.equal(nxt[:, 0], obs[:, 0] + 1)  # next is the step after, no reset obs
            assert torch.equal(obs[1:, 0], obs[:-1, 0] + 1)  # consecutive steps
            assert torch.equal(obs[1:, 1], obs[:-1, 1] + 1)  # within one episode
            assert not bool(ep["next", "done"][:-1].any())
            cut = bool(ep["collector", "cut"][-1])
            assert not bool(ep["collector", "cut"][:-1].any())
            if cut:  # flushed at the end: only in the last output, after the complete ones
                assert k == len(outs) - 1
                flushed_from = first if flushed_from is None else flushed_from
                assert not bool(ep["next", "done"][-1])
            else:
                assert flushed_from is None or k < len(outs) - 1
                assert bool(ep["next", "done"][-1]) and bool(ep["is_init"][0])
            seen[tag].append(obs[:, 0].long())
    for tag in range(b):
        counts = torch.cat(seen[tag]) if seen[tag] else torch.zeros(0, dtype=torch.long)
        assert torch.equal(counts, torch.arange(steps * n_batches))  # once each, in order


def _flaky(fail_at: int):
    """:func:`threshold_policy` that raises once, at its ``fail_at``-th call."""
    calls = {"n": 0}

    def policy(td):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("transient")
        return threshold_policy(td)

    return policy


def _outputs_through_errors(collector):
    """Everything a collector yields, carrying on after each transient policy error."""
    outs, errors = [], 0
    while True:
        try:
            outs.extend(iter(collector))
            return outs, errors
        except RuntimeError as e:
            assert "transient" in str(e)
            errors += 1


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    steps=st.integers(1, 6),
    trajs=st.integers(1, 3),
    mode=st.sampled_from(MODES),
    fail_at=st.integers(1, 30),
    fmt=st.sampled_from(["cat", "padded"]),
)
def test_staged_episodes_after_a_policy_error_equal_the_assembler(
    lengths, steps, trajs, mode, fail_at, fmt
):
    """A policy error mid-batch restarts the envs: the episodes in flight never continue and
    are flushed at the end, marked cut, exactly as the assembler does with plain batches."""
    b = len(lengths)
    common = {"frames_per_batch": b * steps, "total_frames": b * steps * 8, "seed": 5}
    with Collector(counting_vec(lengths, mode), _flaky(fail_at), worker_id=93, **common) as c:
        batches, want_errors = _outputs_through_errors(c)
    assembler, want = TrajectoryAssembler(), []
    for batch in batches:
        assembler.ingest(batch)
        while len(assembler) >= trajs:
            want.append(assembler.emit(trajs, fmt))
    drained = assembler.drain(fmt)
    want += [] if drained.batch is None else [drained.batch]
    with Collector(
        counting_vec(lengths, mode),
        _flaky(fail_at),
        trajs_per_batch=trajs,
        traj_format=fmt,
        worker_id=93,
        **common,
    ) as c:
        got, errors = _outputs_through_errors(c)
    assert errors == want_errors
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        _assert_same(g, w)  # the same worker id: the very same trajectory ids
