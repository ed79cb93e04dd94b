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
from splice.testing import counting_vec, threshold_policy

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


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    steps=st.integers(1, 7),
    n_batches=st.integers(1, 6),
    trajs=st.integers(1, 4),
    mode=st.sampled_from(MODES),
    max_len=st.one_of(st.none(), st.integers(1, 6)),
    fmt=st.sampled_from(["cat", "padded"]),
    set_truncated=st.booleans(),
    drop=st.booleans(),
    random_batches=st.integers(0, 2),
)
def test_staged_episodes_equal_the_assembler_on_plain_batches(
    lengths, steps, n_batches, trajs, mode, max_len, fmt, set_truncated, drop, random_batches
):
    b = len(lengths)
    common = {
        "frames_per_batch": b * steps,
        "total_frames": b * steps * n_batches,
        "max_frames_per_traj": max_len,
        "set_truncated": set_truncated,
        "init_random_frames": b * steps * random_batches,
        "seed": 3,
    }
    want, want_returns, drained = _reference(
        lambda: counting_vec(lengths, mode),
        threshold_policy,
        trajs=trajs,
        fmt=fmt,
        drop=drop,
        worker_id=90,
        **common,
    )
    with Collector(
        counting_vec(lengths, mode),
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
