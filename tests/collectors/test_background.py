"""Background collection: fills the buffer, pause/resume, stops on request, total_frames,
errors surface in the caller, policy weight updates."""

from __future__ import annotations

import time

import pytest
import torch
from tensordict import TensorDict

from splice import Collector
from splice.layout import CUT, MASK
from splice.testing import ConstantPolicy, counting_vec


def _wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def test_start_fills_buffer_and_honours_total_frames(list_buffer):
    rb = list_buffer
    c = Collector(counting_vec([3, 4]), frames_per_batch=20, total_frames=200, replay_buffer=rb)
    c.start()
    c.wait(timeout=30)
    assert not c.running
    assert len(rb) == 200 and len(rb.items) == 10
    data = torch.cat(rb.items, 1)
    assert torch.equal(data["observation"][..., 0], torch.arange(100.0).expand(2, -1))
    c.shutdown()


def test_iteration_with_buffer_extends_and_yields(list_buffer):
    rb = list_buffer
    with Collector(counting_vec([3]), frames_per_batch=5, total_frames=15, replay_buffer=rb) as c:
        out = list(c)
    assert [id(x) for x in out] == [id(x) for x in rb.items]


def test_pause_resume_and_shutdown_stop_within_a_batch(list_buffer):
    rb = list_buffer
    c = Collector(counting_vec([3, 4]), frames_per_batch=20, replay_buffer=rb)  # endless
    c.start()
    _wait_for(lambda: len(rb) >= 40)
    with c.pause():
        n = len(rb)
        time.sleep(0.05)
        assert len(rb) == n  # nothing written while paused
        assert n % 20 == 0  # whole batches only
    _wait_for(lambda: len(rb) > n)
    c.shutdown(timeout=10)
    assert not c.running
    n = len(rb)
    time.sleep(0.05)
    assert len(rb) == n and n % 20 == 0
    data = torch.cat(rb.items, 1)  # nothing lost between batches
    assert torch.equal(data["observation"][..., 0], torch.arange(n / 2).expand(2, -1))


def test_shutdown_flushes_in_flight_episodes_with_trajs_per_batch(list_buffer):
    rb = list_buffer
    c = Collector(
        counting_vec([3, 500]),
        frames_per_batch=20,
        trajs_per_batch=2,
        traj_format="cat",
        replay_buffer=rb,
    )
    c.start()
    _wait_for(lambda: len(rb.items) >= 2)
    c.shutdown(timeout=10)
    assert bool(rb.items[-1][CUT].any())  # the episode of env 1 (length 500) is flushed, cut
    assert len(rb) == c.frames  # every collected frame reached the buffer


def test_worker_exception_is_raised_in_caller(list_buffer):
    calls = {"n": 0}

    def policy(td):
        calls["n"] += 1
        if calls["n"] > 30:
            raise ValueError("policy exploded")
        td["action"] = torch.zeros(td.batch_size, dtype=torch.long)
        return td

    c = Collector(counting_vec([3]), policy, frames_per_batch=10, replay_buffer=list_buffer)
    c.start()
    with pytest.raises(RuntimeError, match="background collection failed") as info:
        c.wait(timeout=10)
    assert isinstance(info.value.__cause__, ValueError)
    c.shutdown()


def test_start_needs_a_buffer_and_iteration_is_refused_while_running(list_buffer):
    c = Collector(counting_vec([3]), frames_per_batch=10)
    with pytest.raises(RuntimeError, match="replay_buffer"):
        c.start()
    c.shutdown()
    c = Collector(counting_vec([3]), frames_per_batch=10, replay_buffer=list_buffer)
    c.start()
    with pytest.raises(RuntimeError, match="background"):
        iter(c)
    with pytest.raises(RuntimeError, match="already"):
        c.start()
    c.shutdown()


def test_update_policy_weights_in_background(list_buffer):
    rb = list_buffer
    policy = ConstantPolicy()
    c = Collector(counting_vec([1000]), policy, frames_per_batch=10, replay_buffer=rb)
    c.start()
    _wait_for(lambda: len(rb) >= 30)
    new = ConstantPolicy()
    with torch.no_grad():
        new.bias.fill_(1.0)
    c.update_policy_weights_(new)
    n = len(rb.items)
    _wait_for(lambda: len(rb.items) >= n + 3)
    c.shutdown()
    actions = [int(b["action"].max()) for b in rb.items]
    assert actions[0] == 0 and actions[-1] == 1
    first_new = actions.index(1)
    assert all(a == 1 for a in actions[first_new:])  # effective for every later step
    assert first_new <= n + 1  # at the latest from the batch after the update


def test_update_policy_weights_forms():
    policy = ConstantPolicy()
    c = Collector(counting_vec([1000]), policy, frames_per_batch=10, total_frames=40)
    it = iter(c)
    assert int(next(it)["action"].max()) == 0
    c.update_policy_weights_({"bias": torch.tensor(1.0)})
    assert int(next(it)["action"].min()) == 1
    c.update_policy_weights_(weights=TensorDict({"bias": torch.tensor(-1.0)}, []))
    assert int(next(it)["action"].max()) == 0
    c.update_policy_weights_()  # shared weights: nothing to do
    with pytest.raises(TypeError, match="weights"):
        c.update_policy_weights_(3)
    c.shutdown()
    lam = Collector(
        counting_vec([3]),
        lambda td: td.set("action", torch.zeros(1, dtype=torch.long)),
        frames_per_batch=2,
    )
    with pytest.raises(TypeError, match=r"nn\.Module"):
        lam.update_policy_weights_({"bias": torch.tensor(1.0)})
    lam.shutdown()


def test_split_and_mask_in_padded_background_output(list_buffer):
    rb = list_buffer
    c = Collector(
        counting_vec([3, 4]),
        frames_per_batch=20,
        total_frames=60,
        trajs_per_batch=3,
        replay_buffer=rb,
    )
    c.start()
    c.wait(timeout=30)
    assert sum(int(b[MASK].sum()) for b in rb.items) == 60
    c.shutdown()
