"""The worker-pool protocol (``collectors/_pool.py``), one contract for every backend, and the
multi-worker collectors' budget rules checked over many settings with the in-process backend.

A new backend (e.g. Ray) adds its name to ``BACKEND_NAMES`` and must pass the same tests."""

from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import MultiAsyncCollector, MultiSyncCollector, WorkerError
from splice.collectors._pool import make_pool
from splice.collectors._worker import WorkerSpec, policy_weights
from splice.collectors.background import StopCollection
from splice.collectors.ids import worker_of
from splice.layout import IS_INIT, TRAJ_IDS
from splice.testing import ConstantPolicy, CountingEnv, counting_vec

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BACKEND_NAMES = ["inline", "process", "ray"]


class Exploding(CountingEnv):
    def step(self, action):
        if self.total >= 6:
            raise ValueError("exploded in the pool")
        return super().step(action)


def make_specs(n: int, env=None, policy=None, first_space: int = 700):
    env = env or (lambda: counting_vec([3, 5]))
    return [
        WorkerSpec(index=i, env=env, policy=policy, worker_id=first_space + i, seed=i)
        for i in range(n)
    ]


@pytest.fixture(params=BACKEND_NAMES)
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("ray_instance")  # a local Ray instance (tests/conftest.py)
    return request.param


def test_request_wait_take_and_states(backend):
    pool = make_pool(backend, make_specs(2), None, {})
    try:
        infos = pool.start(timeout=120)
        assert [(i.num_envs, i.batched) for i in infos] == [(2, True), (2, True)]
        pool.configure([4, 6])
        assert pool.busy() == []
        pool.request(1, random_actions=False)
        pool.request(0, random_actions=True)
        with pytest.raises(RuntimeError):
            pool.request(1, random_actions=False)  # busy
        assert pool.busy() == [1, 0]  # in request order
        got = []
        while len(got) < 2:
            ready = pool.wait([i for i in (0, 1) if i not in got])
            for i in ready:
                part = pool.take(i)
                got.append(i)
                assert part.batch.batch_size == torch.Size([2, 4 if i == 0 else 6])
                assert part.frames == part.batch.numel()
                assert part.ids_state["worker_id"] == 700 + i
                assert set(worker_of(part.batch[TRAJ_IDS]).unique().tolist()) == {700 + i}
        with pytest.raises(RuntimeError):
            pool.take(0)  # not ready
        assert pool.busy() == []
    finally:
        assert pool.close(timeout=10) == []
    assert pool.close(timeout=10) == []  # idempotent
    assert pool.final_frames == [8, 12]


def test_weights_reach_every_worker_before_its_next_batch(backend):
    policy = ConstantPolicy()
    pool = make_pool(backend, make_specs(2, policy=policy), policy_weights(policy), {})
    try:
        pool.start(timeout=120)
        pool.configure([3, 3])

        def actions():
            for i in (0, 1):
                pool.request(i, random_actions=False)
            values = []
            for i in (0, 1):
                pool.wait([i])
                values.append(int(pool.take(i).batch["action"].float().mean()))
            return values

        assert actions() == [0, 0]
        pool.set_weights(TensorDict({"bias": torch.tensor(1.0)}, []))
        assert actions() == [1, 1]
        assert actions() == [1, 1]  # and the batches after it (no new weights sent)
    finally:
        pool.close(timeout=10)


def test_each_request_collects_the_kind_of_batch_it_asks_for(backend):
    """Random actions or the policy, as each request says, however they alternate (the Ray
    backend sends a request's terms only when they change)."""
    policy = ConstantPolicy()  # every action 0
    # Episodes longer than the test: no reset, so no step of one batch is carried into the
    # next (a row's top-up after a dead reset step would be, with the earlier batch's kind).
    specs = make_specs(2, env=lambda: CountingEnv(length=1000), policy=policy)
    pool = make_pool(backend, specs, policy_weights(policy), {})
    try:
        pool.start(timeout=120)
        pool.configure([20, 20])

        def random_actions_taken(random_actions: bool) -> int:
            for i in (0, 1):
                pool.request(i, random_actions=random_actions)
            taken = 0
            for i in (0, 1):
                pool.wait([i])
                taken += int(pool.take(i).batch["action"].sum())
            return taken

        # 40 random actions of Discrete(2) per round: all 0 with probability 2**-40.
        kinds = [False, True, True, False, False, True, False]
        assert [random_actions_taken(kind) > 0 for kind in kinds] == kinds
    finally:
        pool.close(timeout=10)


def test_restart_and_load_ids_state(backend):
    pool = make_pool(backend, make_specs(1, env=lambda: counting_vec([100])), None, {})
    try:
        pool.start(timeout=120)
        pool.configure([5])

        def collect():
            pool.request(0, random_actions=False)
            pool.wait([0])
            return pool.take(0)

        first = collect().batch
        assert bool(first[IS_INIT][0, 0]) and not bool(collect().batch[IS_INIT][0, 0])
        pool.restart(0)
        part = collect()
        assert bool(part.batch[IS_INIT][0, 0])  # a new episode, a new id
        assert part.ids_state == {"worker_id": 700, "next": 2}
        pool.load_ids_state(0, {"worker_id": 777, "next": 40})
        pool.restart(0)
        ids = collect().batch[TRAJ_IDS]
        assert int(ids[0, 0]) == (777 << 40) + 40
    finally:
        pool.close(timeout=10)


def test_a_failure_is_raised_with_the_index_then_the_worker_is_replaced(backend):
    specs = make_specs(2, env=lambda: counting_vec([3]))
    specs[1] = WorkerSpec(index=1, env=lambda: Exploding(length=3), worker_id=751)
    pool = make_pool(backend, specs, None, {})
    try:
        pool.start(timeout=120)
        pool.configure([4, 4])
        pool.request(1, random_actions=False)
        pool.wait([1])
        pool.take(1)
        pool.request(1, random_actions=False)  # steps 5..8: explodes at the 7th
        with pytest.raises(WorkerError, match="exploded in the pool") as info:
            pool.wait([1])
        assert info.value.worker == 1 and "in step" in info.value.traceback
        with pytest.raises(WorkerError):  # the worker is gone: asking again raises again
            pool.request(1, random_actions=False)
        spec = WorkerSpec(index=1, env=lambda: counting_vec([3]), worker_id=752)
        assert pool.replace(1, spec, 60).num_envs == 1
        pool.request(1, random_actions=False)
        pool.wait([1])
        assert int(worker_of(pool.take(1).batch[TRAJ_IDS][0, 0])) == 752
    finally:
        pool.close(timeout=10)


def test_interrupt_ends_a_wait(backend):
    pool = make_pool(backend, make_specs(1), None, {})
    try:
        pool.start(timeout=120)
        pool.configure([3])
        pool.request(0, random_actions=False)
        pool.interrupt()
        with pytest.raises(StopCollection):
            pool.wait([0])
    finally:
        pool.close(timeout=10)


# ------------------------------------------------------------- budget rules, many settings
@settings(max_examples=40, deadline=None)
@given(
    sync=st.booleans(),
    workers=st.integers(1, 3),
    envs=st.integers(1, 3),
    frames_per_batch=st.integers(1, 30),
    total=st.integers(1, 200),
    trajs=st.sampled_from([None, 2]),
)
def test_budget_and_batch_count_follow_collector_rules(
    sync, workers, envs, frames_per_batch, total, trajs
):
    kind = MultiSyncCollector if sync else MultiAsyncCollector
    with kind(
        lambda: counting_vec([4] * envs),
        num_workers=workers,
        frames_per_batch=frames_per_batch,
        total_frames=total,
        trajs_per_batch=trajs,
        traj_format=None if trajs is None else "cat",
        backend="inline",
    ) as c:
        steps = math.ceil(frames_per_batch / (envs * workers if sync else envs))
        assert c.frames_per_batch == steps * envs * (workers if sync else 1)
        expected = math.ceil(total / c.frames_per_batch)
        if trajs is None:
            assert len(c) == expected
        outputs = list(c)
    assert c.frames == expected * c.frames_per_batch
    assert sum(c.worker_frames) == c.frames  # no worker ran past the budget
    if trajs is None:
        assert len(outputs) == expected
    else:
        assert sum(o.numel() for o in outputs) == c.frames  # every frame, once
