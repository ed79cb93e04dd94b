"""Background collection: fills the buffer, pause/resume, stops on request, total_frames,
errors surface in the caller, policy weight updates."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from tensordict import TensorDict

from splice import Collector, LazyTensorStorage, ReplayBuffer
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


def test_gate_holds_collection_until_it_opens_and_shutdown_still_works(list_buffer):
    rb = list_buffer
    allowed = [2]  # batches the caller lets the collector write
    c = Collector(counting_vec([3, 4]), frames_per_batch=20, replay_buffer=rb)  # endless
    c.start(gate=lambda: len(rb.items) < allowed[0])
    _wait_for(lambda: len(rb.items) == 2)
    time.sleep(0.1)  # however long the caller takes, the gate holds: nothing more is written
    assert len(rb.items) == 2
    allowed[0] = 5
    _wait_for(lambda: len(rb.items) == 5)
    time.sleep(0.05)
    assert len(rb.items) == 5
    with c.pause():  # a pause request is honoured while the gate is closed
        assert c.running
    c.shutdown(timeout=10)  # and so is a stop
    assert not c.running and len(rb) == 100


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


# ------------------------------------------------------ control after the end (issue 11, 13)
def failing_policy(after: int):
    calls = {"n": 0}

    def policy(td):
        calls["n"] += 1
        if calls["n"] > after:
            raise ValueError("policy exploded")
        td["action"] = torch.zeros(td.batch_size, dtype=torch.long)
        return td

    return policy


def test_pause_and_resume_after_shutdown_raise(list_buffer):
    c = Collector(counting_vec([3]), frames_per_batch=10, replay_buffer=list_buffer)
    c.start()
    c.shutdown(timeout=10)
    with pytest.raises(RuntimeError, match=r"pause\(\): the collector is shut down"):
        c.pause()
    with pytest.raises(RuntimeError, match=r"resume\(\): the collector is shut down"):
        c.resume()
    with pytest.raises(RuntimeError, match="shut down"):
        iter(c)


def test_after_a_background_failure_nothing_collects_in_the_foreground(list_buffer):
    """The thread died: iterating used to collect silently in the caller's thread, the error
    surfacing only at shutdown(). Now iter(), pause() and resume() raise at once, every time,
    with the thread's exception as the cause; shutdown() then frees everything quietly."""
    c = Collector(
        counting_vec([3]), failing_policy(30), frames_per_batch=10, replay_buffer=list_buffer
    )
    c.start()
    _wait_for(lambda: not c.running)
    frames = c.frames
    for attempt in (lambda: iter(c), c.pause, c.resume, lambda: iter(c)):
        with pytest.raises(RuntimeError, match="background collection failed") as info:
            attempt()
        assert isinstance(info.value.__cause__, ValueError)
    assert c.frames == frames  # nothing was collected in the foreground
    c.shutdown()  # reported already: no second report
    c.shutdown()


def test_pause_after_the_run_ended_by_itself_does_nothing(list_buffer):
    c = Collector(
        counting_vec([3]), frames_per_batch=10, total_frames=30, replay_buffer=list_buffer
    )
    c.start()
    c.wait(timeout=30)
    with c.pause(timeout=5):
        pass
    c.shutdown()


# ------------------------------------------------- frame accounting (issue 11, item 15)
class FlakyReplayBuffer(ReplayBuffer):
    """A real replay buffer whose ``extend`` fails like a full disk: on call ``fail_at`` (and,
    with ``keep_failing``, every later call), before anything is written."""

    def __init__(self, fail_at: int, keep_failing: bool) -> None:
        super().__init__(storage=LazyTensorStorage(1_000_000))
        self.fail_at, self.keep_failing, self.calls = fail_at, keep_failing, 0

    def extend(self, data):
        self.calls += 1
        if self.calls == self.fail_at or (self.keep_failing and self.calls > self.fail_at):
            raise OSError(28, "No space left on device")
        return super().extend(data)


def assert_every_frame_accounted_for(c: Collector, rb: ReplayBuffer) -> None:
    assert c.frames_buffered == 0
    assert c.frames == len(rb) + c.dropped_frames


@pytest.mark.parametrize("keep_failing", [False, True])
@pytest.mark.parametrize("trajs_per_batch", [None, 3])
def test_a_failed_background_extend_counts_its_frames_as_dropped(keep_failing, trajs_per_batch):
    """A background extend fails: collector.frames said 200 while 160 were stored and nothing
    counted the 40 lost. Now frames == stored + dropped_frames, also for the episodes the
    assembler still held (drained at the end: stored, or dropped if the buffer keeps failing)."""
    rb = FlakyReplayBuffer(fail_at=5, keep_failing=keep_failing)
    c = Collector(
        counting_vec([3, 7, 50]),
        frames_per_batch=30,
        trajs_per_batch=trajs_per_batch,
        replay_buffer=rb,
    )
    c.start()
    with pytest.raises(RuntimeError, match="background collection failed") as info:
        c.wait(timeout=30)
    assert isinstance(info.value.__cause__, OSError)
    c.shutdown()
    assert c.dropped_frames > 0 and c.dropped_trajs > 0
    assert_every_frame_accounted_for(c, rb)
    if trajs_per_batch is None:
        assert c.dropped_frames == 30  # the one batch whose extend failed
        assert c.frames == len(rb) + 30


def test_a_failed_extend_while_iterating_counts_its_frames_as_dropped():
    rb = FlakyReplayBuffer(fail_at=2, keep_failing=False)
    c = Collector(counting_vec([3, 4]), frames_per_batch=10, total_frames=40, replay_buffer=rb)
    it = iter(c)
    first = next(it)
    with pytest.raises(OSError, match="No space"):
        next(it)
    # The lost batch: its 10 frames, and the trajectory fragments they belong to. Steps 5-9
    # of env 0 (episodes of 3 steps) hold 3 episodes' steps, those of env 1 (4 steps) 2.
    assert c.dropped_frames == 10
    assert c.dropped_trajs == 3 + 2
    rest = list(c)  # the run goes on
    assert c.frames == 40 and len(rb) == 30
    assert_every_frame_accounted_for(c, rb)
    assert sum(b.numel() for b in [first, *rest]) == len(rb)


# ------------------------------------------------------- interpreter exit (issue 11, item 4)
_EXIT_SCRIPT = """
import atexit, os, sys, time
import gymnasium as gym
from splice import Collector, LazyTensorStorage, ReplayBuffer, SliceSampler

mode = sys.argv[1]
if mode == "async":
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async")
    print("workers", *[p.pid for p in env.unwrapped.processes], flush=True)
else:
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
sampler = SliceSampler(slice_len=8) if mode == "slice" else None
rb = ReplayBuffer(storage=LazyTensorStorage(50_000), **({"sampler": sampler} if sampler else {}))
c = Collector(env, frames_per_batch=400, replay_buffer=rb)

def check():  # registered first, so it runs after splice's exit hook
    print("at exit: running", c.running, "frames", c.frames, "stored", rb.write_count,
          "env closed", env.closed, flush=True)

atexit.register(check)
c.start()
while rb.write_count == 0:  # (however slow the machine) a batch stored, the next under way
    time.sleep(0.01)
time.sleep(float(sys.argv[2]))
print("leaving with the collector running:", c.running, flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\\tZ" not in next(line for line in status if line.startswith("State:"))
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("mode", ["plain", "slice", "async"])
def test_interpreter_exit_with_a_background_collector_running_is_clean(mode):
    """The script ends while collecting in the background: exit status 0 (it was 134,
    "terminate called without an active exception", in 2/5 runs; 10/10 with a SliceSampler
    buffer), the collector shut down before the interpreter tears down, every batch stored,
    no worker process left."""
    run = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, mode, "1.0"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "terminate called" not in run.stderr
    assert "leaving with the collector running: True" in run.stdout, run.stdout
    at_exit = run.stdout.split("at exit: ")[-1].split()
    assert at_exit[:2] == ["running", "False"], run.stdout
    frames, stored = int(at_exit[3]), int(at_exit[5])
    assert frames == stored >= 400  # the batch in progress was finished and stored
    assert at_exit[6:] == ["env", "closed", "True"]
    if mode == "async":
        pids = [int(p) for p in run.stdout.split("workers")[1].split("\n")[0].split()]
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), f"worker processes left: {pids}"
