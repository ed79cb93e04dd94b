"""Complete episodes (trajs_per_batch), end-of-run flush, len(), set_truncated, split_trajs."""

from __future__ import annotations

import pytest
import torch
from gymnasium.vector import AutoresetMode

from splice import Collector
from splice.layout import CUT, DONE, IS_INIT, MASK, TRAJ_IDS, TRUNCATED
from splice.testing import counting_vec


def _rows(batch, fmt):
    """Split an emitted batch into one TensorDict per episode."""
    if fmt == "padded":
        return [row[row[MASK]] for row in batch]
    ids = batch[TRAJ_IDS]
    bounds = (torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist()
    return list(
        torch.split(
            batch, [b - a for a, b in zip([0, *bounds], [*bounds, ids.numel()], strict=True)]
        )
    )


def _check_complete(episode, lengths):
    obs = episode["observation"]
    assert bool(episode[IS_INIT][0]) and not bool(episode[IS_INIT][1:].any())
    assert bool(episode[DONE][-1]) and not bool(episode[DONE][:-1].any())
    assert not bool(episode[CUT].any())
    assert episode[TRAJ_IDS].unique().numel() == 1
    # counting payload: consecutive steps of one env, from episode step 0 to the env's length
    assert torch.equal(obs[1:, 0] - obs[:-1, 0], torch.ones(obs.shape[0] - 1))
    assert torch.equal(obs[:, 1], torch.arange(obs.shape[0], dtype=torch.float32))
    assert obs.shape[0] == lengths[int(obs[0, 2])]


@pytest.mark.parametrize("fmt", ["padded", "cat"])
@pytest.mark.parametrize("set_truncated", [False, True])
def test_trajs_per_batch_yields_complete_episodes(fmt, set_truncated):
    lengths = [3, 7, 12, 30]  # longer than a batch (T = 5): episodes span several batches
    c = Collector(
        counting_vec(lengths),
        frames_per_batch=20,
        total_frames=400,
        trajs_per_batch=4,
        traj_format=fmt,
        set_truncated=set_truncated,
        worker_id=70,
    )
    out = list(c)
    *full, last = out
    assert len(full) > 5
    seen = []
    for batch in full:
        episodes = _rows(batch, fmt)
        assert len(episodes) == 4
        for ep in episodes:
            _check_complete(ep, lengths)
            seen.append(int(ep[TRAJ_IDS][0]))
    assert len(set(seen)) == len(seen)  # never the same episode twice (TorchRL emits fragments)
    # the final batch: leftover complete episodes then in-flight ones marked cut, nothing lost
    final = _rows(last, fmt)
    cut = [ep for ep in final if bool(ep[CUT][-1])]
    assert cut and all(not bool(ep[DONE][-1]) for ep in cut)
    assert all(not bool(ep[TRUNCATED][-1]) for ep in cut)
    total = sum(int(ep.numel()) for b in out for ep in _rows(b, fmt))
    assert total == 400  # every collected frame is in exactly one yielded episode
    with pytest.raises(TypeError, match="trajs_per_batch"):
        len(c)
    c.shutdown()


def test_drop_incomplete_drops_only_in_flight_episodes():
    c = Collector(
        counting_vec([3, 60]),
        frames_per_batch=20,
        total_frames=100,
        trajs_per_batch=5,
        drop_incomplete=True,
    )
    out = list(c)
    frames = sum(int(b[MASK].sum()) for b in out)
    # env 1 never finishes an episode (length 60); env 0 finishes 16 (steps 0..47) + 1 in flight
    assert frames == 48
    assert all(not bool(b[CUT].any()) for b in out)
    assert c.dropped_trajs == 2
    assert c.dropped_frames == c.frames - frames  # every collected frame is accounted for
    c.shutdown()


@pytest.mark.parametrize("fpb,total", [(20, 100), (20, 90), (7, 50)])
def test_len_equals_number_of_yields(fpb, total):
    c = Collector(counting_vec([3, 4]), frames_per_batch=fpb, total_frames=total)
    n = len(c)
    out = list(c)
    assert n == len(out) and len(c) == 0
    assert c.frames == len(out) * c.frames_per_batch >= total
    c.shutdown()


def test_len_undefined_when_endless():
    c = Collector(counting_vec([3]), frames_per_batch=4)
    with pytest.raises(TypeError, match="endless"):
        len(c)
    c.shutdown()


def test_cut_and_set_truncated_marks():
    plain = Collector(counting_vec([100]), frames_per_batch=10, total_frames=20, worker_id=71)
    marked = Collector(
        counting_vec([100]), frames_per_batch=10, total_frames=20, set_truncated=True, worker_id=72
    )
    for a, b in zip(plain, marked, strict=True):
        assert bool(a[CUT][0, -1]) and not bool(a[CUT][0, :-1].any())
        assert not bool(a[DONE][0, -1]) and not bool(a[TRUNCATED][0, -1])
        assert bool(b[CUT][0, -1]) and bool(b[DONE][0, -1]) and bool(b[TRUNCATED][0, -1])
        assert not bool(b["next", "terminated"].any())
    plain.shutdown()
    marked.shutdown()


def test_split_trajs():
    c = Collector(counting_vec([3, 4]), frames_per_batch=20, total_frames=20, split_trajs=True)
    (batch,) = list(c)
    assert batch.ndim == 2 and MASK in batch.keys(True)
    assert int(batch[MASK].sum()) == 20
    for row in batch:
        assert row[TRAJ_IDS][row[MASK]].unique().numel() == 1
    c.shutdown()


def test_max_frames_per_traj_truncates_with_new_id():
    c = Collector(
        counting_vec([100, 100]), frames_per_batch=20, total_frames=40, max_frames_per_traj=4
    )
    data = torch.cat(list(c), 1)
    trunc = data[TRUNCATED].squeeze(-1)
    assert torch.equal(trunc[:, 3::4], torch.ones(2, 5, dtype=torch.bool))
    assert int(trunc.sum()) == 10
    ids = data[TRAJ_IDS]
    assert ids[:, ::4].unique().numel() == 10  # a new id every 4 steps
    c.shutdown()


def test_reset_at_each_iter_starts_fresh_episodes():
    c = Collector(counting_vec([100]), frames_per_batch=5, total_frames=15, reset_at_each_iter=True)
    batches = list(c)
    for b in batches:
        assert bool(b[IS_INIT][0, 0]) and bool(b[CUT][0, -1])
        assert torch.equal(b["observation"][0, :, 1], torch.arange(5, dtype=torch.float32))
    ids = [int(b[TRAJ_IDS][0, 0]) for b in batches]
    assert len(set(ids)) == 3
    c.shutdown()


def test_reset_at_each_iter_restarts_the_time_limit_and_the_episode_returns():
    # A reset of every env restarts the step count of max_frames_per_traj and the tracked
    # returns through the next step's is_init alone: nothing of the batch before carries over.
    def always_one(td):
        td["action"] = torch.ones(td.batch_size, dtype=torch.long)  # reward 1 per step
        return td

    c = Collector(
        counting_vec([100]),
        always_one,
        frames_per_batch=6,
        total_frames=18,
        reset_at_each_iter=True,
        max_frames_per_traj=4,
        track_episodes=True,
    )
    batches = list(c)
    for b in batches:
        assert b["observation"][0, :, 1].tolist() == [0, 1, 2, 3, 0, 1]
        assert b[TRUNCATED][0, :, 0].tolist() == [False, False, False, True, False, False]
    assert [r for _, r in c.episode_log] == [4.0, 4.0, 4.0]
    assert len({int(i) for b in batches for i in b[TRAJ_IDS].unique()}) == 6
    c.shutdown()


def test_init_random_frames_keeps_policy_keys():
    def policy(td):
        td["action"] = torch.ones(td.batch_size, dtype=torch.long)
        td["logits"] = torch.full((*td.batch_size, 2), 7.0)
        return td

    # SAME_STEP: no NEXT_STEP surplus, so batch 2 holds policy steps only (with NEXT_STEP its
    # first columns may be random steps carried over from batch 1, with zero policy outputs)
    env = counting_vec([3, 4], AutoresetMode.SAME_STEP)
    c = Collector(env, policy, frames_per_batch=20, total_frames=60, init_random_frames=20, seed=0)
    first, second, third = list(c)
    assert bool((first["logits"] == 0).all())
    assert bool((second["logits"] == 7).all()) and bool((second["action"] == 1).all())
    assert set(first.keys(True, True)) == set(third.keys(True, True))
    c.shutdown()
