"""The ``"ray"`` backend of MultiSyncCollector / MultiAsyncCollector, end to end on a local Ray
instance (``ray_instance`` / ``ray_module`` in tests/conftest.py): the collector guarantees,
``trajs_per_batch``, a ``RayReplayBuffer`` fed by the workers without the data passing through
this process, faults and shutdown. The pool protocol itself is checked by test_pool.py's
contract suite (the ``"ray"`` parameter).

An actor start costs seconds (it imports torch), so tests share what they can through
module-scoped fixtures: one ``RayReplayBuffer`` (each test empties it first), and one
endless ``MultiAsyncCollector`` used first by the ``trajs_per_batch`` test and then by the
killed-actor test, which ends one of its actors (its last user). Every test checks that no
actor process it started is left (``ray_instance``; conftest.py's fixture for any process),
and each module fixture that its actors are gone after the module (``ray_module``)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections import defaultdict
from pathlib import Path

import cloudpickle
import gymnasium as gym
import pytest
import torch

from splice import (
    LazyTensorStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    RayReplayBuffer,
    SliceSampler,
    WorkerError,
)
from splice.collectors._ray import RayPool
from splice.collectors.ids import worker_of
from splice.layout import CUT, DONE, IS_INIT, TRAJ_IDS
from splice.testing import ConstantPolicy, FaultyEnv, assert_worker_streams, counting_vec

pytestmark = pytest.mark.timeout(180)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KINDS = [MultiSyncCollector, MultiAsyncCollector]
ROOT = Path(__file__).resolve().parents[2]


def counting(*lengths: int):
    return lambda: counting_vec(list(lengths))


def faulty(at: int, fault: str, marker: str | None = None):
    return lambda: gym.vector.SyncVectorEnv([lambda: FaultyEnv(at, fault, marker)])


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


# ----------------------------------------------------------------------------- imports
def test_ray_is_imported_only_by_the_collectors_that_ask_for_it():
    script = textwrap.dedent(
        """
        import sys
        import splice
        from splice import MultiSyncCollector, RayReplayBuffer
        from splice.testing import counting_vec
        assert "ray" not in sys.modules, "import splice imported ray"
        # The other backends (the process backend's module is imported on first use, as
        # the Ray backend's is): no worker is started, to keep this test cheap.
        from splice.collectors._pool import check_backend
        check_backend("process")
        with MultiSyncCollector(lambda: counting_vec([3]), num_workers=2, frames_per_batch=4,
                                total_frames=8, backend="inline") as c:
            assert len(list(c)) == 2
        assert "ray" not in sys.modules, "another backend imported ray"
        check_backend("ray")
        assert "ray" in sys.modules
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_backend_options_are_checked_before_any_actor_starts(ray_instance):
    for option in ("max_restarts", "max_concurrency", "lifetime"):
        with pytest.raises(ValueError, match=option):
            MultiSyncCollector(
                counting(3),
                num_workers=1,
                frames_per_batch=4,
                backend="ray",
                backend_options={option: 1},
            )
    with pytest.raises(ValueError, match="num_cpu"):  # Ray's own check
        MultiSyncCollector(
            counting(3),
            num_workers=1,
            frames_per_batch=4,
            backend="ray",
            backend_options={"num_cpu": 1},
        )
    with pytest.raises(TypeError, match="policy_factory"):  # cannot be pickled
        MultiSyncCollector(
            counting(3), _Unpicklable(), num_workers=1, frames_per_batch=4, backend="ray"
        )


class _Unpicklable:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self, td):
        return td


# -------------------------------------------------------------------------- guarantees
@pytest.fixture(scope="module")
def ray_buffer(ray_module):
    """One replay buffer served by a Ray actor, for the tests that feed one (each empties it
    first: ``empty()`` also resets ``write_count``)."""
    rb = RayReplayBuffer(
        storage=LazyTensorStorage(100_000),
        sampler=SliceSampler(slice_len=5, as_sequences=True, seed=0),
        batch_size=40,
    )
    yield rb
    rb.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_ray_workers_keep_the_guarantees_and_feed_a_ray_buffer(
    kind, ray_instance, ray_buffer, monkeypatch
):
    """Iteration, then background collection, with one collector of two actors:

    * iterating: ids unique across actors and continued across batches, every step once and
      in order, weights pushed without restarting the actors, each yielded batch also
      written (by reference) to a buffer served by a Ray actor;
    * in the background: the batches go from the actors to the buffer's actor by object
      reference (this process never reads one: fetching is made to fail), the learner's
      slices stay whole while two actors write, nothing is written while paused, and after
      the run (sync: ``total_frames``) or a shutdown mid-run (async, endless)
      ``write_count`` equals the frames collected.

    (Episodes of equal length: with NEXT_STEP autoreset, envs whose episodes end at
    different steps make a worker's loop run a few steps of its next batch ahead, with the
    weights of the time.)"""
    sync = kind is MultiSyncCollector
    rb = ray_buffer
    rb.empty()
    assert rb.write_count == len(rb) == 0
    collector = kind(
        counting(5, 5),
        ConstantPolicy(),
        num_workers=2,
        frames_per_batch=20,
        total_frames=2_000 if sync else -1,
        backend="ray",
        replay_buffer=rb,
    )
    with collector:
        assert collector.remote_writes
        pids = [info.pid for info in collector.worker_info]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        batches = []
        for batch in collector:
            batches.append(batch)
            if len(batches) == 4:
                collector.update_policy_weights_({"bias": torch.tensor(1.0)})
            if len(batches) == 10:
                break
        assert rb.write_count == collector.frames == 200 == sum(b.numel() for b in batches)
        steps = assert_worker_streams(batches)
        assert sum(steps.values()) == 200 and len({w for w, _ in steps}) == 2
        actions = [int(b["action"].min()) for b in batches]
        assert actions[:4] == [0] * 4
        if sync:  # the batch after the update uses it
            assert actions[4:] == [1] * 6
        else:  # only the batch each worker had under way (at most one) has the old weights
            by_worker = defaultdict(list)  # (a slow worker's may come after the fast one's)
            for batch in batches[4:]:
                by_worker[int(worker_of(batch[TRAJ_IDS][0, 0]))].append(int(batch["action"].min()))
            for after in by_worker.values():
                assert after in ([1] * len(after), [0] + [1] * (len(after) - 1))
        yielded = {
            (int(i), float(o))
            for b in batches
            for i, o in zip(
                b[TRAJ_IDS].reshape(-1), b["observation"][..., 0].reshape(-1), strict=True
            )
        }

        def no_fetch(self, part):
            raise AssertionError("a batch was read in the collector's process")

        monkeypatch.setattr(RayPool, "fetch", no_fetch)
        collector.start()
        samples, paused = 0, False
        while (collector.running and (sync or samples < 30)) or samples < 10:
            sample = rb.sample()
            ids = sample[TRAJ_IDS]
            assert bool((ids == ids[:, :1]).all()), "a slice mixes trajectories"
            assert bool((worker_of(ids) == worker_of(ids[:, :1])).all()), "a slice mixes workers"
            obs = sample["observation"]
            assert bool((obs[..., 2] == obs[:, :1, 2]).all()), "a slice mixes envs"
            assert bool((torch.diff(obs[..., 0], dim=1) == 1).all()), "a slice is not contiguous"
            assert bool((torch.diff(obs[..., 1], dim=1) == 1).all()), "a slice crosses an episode"
            for i, o in zip(ids[:, 0], obs[:, 0, 0], strict=True):
                if float(o) < min(steps.values()):  # yielded above: stored as it was yielded
                    assert (int(i), float(o)) in yielded
            samples += 1
            if samples == 5 and collector.running:  # (async: always; sync: not yet done)
                with collector.pause():
                    written = rb.write_count
                    time.sleep(0.3)
                    assert rb.write_count == written  # nothing written while paused
                paused = True
                wait_for(lambda n=written: rb.write_count > n or not collector.running)
        assert paused or sync
        collector.shutdown()  # the batches in flight are finished and written too
        assert rb.write_count == len(rb) == collector.frames == sum(collector.worker_frames)
        assert (collector.frames == 2_000) if sync else (collector.frames > 200)
    for pid in pids:
        wait_for(lambda pid=pid: gone(pid), timeout=5)


# -------------------------------------------------------------------------------- faults
def test_env_error_in_an_actor_is_reported_with_index_and_traceback(ray_instance):
    collector = MultiSyncCollector(
        [counting(3), faulty(25, "raise")], frames_per_batch=20, backend="ray"
    )
    pid = collector.worker_info[1].pid
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        list(collector)
    assert time.monotonic() - start < 10
    assert info.value.worker == 1 and "env exploded at step 25" in str(info.value)
    assert "in step" in info.value.traceback  # the actor's own traceback
    with pytest.raises(WorkerError, match="worker 1 failed"):  # and again on the next call
        list(collector)
    wait_for(lambda: gone(pid), timeout=5)  # a failed actor is ended at once
    collector.shutdown()


@pytest.fixture(scope="module")
def async_episodes(ray_module):
    """An endless MultiAsyncCollector of two actors (CountingEnv episodes of 6 and 9 steps,
    4 steps per batch) that yields 3 whole episodes per output, and its iterator: used by
    the ``trajs_per_batch`` test, then by the killed-actor test (its last user, which shuts
    it down: its actors hold the Ray instance's 2 CPUs)."""
    collector = MultiAsyncCollector(
        counting(6, 9),
        num_workers=2,
        frames_per_batch=8,
        trajs_per_batch=3,
        traj_format="cat",
        drop_incomplete=True,
        backend="ray",
    )
    yield collector, iter(collector)
    collector.shutdown()


def test_trajs_per_batch_yields_whole_episodes_each_step_once(async_episodes, ray_instance):
    """Episodes of 6 and 9 steps from two actors' 4-step batches: every output holds 3
    complete episodes (stitched across their worker's batches, none cut), ids unique across
    actors, and each env's emitted steps are its first ones, each exactly once."""
    collector, it = async_episodes
    assert collector.frames_per_batch // 2 < 6  # every episode spans several batches
    outputs = [next(it) for _ in range(12)]
    ids: list[int] = []
    steps: dict[tuple[int, int], list[int]] = defaultdict(list)  # (worker, env) -> obs counts
    for out in outputs:
        traj = out[TRAJ_IDS]
        starts = torch.cat([torch.tensor([True]), traj[1:] != traj[:-1]])
        ends = torch.cat([traj[1:] != traj[:-1], torch.tensor([True])])
        assert int(starts.sum()) == 3
        assert torch.equal(out[IS_INIT][:, 0], starts)  # every episode from its first step
        assert torch.equal(out[DONE][:, 0], ends)  # ... to its end
        assert not bool(out[CUT].any())
        bounds = [*starts.nonzero()[:, 0].tolist(), traj.numel()]
        for a, b in itertools.pairwise(bounds):
            obs = out["observation"][a:b]
            tag = int(obs[0, 2])
            assert b - a == (6, 9)[tag]
            assert torch.equal(obs[:, 1], torch.arange(1.0 * (b - a)))  # steps 0..n-1
            assert bool((torch.diff(obs[:, 0]) == 1).all())  # consecutive env steps
            ids.append(int(traj[a]))
            steps[(int(worker_of(traj[a])), tag)] += obs[:, 0].tolist()
    assert len(ids) == len(set(ids)) == 36  # no episode twice, ids unique across actors
    assert len({worker for worker, _ in steps}) == 2
    for counts in steps.values():  # episodes end in order: each env's first steps, once
        assert sorted(counts) == list(range(len(counts)))


def test_killed_actor_is_reported_within_10_s(async_episodes, ray_instance):
    collector, it = async_episodes
    next(it)
    pid = collector.worker_info[1].pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match="died unexpectedly") as info:
        for _ in range(1000):
            next(it)
    assert time.monotonic() - start < 10
    assert info.value.worker == 1
    wait_for(lambda: gone(pid), timeout=5)
    # The fixture's last user: its actors hold the instance's CPUs, which the next tests need.
    # The surviving actor may have a batch under way: shutdown waits for it and ends the
    # actor cleanly (no worker reported as terminated mid-batch).
    survivor = collector.worker_info[0].pid
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        collector.shutdown()
    assert gone(survivor)


def test_restart_workers_replaces_a_killed_actor(ray_instance):
    # Sync: every batch after the replacement has a part from the new actor (an async
    # collector may finish the budget with the other worker while the new one starts).
    with MultiSyncCollector(
        counting(50),
        num_workers=2,
        frames_per_batch=10,
        total_frames=200,
        restart_workers=True,
        backend="ray",
    ) as c:
        it = iter(c)
        batches = [next(it), next(it)]
        old_pid, old_space = c.worker_info[1].pid, c.state_dict()["ids"][1]["worker_id"]
        os.kill(old_pid, signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match="worker 1 failed.*replaced"):
            batches += list(it)
        new_space = c.state_dict()["ids"][1]["worker_id"]
        assert c.restarted_workers == 1 and c.worker_info[1].pid != old_pid
    assert c.frames == 200 == sum(b.numel() for b in batches)  # the budget still holds
    assert new_space != old_space  # a fresh id space: no id of the old actor recurs
    rows = [row for b in batches for row in b]
    old_rows = [row for row in rows if int(worker_of(row[TRAJ_IDS][0])) == old_space]
    assert bool(old_rows[-1][CUT][-1]) and not bool(old_rows[-1][DONE][-1])
    assert any(int(worker_of(row[TRAJ_IDS][0])) == new_space for row in rows)


def test_shutdown_ends_an_actor_blocked_in_its_env_within_10_s(ray_instance, list_buffer, tmp_path):
    marker = str(tmp_path / "blocked")
    collector = MultiAsyncCollector(
        [counting(3), faulty(15, "block", marker)],
        frames_per_batch=10,
        replay_buffer=list_buffer,
        backend="ray",
    )
    pids = [info.pid for info in collector.worker_info]
    collector.start()
    wait_for(lambda: Path(marker).exists())  # worker 1 is stuck in its second batch
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"workers \[1\] .* terminated"):
        collector.shutdown()
    assert time.monotonic() - start < 10
    assert len(list_buffer) == collector.frames  # what was collected in time was stored
    for pid in pids:
        assert gone(pid)


_EXIT_SCRIPT = """
import time
import ray
from splice import MultiAsyncCollector, MultiSyncCollector
from splice.testing import counting_vec

class Buffer:
    def __init__(self):
        self.n = 0
    def extend(self, batch):
        self.n += batch.numel()

def blocking():
    env = counting_vec([3])
    def slow(action):
        time.sleep(3600)
    env.step = slow
    return env

if __name__ == "__main__":
    ray.init(address={address!r})  # the one-line change from a local run to a cluster
    a = MultiSyncCollector(lambda: counting_vec([3]), num_workers=1, frames_per_batch=10,
                           backend="ray", backend_options={{"num_cpus": 0.1}})
    next(iter(a))
    b = MultiAsyncCollector([blocking], frames_per_batch=10, replay_buffer=Buffer(),
                            backend="ray", backend_options={{"num_cpus": 0.1}})
    b.start()
    time.sleep(1)
    print(" ".join(str(i.pid) for i in a.worker_info + b.worker_info), flush=True)
    print(time.time(), flush=True)  # no shutdown: interpreter exit must end every actor
"""


def test_interpreter_exit_ends_every_actor(ray_instance, exit_run):
    """A driver connected to a running Ray instance (``ray.init(address=...)``) exits without
    shutting its collectors down, one actor blocked in its env: every actor ends within 10 s
    (issue 12), measured from the driver's last line to the moment the last actor ended (the
    driver's own teardown afterwards, Ray's disconnect included, is not counted)."""
    address = ray_instance.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = exit_run(_EXIT_SCRIPT.format(address=address), env)
    assert run.returncode == 0, run.stderr
    assert len(run.pids) == 2
    assert run.workers_ended is not None, f"actors left running: {run.pids}"
    assert run.workers_ended - run.exit_began < 10  # the exit hook ended the blocked actor
