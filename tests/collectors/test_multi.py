"""MultiSyncCollector and MultiAsyncCollector with real worker processes: every guarantee of
``Collector`` (ids, episodes across batches, budget, whole episodes, replay buffer, recurrent
state, seeds), weights, faults and shutdown. The autouse fixture of ``conftest.py`` fails any
test that leaves a process behind."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict, TensorDictBase

from splice import (
    LazyTensorStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
    SliceSampler,
    WorkerError,
)
from splice.collectors.ids import ID_BITS, worker_of
from splice.layout import CUT, DONE, IS_INIT, MASK, TRAJ_IDS
from splice.testing import (
    ConstantPolicy,
    CountingEnv,
    FaultyEnv,
    assert_worker_streams,
    counting_vec,
)

pytestmark = pytest.mark.timeout(120)
# Classes and functions of this module travel to the workers by value (the workers cannot
# import a test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KINDS = [MultiSyncCollector, MultiAsyncCollector]
ROOT = Path(__file__).resolve().parents[2]


def counting(*lengths: int, mode: AutoresetMode = AutoresetMode.NEXT_STEP):
    return lambda: counting_vec(list(lengths), mode)


class GRUPolicy(torch.nn.Module):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(3, hidden)
        self.head = torch.nn.Linear(hidden, 2)
        self.hidden = hidden

    def forward(self, td):
        h = td.get("h", None)
        if h is None:
            h = torch.zeros(*td.batch_size, self.hidden)
        h = self.cell(td["observation"] / 10, h)
        td["action"] = self.head(h).argmax(-1)
        td["next", "h"] = h
        return td


class SlowEnv(CountingEnv):
    """Takes 1 ms per step (so that a run lasts long enough to be interrupted)."""

    def step(self, action):
        time.sleep(0.001)
        return super().step(action)


def sampling_policy(td):
    """Samples its action from torch's global RNG (so the worker's torch seed shows)."""
    td["action"] = torch.randint(0, 2, td.batch_size)
    return td


def vec(make):
    """One env made by ``make`` as a vector env (like ``counting(...)``'s)."""
    return lambda: gym.vector.SyncVectorEnv([make])


def wait_for(condition, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


# --------------------------------------------------------------------------- layouts
def test_sync_batch_is_every_worker_part_in_worker_order():
    with MultiSyncCollector(
        [counting(3, 4), counting(5)], frames_per_batch=14, total_frames=28
    ) as collector:
        batches = list(collector)
        spaces = [s["worker_id"] for s in collector.state_dict()["ids"]]
    # T = ceil(14 / 3) = 5 for both workers: [3, 5], frames_per_batch rounded to 15
    assert [b.batch_size for b in batches] == [torch.Size([3, 5])] * 2
    assert collector.frames_per_batch == 15 and collector.frames == 30
    for batch in batches:
        rows = worker_of(batch[TRAJ_IDS][:, 0]).tolist()
        assert rows == [spaces[0], spaces[0], spaces[1]]
    assert_worker_streams(batches)


def test_single_env_workers_give_rows_in_sync_and_t_batches_in_async():
    make = lambda: CountingEnv(length=3)  # noqa: E731
    with MultiSyncCollector(make, num_workers=2, frames_per_batch=10, total_frames=10) as c:
        (batch,) = list(c)
    assert batch.batch_size == torch.Size([2, 5])
    with MultiAsyncCollector(make, num_workers=2, frames_per_batch=10, total_frames=20) as c:
        batches = list(c)
    assert [b.batch_size for b in batches] == [torch.Size([10])] * 2
    assert_worker_streams(batches)


def test_async_needs_equal_worker_batches():
    with pytest.raises(ValueError, match=r"same envs.*1 \(vector env\), 2 \(vector env\)"):
        MultiAsyncCollector([counting(3), counting(3, 3)], frames_per_batch=10)


# ------------------------------------------------------------------------ guarantees
@pytest.mark.parametrize("kind", KINDS)
def test_ids_unique_across_workers_and_episodes_continue_across_batches(kind):
    """Episodes of 7 steps in batches of 5 steps: most episodes span two batches."""
    fpb = 20 if kind is MultiSyncCollector else 10  # T = 5: 4 rows (sync), 2 rows (async)
    with kind(counting(7, 3), num_workers=2, frames_per_batch=fpb, total_frames=200) as c:
        batches = list(c)
    assert all(b.shape[-1] == 5 for b in batches)
    steps = assert_worker_streams(batches)
    assert len(steps) == 4 and sum(steps.values()) == 200
    with kind(counting(7, 3), num_workers=2, frames_per_batch=10, total_frames=20) as c:
        later = list(c)
    first = set(torch.cat([b[TRAJ_IDS].flatten() for b in batches]).tolist())
    second = set(torch.cat([b[TRAJ_IDS].flatten() for b in later]).tolist())
    assert not first & second  # another collector of the process: other id spaces


def test_worker_ids_name_the_id_spaces():
    with MultiSyncCollector(
        counting(3), num_workers=2, frames_per_batch=4, total_frames=4, worker_ids=[901, 905]
    ) as c:
        (batch,) = list(c)
    assert worker_of(batch[TRAJ_IDS][:, 0]).tolist() == [901, 905]
    with pytest.raises(ValueError, match="distinct"):
        MultiSyncCollector(counting(3), num_workers=2, frames_per_batch=4, worker_ids=[1, 1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("total", "expected_batches"), [(40, 2), (45, 3), (20, 1), (1, 1)])
def test_total_frames_exact_as_for_collector(kind, total, expected_batches):
    with kind(counting(3, 4), num_workers=2, frames_per_batch=20, total_frames=total) as c:
        assert len(c) == expected_batches
        batches = list(c)
        assert len(c) == 0
    assert len(batches) == expected_batches
    assert c.frames == 20 * expected_batches == sum(b.numel() for b in batches)
    # What the workers themselves counted: nothing collected beyond what was yielded.
    assert sum(c.worker_frames) == c.frames
    assert_worker_streams(batches)


@pytest.mark.parametrize("kind", KINDS)
def test_background_pause_and_shutdown_drop_nothing(kind, list_buffer):
    rb = list_buffer
    collector = kind(counting(3, 5), num_workers=2, frames_per_batch=20, replay_buffer=rb)
    collector.start()
    wait_for(lambda: len(rb) >= 200)
    with collector.pause():
        n = len(rb)
        time.sleep(0.2)
        assert len(rb) == n  # nothing written while paused
    wait_for(lambda: len(rb) > n + 100)
    collector.shutdown()
    # Every batch any worker collected is in the buffer, once.
    assert len(rb) == collector.frames == sum(collector.worker_frames)
    assert_worker_streams(rb.items)


@pytest.mark.parametrize("kind", KINDS)
def test_background_honours_total_frames(kind, list_buffer):
    collector = kind(
        counting(3), num_workers=2, frames_per_batch=10, total_frames=95, replay_buffer=list_buffer
    )
    collector.start()
    collector.wait(timeout=60)
    assert len(list_buffer) == collector.frames == 100  # ceil(95 / 10) batches
    collector.shutdown()
    assert sum(collector.worker_frames) == 100


def test_sync_weights_apply_to_the_next_batch():
    policy = ConstantPolicy()
    with MultiSyncCollector(
        counting(50), policy, num_workers=2, frames_per_batch=10, total_frames=60
    ) as c:
        it = iter(c)
        assert int(next(it)["action"].max()) == 0
        with torch.no_grad():
            policy.bias.fill_(1.0)  # trained in place, then pushed
        c.update_policy_weights_()
        assert int(next(it)["action"].min()) == 1
        c.update_policy_weights_({"bias": torch.tensor(-1.0)})
        assert int(next(it)["action"].max()) == 0
        c.update_policy_weights_(weights=TensorDict({"bias": torch.tensor(2.0)}, []))
        assert bool((next(it)["action"] == 1).all())


def test_async_weights_staleness_is_one_batch_per_worker_at_most():
    policy = ConstantPolicy()
    with MultiAsyncCollector(
        counting(1000), policy, num_workers=2, frames_per_batch=10, total_frames=400
    ) as c:
        it = iter(c)
        before = [next(it) for _ in range(5)]
        c.update_policy_weights_({"bias": torch.tensor(1.0)})
        after = list(it)
    assert all(int(b["action"].max()) == 0 for b in before)
    by_worker = defaultdict(list)
    for batch in after:
        by_worker[int(worker_of(batch[TRAJ_IDS][0, 0]))].append(int(batch["action"].min()))
    for actions in by_worker.values():
        # Only the batch each worker had under way (it may be yielded late: a slow worker's
        # batch comes after the fast worker's next ones) has the old weights.
        assert actions in ([1] * len(actions), [0] + [1] * (len(actions) - 1))
    assert_worker_streams(before + after)


@pytest.mark.parametrize("kind", KINDS)
def test_weight_updates_while_collecting_drop_nothing(kind, list_buffer):
    rb = list_buffer
    policy = ConstantPolicy()
    collector = kind(counting(1000), policy, num_workers=2, frames_per_batch=10, replay_buffer=rb)
    collector.start()
    for value in [1.0, -1.0] * 10:
        n = len(rb)
        wait_for(lambda n=n: len(rb) > n)
        collector.update_policy_weights_({"bias": torch.tensor(value)})
    collector.shutdown()
    assert len(rb) == collector.frames == sum(collector.worker_frames)
    assert_worker_streams(rb.items)
    for batch in rb.items:  # weights change between batches, never within one
        assert batch["action"].unique().numel() == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_incomplete", [False, True])
def test_trajs_per_batch_assembles_episodes_across_workers(kind, drop_incomplete):
    with kind(
        counting(6, 9),
        num_workers=2,
        frames_per_batch=8,
        total_frames=160,
        trajs_per_batch=3,
        traj_format="cat",
        drop_incomplete=drop_incomplete,
    ) as c:
        outputs = list(c)
    final = outputs[-1]
    complete = outputs if drop_incomplete else outputs[:-1]
    episodes = 0
    for out in complete:
        ids = out[TRAJ_IDS]
        starts = torch.cat([torch.tensor([True]), ids[1:] != ids[:-1]])
        assert int(starts.sum()) == 3 or out is final
        assert torch.equal(out[IS_INIT][:, 0], starts)  # every episode from its first step
        ends = torch.cat([ids[1:] != ids[:-1], torch.tensor([True])])
        assert torch.equal(out[DONE][:, 0], ends)  # ... to its end, one end each
        lengths = torch.diff(torch.cat([starts.nonzero()[:, 0], torch.tensor([ids.numel()])]))
        assert set(lengths.tolist()) <= {6, 9}
        episodes += int(starts.sum())
    assert len(set(torch.cat([o[TRAJ_IDS] for o in outputs]).tolist())) == sum(
        int(torch.unique_consecutive(o[TRAJ_IDS]).numel()) for o in outputs
    )  # no episode emitted twice
    # One episode in flight per env at the end, unless the env just ended one.
    in_flight = sum((frames // 2) % length != 0 for frames in c.worker_frames for length in (6, 9))
    assert in_flight >= 1
    if drop_incomplete:
        assert c.dropped_trajs == in_flight
        assert sum(o.numel() for o in outputs) + c.dropped_frames == c.frames
    else:
        assert c.dropped_trajs == 0 and int(final[CUT].sum()) == in_flight
        assert sum(o.numel() for o in outputs) == c.frames == 160


@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_state_is_carried_per_worker(kind):
    with kind(
        counting(4, 7), GRUPolicy(), num_workers=2, frames_per_batch=12, total_frames=72
    ) as c:
        batches = list(c)
    by_env: dict[tuple[int, int], list[TensorDictBase]] = defaultdict(list)
    for batch in batches:
        for row in batch:
            by_env[(int(worker_of(row[TRAJ_IDS][0])), int(row["observation"][0, 2]))].append(row)
    assert len(by_env) == 4
    for rows in by_env.values():
        stream = torch.cat(rows)
        h, next_h, init = stream["h"], stream["next", "h"], stream[IS_INIT][:, 0]
        assert bool((h[init] == 0).all())
        carried = ~init[1:]
        assert torch.equal(h[1:][carried], next_h[:-1][carried])  # across batches too


def test_seed_makes_the_sync_run_reproducible():
    def run(seed):
        with MultiSyncCollector(
            lambda: gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"),
            sampling_policy,
            num_workers=2,
            frames_per_batch=40,
            total_frames=120,
            seed=seed,
        ) as c:
            return list(c)

    a, b, other = run(7), run(7), run(8)
    for x, y in zip(a, b, strict=True):
        for key in x.keys(include_nested=True, leaves_only=True):
            if key == TRAJ_IDS:  # other id spaces (the second collector of this process)
                low = (1 << ID_BITS) - 1
                assert torch.equal(x[key] & low, y[key] & low)
            else:
                assert torch.equal(x[key], y[key]), key
    assert not torch.equal(a[0]["observation"], other[0]["observation"])
    halves = a[0]["action"][:2], a[0]["action"][2:]
    assert not torch.equal(*halves)  # the workers' torch RNGs differ


def test_policy_factory_builds_the_policy_in_each_worker_with_the_callers_weights():
    torch.manual_seed(0)
    with MultiSyncCollector(
        counting(1000),
        policy_factory=ConstantPolicy,
        num_workers=2,
        frames_per_batch=10,
        total_frames=20,
    ) as c:
        it = iter(c)
        assert int(next(it)["action"].max()) == 0
        assert isinstance(c.policy, ConstantPolicy)  # the caller's copy holds the weights
        c.update_policy_weights_({"bias": torch.tensor(1.0)})
        assert int(next(it)["action"].min()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_one_replay_buffer_fed_by_every_worker_while_the_learner_samples(kind):
    rb = ReplayBuffer(
        storage=LazyTensorStorage(3_000),
        sampler=SliceSampler(slice_len=5, as_sequences=True, seed=0),
        batch_size=40,
    )
    collector = kind(
        counting(6, 11, 17),
        num_workers=2,
        frames_per_batch=30,
        total_frames=6_000,
        replay_buffer=rb,
    )
    collector.start()
    wait_for(lambda: len(rb) >= 200)
    samples = 0
    while collector.running or samples < 20:
        sample = rb.sample()
        ids = sample[TRAJ_IDS]
        assert bool((ids == ids[:, :1]).all()), "a slice mixes trajectories"
        assert bool((worker_of(ids) == worker_of(ids[:, :1])).all()), "a slice mixes workers"
        obs = sample["observation"]
        assert bool((obs[..., 2] == obs[:, :1, 2]).all()), "a slice mixes envs"
        assert bool((torch.diff(obs[..., 1], dim=1) == 1).all()), "a slice is not contiguous"
        assert bool(sample[MASK].all())
        samples += 1
    collector.shutdown()
    assert samples >= 20
    assert rb.write_count == collector.frames == sum(collector.worker_frames) == 6_000


@pytest.mark.parametrize("kind", KINDS)
def test_split_trajs_and_state_dict(kind):
    with kind(counting(3, 4), num_workers=2, frames_per_batch=12, total_frames=24) as c:
        it = iter(c)
        split = next(it) if kind is MultiAsyncCollector else None
        state = c.state_dict()
    assert len(state["ids"]) == 2 and state["frames"] == c.frames
    with kind(
        counting(3, 4), num_workers=2, frames_per_batch=12, total_frames=48, split_trajs=True
    ) as c:
        c.load_state_dict(state)
        out = list(c)
    assert c.frames == 48 and len(out) == (48 - state["frames"]) // 12
    spaces = {s["worker_id"] for s in state["ids"]}
    for batch in out:
        assert MASK in batch.keys(include_nested=True)
        ids = batch[TRAJ_IDS][batch[MASK]]
        assert set(worker_of(ids).tolist()) <= spaces  # the saved spaces continue
        first_new = {s["worker_id"]: s["next"] for s in state["ids"]}
        assert all(int(i) & ((1 << ID_BITS) - 1) >= first_new[int(i) >> ID_BITS] for i in ids)
    del split


@pytest.mark.parametrize("kind", KINDS)
def test_reset_at_each_iter_init_random_frames_and_episode_log(kind):
    policy = ConstantPolicy()
    with torch.no_grad():
        policy.bias.fill_(1.0)  # always action 1 (and so reward 1)
    sync = kind is MultiSyncCollector
    with kind(
        # SAME_STEP: no NEXT_STEP surplus carried into the next batch (it would come first)
        counting(3, 100, mode=AutoresetMode.SAME_STEP),  # T = 4: the 3-step episode ends once
        policy,
        num_workers=2,
        frames_per_batch=16 if sync else 8,
        total_frames=96 if sync else 48,
        reset_at_each_iter=True,
        init_random_frames=32 if sync else 16,
        track_episodes=True,
        seed=0,
    ) as c:
        batches = list(c)
    assert len(batches) == 6 and all(b.shape[-1] == 4 for b in batches)
    for batch in batches:
        assert bool(batch[IS_INIT][:, 0].all())  # every env restarted before the batch
    by_policy = [bool((b["action"] == 1).all()) for b in batches]
    assert by_policy.count(False) == 2  # the batches started before 2 batches' frames
    if sync:
        assert by_policy == [False, False, True, True, True, True]
    # One 3-step episode per worker and batch ends (the 100-step ones never do).
    returns = [r for _, r in c.episode_log]
    assert len(returns) == 2 * 6 if sync else 6
    assert max(returns) == 3.0 and min(returns) >= 0.0


# ------------------------------------------------------------------------ arguments
def test_bad_arguments_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match=r"backend must be one of \['inline', 'process'"):
        MultiSyncCollector(counting(3), num_workers=2, frames_per_batch=4, backend="ray2")
    with pytest.raises(TypeError, match="env object"):
        MultiSyncCollector([gym.make("CartPole-v1")], frames_per_batch=4)
    with pytest.raises(ValueError, match="num_workers"):
        MultiSyncCollector(counting(3), frames_per_batch=4)
    with pytest.raises(ValueError, match="num_workers=3"):
        MultiSyncCollector([counting(3)] * 2, num_workers=3, frames_per_batch=4)
    with pytest.raises(ValueError, match="policy or policy_factory"):
        MultiSyncCollector(
            counting(3),
            ConstantPolicy(),
            num_workers=1,
            policy_factory=ConstantPolicy,
            frames_per_batch=4,
        )
    with pytest.raises(ValueError, match="frames_per_batch"):
        MultiAsyncCollector(counting(3), num_workers=1, frames_per_batch=0)
    with pytest.raises(ValueError, match="no option"):
        MultiSyncCollector(counting(3), num_workers=1, frames_per_batch=4, backend_options={"x": 1})
    with pytest.raises(ValueError, match="mp_start_method"):
        MultiSyncCollector(counting(3), num_workers=1, frames_per_batch=4, mp_start_method="fork")
    with pytest.raises(TypeError, match="seed must be an int"):
        MultiSyncCollector(counting(3), num_workers=1, frames_per_batch=4, seed=1.5)
    with pytest.raises(ValueError, match="seed"):
        MultiSyncCollector(counting(3), num_workers=1, frames_per_batch=4, seed=-1)

    class Unpicklable:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __call__(self, td):
            return td

    with pytest.raises(TypeError, match="policy_factory"):
        MultiSyncCollector(counting(3), Unpicklable(), num_workers=1, frames_per_batch=4)


def test_workers_may_start_processes_of_their_own():
    """Workers are not daemonic: an AsyncVectorEnv (subprocesses) works inside them, and its
    processes end with the collector (the fixture checks)."""
    make = lambda: counting_vec([3, 4], asynchronous=True)  # noqa: E731
    with MultiSyncCollector(make, num_workers=2, frames_per_batch=20, total_frames=40) as c:
        batches = list(c)
    assert len(batches) == 2
    assert_worker_streams(batches)


def test_spawn_start_method_works():
    with MultiSyncCollector(
        counting(3), num_workers=1, frames_per_batch=4, total_frames=8, mp_start_method="spawn"
    ) as c:
        assert len(list(c)) == 2


# ---------------------------------------------------------------------------- faults
@pytest.mark.parametrize("kind", KINDS)
def test_env_error_is_reported_with_index_and_traceback(kind):
    collector = kind(
        [counting(3), vec(lambda: FaultyEnv(at=25))], frames_per_batch=20, total_frames=400
    )
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        list(collector)
    assert time.monotonic() - start < 10
    assert info.value.worker == 1
    assert "env exploded at step 25" in str(info.value)
    assert "in step" in info.value.traceback  # the worker's own traceback
    with pytest.raises(WorkerError, match="worker 1 failed"):  # and again on the next call
        list(collector)
    collector.shutdown()


def test_policy_error_is_reported():
    def policy(td):
        if float(td["observation"][..., 0].max()) >= 12:
            raise KeyError("policy exploded")
        td["action"] = torch.zeros(td.batch_size, dtype=torch.long)
        return td

    collector = MultiSyncCollector(counting(3), policy, num_workers=2, frames_per_batch=10)
    with collector, pytest.raises(WorkerError, match="policy exploded") as info:
        list(collector)
    assert "KeyError" in info.value.traceback


@pytest.mark.parametrize("kind", KINDS)
def test_killed_worker_is_reported_within_10_s(kind):
    with kind(counting(3), num_workers=2, frames_per_batch=10) as c:
        it = iter(c)
        next(it)
        os.kill(c.worker_info[1].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match="SIGKILL") as info:
            for _ in range(1000):
                next(it)
        assert time.monotonic() - start < 10
        assert info.value.worker == 1


def test_background_failure_surfaces_in_the_caller(list_buffer):
    collector = MultiAsyncCollector(
        [counting(3), vec(lambda: FaultyEnv(at=45))],
        frames_per_batch=10,
        replay_buffer=list_buffer,
    )
    collector.start()
    with pytest.raises(RuntimeError, match="background collection failed") as info:
        collector.wait(timeout=30)
    assert isinstance(info.value.__cause__, WorkerError)
    assert info.value.__cause__.worker == 1
    collector.shutdown()


def test_env_factory_error_is_reported_at_construction():
    def factory():
        raise OSError("no such env here")

    with pytest.raises(WorkerError, match="no such env here") as info:
        MultiSyncCollector([counting(3), factory], frames_per_batch=4)
    assert info.value.worker == 1


@pytest.mark.parametrize("kind", KINDS)
def test_shutdown_ends_a_worker_blocked_in_its_env_within_10_s(kind, list_buffer, tmp_path):
    marker = str(tmp_path / "blocked")
    collector = kind(
        [counting(3), vec(lambda: FaultyEnv(at=15, fault="block", marker=marker))],
        frames_per_batch=10,
        replay_buffer=list_buffer,
    )
    pids = [info.pid for info in collector.worker_info]
    collector.start()
    wait_for(lambda: Path(marker).exists())  # worker 1 is stuck in its second batch
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"workers \[1\] .* terminated"):
        collector.shutdown()
    assert time.monotonic() - start < 10
    assert not collector.running
    assert len(list_buffer) == collector.frames  # what was collected in time was stored
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"Z" in Path(f"/proc/{pid}/stat").read_bytes()


def test_shutdown_in_iteration_mode_ends_a_blocked_worker(tmp_path):
    marker = str(tmp_path / "blocked")
    collector = MultiAsyncCollector(
        [counting(3), vec(lambda: FaultyEnv(at=15, fault="block", marker=marker))],
        frames_per_batch=10,
    )
    it = iter(collector)
    while not Path(marker).exists():  # worker 1 gets stuck in its second batch (granted ahead)
        next(it)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="terminated"):
        collector.shutdown(timeout=4)
    assert time.monotonic() - start < 6


_EXIT_SCRIPT = """
import sys, time
import gymnasium as gym
sys.path.insert(0, {tests!r})
from splice import MultiAsyncCollector, MultiSyncCollector
from splice.testing import ConstantPolicy, counting_vec

class Buffer:
    def __init__(self):
        self.n = 0
    def extend(self, batch):
        self.n += batch.numel()

def blocking():
    env = counting_vec([3])
    step = env.step
    def slow(action):
        time.sleep(3600)
    env.step = slow
    return env

if __name__ == "__main__":
    mlp = __import__("torch").nn.Sequential(__import__("torch").nn.Linear(3, 2))
    a = MultiSyncCollector(lambda: counting_vec([3]), num_workers=2, frames_per_batch=10)
    next(iter(a))
    b = MultiAsyncCollector([lambda: counting_vec([3]), blocking], frames_per_batch=10,
                            replay_buffer=Buffer())
    b.start()
    time.sleep(1)
    print(" ".join(str(i.pid) for i in a.worker_info + b.worker_info), flush=True)
    print(time.time(), flush=True)  # no shutdown: interpreter exit must end every worker
"""


def test_interpreter_exit_ends_every_worker(exit_run):
    """No shutdown: interpreter exit ends every worker, the blocked one included, within 10 s
    (issue 12), measured from the script's last line to the moment the last worker ended (the
    interpreter's and the fork server's own teardown afterwards took 3-8 s under load 8-17,
    which the bound must not count)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = exit_run(_EXIT_SCRIPT.format(tests=str(ROOT / "tests")), env)
    assert run.returncode == 0, run.stderr
    assert len(run.pids) == 4
    assert run.workers_ended is not None, f"workers left running: {run.pids}"
    assert run.workers_ended - run.exit_began < 10  # the exit hook ended the blocked worker


def slow_counting():
    """``counting(50)`` whose steps take 20 ms: the surviving worker needs seconds for the rest
    of the budget, so an async collector's replacement worker delivers part of it too (with
    instant steps, under load, the survivor could finish the budget while it started)."""
    env = counting_vec([50])
    step = env.step

    def slow(action):
        time.sleep(0.02)
        return step(action)

    env.step = slow
    return env


@pytest.mark.parametrize("kind", KINDS)
def test_restart_workers_replaces_a_killed_worker(kind):
    with kind(
        slow_counting, num_workers=2, frames_per_batch=10, total_frames=200, restart_workers=True
    ) as c:
        it = iter(c)
        batches = [next(it), next(it)]
        old_space = c.state_dict()["ids"][1]["worker_id"]
        os.kill(c.worker_info[1].pid, signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match="worker 1 failed.*replaced"):
            batches += list(it)
    assert c.restarted_workers == 1 and "SIGKILL" in str(c.worker_failures[0])
    assert c.frames == 200 == sum(b.numel() for b in batches)  # the budget still holds
    new_space = c.state_dict()["ids"][1]["worker_id"]
    assert new_space != old_space
    old_rows = [
        row
        for b in batches
        for row in (b if b.ndim == 2 else b[None])
        if int(worker_of(row[TRAJ_IDS][0])) == old_space
    ]
    assert bool(old_rows[-1][CUT][-1])  # its episode in flight ended with the cut mark
    assert not bool(old_rows[-1][DONE][-1])
    seen = set()
    for batch in batches:  # ids still unique: the new worker draws from a fresh space
        for row in batch if batch.ndim == 2 else batch[None]:
            key = int(worker_of(row[TRAJ_IDS][0]))
            seen.add(key)
    assert new_space in seen


def test_restart_workers_replaces_a_worker_whose_env_raised(tmp_path):
    marker = str(tmp_path / "failed-once")
    with (
        MultiSyncCollector(
            [counting(3), vec(lambda: FaultyEnv(at=12, marker=marker))],
            frames_per_batch=10,
            total_frames=60,
            restart_workers=True,
        ) as c,
        pytest.warns(RuntimeWarning, match="env exploded"),
    ):
        batches = list(c)
    assert c.restarted_workers == 1 and len(batches) == 6
    assert all(b.batch_size == torch.Size([2, 5]) for b in batches)


@pytest.mark.parametrize("kind", KINDS)
def test_restart_workers_in_background_keeps_the_budget(kind, list_buffer):
    collector = kind(
        vec(lambda: SlowEnv(length=50)),
        num_workers=2,
        frames_per_batch=10,
        total_frames=2_000,
        restart_workers=True,
        replay_buffer=list_buffer,
    )
    pid = collector.worker_info[1].pid
    killed = threading.Event()
    with pytest.warns(RuntimeWarning, match="replaced"):
        # The gate holds collection from 40 frames on until the kill: the kill comes long
        # before the budget is spent, however late this thread is scheduled.
        collector.start(gate=lambda: killed.is_set() or len(list_buffer) < 40)
        wait_for(lambda: len(list_buffer) >= 40)
        os.kill(pid, signal.SIGKILL)
        killed.set()
        collector.wait(timeout=60)
    collector.shutdown()
    assert collector.restarted_workers == 1 and collector.worker_info[1].pid != pid
    assert len(list_buffer) == collector.frames == 2_000  # the lost batch was collected again


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_info_keys_and_exclude_keys_reach_the_workers(cls):
    """The Collector's info_keys/exclude_keys apply in every worker: Taxi's action mask is
    stored next to the observation, and an excluded Dict observation leaf is gone."""
    env = lambda: gym.make("Taxi-v4", max_episode_steps=20)  # noqa: E731
    with cls(
        [env, env],
        frames_per_batch=40,
        total_frames=80,
        info_keys=["action_mask"],
        seed=0,
    ) as collector:
        batches = list(collector)
    assert all(b["action_mask"].shape[-1] == 6 for b in batches)
    assert all(("next", "action_mask") in b.keys(True) for b in batches)

    def dict_env() -> gym.Env:
        env = gym.make("CartPole-v1")
        space = gym.spaces.Dict(
            {"x": env.observation_space, "y": gym.spaces.Box(-1e9, 1e9, (2,), np.float32)}
        )
        return gym.wrappers.TransformObservation(env, lambda o: {"x": o, "y": o[:2]}, space)

    with cls(
        [dict_env],
        frames_per_batch=20,
        total_frames=20,
        exclude_keys=[("observation", "y")],
    ) as collector:
        (batch,) = list(collector)
    assert ("observation", "x") in batch.keys(True)
    assert ("observation", "y") not in batch.keys(True)
