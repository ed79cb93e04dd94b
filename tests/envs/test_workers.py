"""A worker process of an AsyncVectorEnv dies (SIGKILL): the collector names it, every other
worker is ended, the env is closed, and shutdown() stays consistent (issue 11, item 5)."""

from __future__ import annotations

import os
import signal
import threading
import time

import gymnasium as gym
import pytest

from splice import Collector, LazyTensorStorage, ReplayBuffer
from splice.envs import EnvWorkerError, WorkerWatch, make_adapter

# Every test checks that no worker process is left running (tests/conftest.py).
pytestmark = [pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]


def slow_cartpole(delay: float):
    """An env factory: CartPole whose steps take ``delay`` seconds (the class is local, so
    cloudpickle ships it to the worker by value)."""

    def make() -> gym.Env:
        class Slow(gym.Wrapper):
            def step(self, action):
                time.sleep(delay)
                return self.env.step(action)

        return Slow(gym.make("CartPole-v1"))

    return make


def exploding_cartpole(at_step: int):
    def make() -> gym.Env:
        class Exploding(gym.Wrapper):
            steps = 0

            def step(self, action):
                Exploding.steps += 1
                if Exploding.steps == at_step:
                    raise ValueError("the env exploded")
                return self.env.step(action)

        return Exploding(gym.make("CartPole-v1"))

    return make


def async_env(make, n: int = 3) -> gym.vector.AsyncVectorEnv:
    return gym.vector.AsyncVectorEnv([make] * n, context="fork")


def assert_all_ended(env: gym.vector.AsyncVectorEnv) -> None:
    assert env.closed
    assert [p.is_alive() for p in env.processes] == [False] * len(env.processes)


def kill(env: gym.vector.AsyncVectorEnv, worker: int) -> None:
    os.kill(env.processes[worker].pid, signal.SIGKILL)


def test_worker_killed_between_batches_is_named_at_the_next_step():
    env = async_env(lambda: gym.make("CartPole-v1"))
    c = Collector(env, frames_per_batch=30)
    it = iter(c)
    next(it)
    pid = env.processes[1].pid
    kill(env, 1)
    env.processes[1].join(5)
    with pytest.raises(
        EnvWorkerError, match=rf"worker 1 \(pid {pid}\) was killed by SIGKILL"
    ) as info:
        next(it)
    assert (info.value.worker, info.value.pid, info.value.exitcode) == (1, pid, -signal.SIGKILL)
    assert isinstance(info.value.__cause__, BrokenPipeError)  # what gymnasium raised
    assert_all_ended(env)
    c.shutdown()  # the death was reported: shutdown has nothing left to do, twice
    c.shutdown()


def test_worker_killed_during_a_step_is_named():
    # Batches of 50 steps of 20 ms: the kill, 0.1 s into the second batch, lands in it even
    # if the timer thread is scheduled late (with 10 steps, 0.2 s, a late timer killed the
    # worker after the batch: nothing raised)
    env = async_env(slow_cartpole(0.02))
    c = Collector(env, frames_per_batch=3 * 50)
    it = iter(c)
    next(it)
    timer = threading.Timer(0.1, kill, (env, 2))
    timer.start()
    started = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"worker 2 .* was killed by SIGKILL") as info:
        next(it)
    timer.join()
    assert time.monotonic() - started < 10
    # gymnasium's bare pipe error: EOF, or a reset connection if the worker died mid-write
    assert isinstance(info.value.__cause__, (EOFError, ConnectionError))
    assert_all_ended(env)
    c.shutdown()
    c.shutdown()


def test_worker_killed_while_idle_is_named_by_shutdown_once():
    env = async_env(lambda: gym.make("CartPole-v1"))
    c = Collector(env, frames_per_batch=30)
    next(iter(c))
    kill(env, 0)
    env.processes[0].join(5)
    with pytest.raises(EnvWorkerError, match=r"worker 0 .* found during close\(\)"):
        c.shutdown()
    assert_all_ended(env)
    c.shutdown()  # consistent: nothing left to free, nothing to report again


def test_worker_killed_under_background_collection():
    env = async_env(lambda: gym.make("CartPole-v1"))
    rb = ReplayBuffer(storage=LazyTensorStorage(1_000_000))
    c = Collector(env, frames_per_batch=30, replay_buffer=rb)
    c.start()
    deadline = time.monotonic() + 30
    while len(rb) < 90 and time.monotonic() < deadline:
        time.sleep(0.01)
    kill(env, 1)
    with pytest.raises(RuntimeError, match="background collection failed") as info:
        c.wait(timeout=30)
    assert isinstance(info.value.__cause__, EnvWorkerError)
    assert info.value.__cause__.worker == 1
    c.shutdown()
    assert_all_ended(env)
    assert c.frames == len(rb) + c.dropped_frames


@pytest.mark.filterwarnings("ignore::UserWarning")  # gymnasium logs the worker's error
def test_an_env_error_inside_a_worker_is_not_a_death():
    """gymnasium reports an env's own exception itself: it propagates unchanged."""
    env = async_env(exploding_cartpole(at_step=5), n=2)
    c = Collector(env, frames_per_batch=40)
    with pytest.raises(ValueError, match="the env exploded"):
        next(iter(c))
    c.shutdown()
    assert_all_ended(env)


def test_make_adapter_watches_async_envs_only():
    env = async_env(lambda: gym.make("CartPole-v1"), n=2)
    adapter = make_adapter(env)
    assert isinstance(adapter.env, WorkerWatch) and adapter.env.unwrapped is env
    adapter.close()
    assert_all_ended(env)
    sync = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    assert make_adapter(sync).env is sync
    with pytest.raises(TypeError, match="AsyncVectorEnv"):
        WorkerWatch(sync)
