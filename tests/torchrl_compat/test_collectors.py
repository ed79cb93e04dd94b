"""TorchRL's ``test/test_collectors.py`` (pytorch/rl at 6e18e35b2, the 0.14.0 release), ported.

Ported: the single-process ``Collector`` tests of what splice's collector does — trajectory
ids, ``split_trajs``, chunking invariance, ``next()``, ``len()``, reset observations,
``trajs_per_batch`` (yielded and written to a replay buffer), background collection — with
imports changed and TorchRL's test envs replaced by the same envs in gymnasium
(``envs.py``); TorchRL's ``RandomPolicy(env.action_spec)`` becomes splice's
``RandomPolicy(env.action_space)``. Tests of multi-process, Ray and distributed collectors,
devices, weight-sync schemes, env transforms, policies built from TorchRL specs and
TorchRL's private assembly helpers are TorchRL-only: see ``inventory.py``.
"""

from __future__ import annotations

import functools
import time
import warnings

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict, assert_allclose_td
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from splice import Collector, RandomPolicy, ReplayBuffer, split_trajectories
from splice.replay import LazyMemmapStorage, LazyTensorStorage, SliceSampler
from splice.testing import CountingEnv as StepCountingEnv
from splice.testing import threshold_policy

from .differences import (
    ALWAYS_TRAJ_IDS,
    BUFFER_DRIVEN,
    COLLECTOR_STATE,
    COUNTING_ACTIONS,
    END_OF_RUN,
    ENV_ARGUMENT,
    IDS_AND_CUTS,
    IN_PROCESS,
    NO_ENV_TRANSFORMS,
    NO_NDIM,
    NO_PROCESS_OPTIONS,
    NO_TRAJ_FORMAT_WARNING,
    PRIVATE_STATE,
    YIELDS_WITH_RB,
)
from .envs import (
    CountingEnv,
    EnvThatErrorsAfter10Iters,
    counting_env,
    counting_vec,
    ones_policy,
    steps_in_episode,
)


class TestCollectorGeneric:
    @pytest.mark.torchrl_difference(ALWAYS_TRAJ_IDS)
    def test_collector_without_traj_ids(self):
        env = CountingEnv(max_steps=3)
        collector = Collector(
            env,
            policy=RandomPolicy(env.action_space),
            total_frames=4,
            frames_per_batch=4,
            track_traj_ids=False,
        )
        try:
            data = next(iter(collector))
        finally:
            collector.shutdown()

        assert "collector" not in data.keys()

    @pytest.mark.parametrize("frames_per_batch", [200, 10])
    @pytest.mark.parametrize("num_env", [1, 2])
    @pytest.mark.parametrize("env_name", ["vec"])
    @pytest.mark.torchrl_difference(ENV_ARGUMENT, adapted=True)
    @pytest.mark.torchrl_difference(NO_ENV_TRANSFORMS, adapted=True)
    def test_split_trajs(self, num_env, env_name, frames_per_batch, seed=5):
        # Port: TorchRL's MockSerialEnv / SerialEnv become splice.testing.CountingEnv (whose
        # observation[1] is the step in the episode: TorchRL's StepCounter's step_count).
        if num_env == 1:

            def env_fn():
                return StepCountingEnv(length=7)

        else:

            def env_fn():
                return gym.vector.SyncVectorEnv(
                    [lambda i=i: StepCountingEnv(length=7 + i) for i in range(num_env)]
                )

        collector = Collector(
            env_fn,  # Port: create_env_fn=env_fn, create_env_kwargs={"seed": seed}
            seed=seed,
            frames_per_batch=frames_per_batch * num_env,
            max_frames_per_traj=2000,
            total_frames=20000,
            device="cpu",
            split_trajs=True,
        )  # Port: policy=make_policy(env_name) (random actions), reset_when_done=True
        for _, d in enumerate(collector):  # noqa
            break

        assert d.ndimension() == 2
        assert d["collector", "mask"].shape == d.shape
        step_count = d["observation"][..., 1]  # Port: d["next", "step_count"] - 1
        assert step_count.shape == d["next", "done"].shape[:-1]
        assert d["collector", "traj_ids"].shape == d.shape
        for traj, steps, mask in zip(d.unbind(0), step_count, d["collector", "mask"]):
            ids = traj["collector", "traj_ids"][mask]  # Port: -1 pads the ids
            assert ids.unique().numel() == 1
            steps = steps[mask]
            assert (steps[1:] - steps[:-1] == 1).all()

        collector.shutdown()
        del collector

    @pytest.mark.parametrize("num_env", [1, 2])
    @pytest.mark.parametrize("collector_class", [Collector])
    @pytest.mark.parametrize("env_name", ["vec"])
    @pytest.mark.torchrl_difference(ENV_ARGUMENT, adapted=True)
    @pytest.mark.torchrl_difference(IDS_AND_CUTS, adapted=True)
    def test_traj_len_consistency(self, num_env, env_name, collector_class, seed=100):
        """Tests that various frames_per_batch lead to the same results."""
        # Port: TorchRL's "vec" mock env (and ParallelEnv of them) becomes CartPole (and a
        # vector env of them), with a deterministic policy, as make_policy's is.

        def env_fn():
            if num_env == 1:
                return gym.make("CartPole-v1")
            return gym.make_vec("CartPole-v1", num_envs=num_env, vectorization_mode="sync")

        max_frames_per_traj = 20
        policy = threshold_policy

        def run(frames):
            collector = collector_class(
                env_fn,
                policy=policy,
                frames_per_batch=frames * num_env,
                max_frames_per_traj=2000,
                total_frames=2 * num_env * max_frames_per_traj,
                device="cpu",
            )
            collector.set_seed(seed)
            count = 0
            data = []
            for d in collector:
                data.append(d)
                count += d.shape[-1]
                if count > max_frames_per_traj:
                    break
            collector.shutdown()
            data = torch.cat(data, d.ndim - 1)[..., :max_frames_per_traj]
            # Port: ids (unique per collector) and batch-edge cut marks differ by design
            return data.exclude(("collector", "traj_ids"), ("collector", "cut"))

        data1, data10, data20 = run(1), run(10), run(20)
        assert_allclose_td(data1, data20)
        assert_allclose_td(data10, data20)

    @pytest.mark.parametrize("use_buffers", [True, False])
    @pytest.mark.parametrize("storing_device", [None, "cpu"])
    @pytest.mark.torchrl_difference(NO_PROCESS_OPTIONS, adapted=True)
    def test_unbatched_env_traj_ids_shape_consistency(self, use_buffers, storing_device):
        """Regression test for issue #3137: traj_ids shape inconsistency with unbatched envs.

        When using Collector with an unbatched environment (batch_size=()),
        the traj_ids should maintain consistent shapes across all steps, even when
        done=True triggers trajectory updates.

        See: https://github.com/pytorch/rl/issues/3137
        """

        class UnbatchedDoneEnv(gym.Env):
            """Unbatched environment that returns done=True after N steps."""

            def __init__(self, done_after_n_steps=6):
                self.done_after_n_steps = done_after_n_steps
                self._step_count = 0
                self.observation_space = gym.spaces.Box(-1, 1, (3,))
                self.action_space = gym.spaces.Box(-1, 1, (1,))

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self._step_count = 0
                return self.observation_space.sample(), {}

            def step(self, action):
                self._step_count += 1
                done = self._step_count >= self.done_after_n_steps
                return self.observation_space.sample(), 1.0, done, False, {}

        env = UnbatchedDoneEnv(done_after_n_steps=6)
        policy = RandomPolicy(env.action_space)

        collector = Collector(
            lambda: UnbatchedDoneEnv(done_after_n_steps=6),
            policy=policy,
            total_frames=100,
            frames_per_batch=30,
            storing_device=storing_device,
        )  # Port: use_buffers=use_buffers dropped

        try:
            for i, data in enumerate(collector):
                # Verify the data has the expected shape
                assert data.shape == torch.Size([30]), (
                    f"Batch {i}: expected shape [30], got {data.shape}"
                )

                # Verify traj_ids exists and has consistent shape
                traj_ids = data.get(("collector", "traj_ids"))
                assert traj_ids is not None, "traj_ids should be present"
                assert traj_ids.shape == torch.Size([30]), (
                    f"Batch {i}: traj_ids expected shape [30], got {traj_ids.shape}"
                )

                # Verify traj_ids values are valid (non-negative integers)
                assert (traj_ids >= 0).all(), "traj_ids should be non-negative"

                if i >= 2:
                    break
        finally:
            collector.shutdown()

    def test_collector_next_method(self):
        """Non-regression test: next() should work correctly after __iter__.

        Previously, `__iter__` set `_iterator = True` as a flag, but `next()` expected
        `_iterator` to be either `None` or an actual iterator object. This test ensures
        that calling `next()` works correctly.
        """
        env = gym.make("Pendulum-v1")  # Port: ContinuousActionVecMockEnv
        policy = RandomPolicy(env.action_space)

        collector = Collector(
            env,
            policy,
            total_frames=500,
            frames_per_batch=50,
        )
        try:
            # Test calling next() multiple times
            data1 = collector.next()
            assert data1 is not None, "next() should return data"
            assert data1.numel() == 50, f"Expected 50 frames, got {data1.numel()}"

            data2 = collector.next()
            assert data2 is not None, "second next() should return data"
            assert data2.numel() == 50, f"Expected 50 frames, got {data2.numel()}"

            # Test that we can still iterate after calling next()
            count = 0
            for data in collector:
                assert data.numel() == 50
                count += 1
                if count >= 2:
                    break
        finally:
            collector.shutdown()

    @pytest.mark.parametrize("parallel", [False, True])
    @pytest.mark.parametrize(
        "constr",
        [
            functools.partial(split_trajectories, prefix="collector"),
            functools.partial(split_trajectories),
            functools.partial(split_trajectories, trajectory_key=("collector", "traj_ids")),
        ],
    )
    @pytest.mark.torchrl_difference(NO_ENV_TRANSFORMS, adapted=True)
    def test_collector_env_reset(self, constr, parallel):
        torch.manual_seed(0)

        # Port: GymEnv(CartPole, frame_skip=4) + StepCounter: gymnasium has no frame_skip
        # option for CartPole (a TorchRL GymEnv option); the step count is read from
        # is_init (steps_in_episode), 0-based where StepCounter counts from 1.
        if parallel:
            env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async")
        else:
            env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        collector = Collector(
            env,
            policy=None,
            total_frames=2001,
            frames_per_batch=2000,
            split_trajs=False,
            seed=0,  # Port: env.set_seed(0)
        )
        try:
            for _data in collector:
                break
            steps = (steps_in_episode(_data) + 1)[..., 1:, None]
            done = _data["next", "done"][..., :-1, :]
            # we don't want just one done
            assert done.sum() > 3
            # check that after a done, the next step count is always 1
            assert (steps[done] == 1).all()
            # check that if the env is not done, the next step count is > 1
            assert (steps[~done] > 1).all()
            # check that if step is 1, then the env was done before
            assert (steps == 1)[done].all()
            # check that split traj has reasonable reward structure
            _data = constr(_data)
            assert _data["next", "reward"].sum(-2).min() >= 0
        finally:
            collector.shutdown()

    @pytest.mark.parametrize(
        "break_when_any_done,break_when_all_done",
        [[True, False], [False, True], [False, False]],
    )
    @pytest.mark.parametrize("n_envs", [1, 4])
    @pytest.mark.torchrl_difference(COUNTING_ACTIONS, adapted=True)
    @pytest.mark.torchrl_difference(IDS_AND_CUTS, adapted=True)
    def test_collector_outplace_policy(self, n_envs, break_when_any_done, break_when_all_done):
        # Port: the actions are the Discrete(2) counter increments of envs.CountingEnv
        def policy_inplace(td):
            td.set("action", torch.ones(td.shape, dtype=torch.int64))
            return td

        def policy_outplace(td):
            return td.empty().set("action", torch.ones(td.shape, dtype=torch.int64))

        if n_envs == 1:
            env = lambda: CountingEnv(10)  # noqa: E731
        else:
            env = lambda: counting_vec(n_envs, [10 + i for i in range(n_envs)])  # noqa: E731
        c_inplace = Collector(env, policy_inplace, frames_per_batch=10, total_frames=100)
        d_inplace = torch.cat(list(c_inplace), dim=0)
        c_outplace = Collector(env, policy_outplace, frames_per_batch=10, total_frames=100)
        d_outplace = torch.cat(list(c_outplace), dim=0)
        # Port: the two collectors' trajectory ids differ (IDS_AND_CUTS); the rest matches
        assert_allclose_td(
            d_inplace.exclude(("collector", "traj_ids")),
            d_outplace.exclude(("collector", "traj_ids")),
        )

    @pytest.mark.torchrl_difference(COUNTING_ACTIONS, adapted=True)
    def test_policy_with_mask(self):
        env = CountingEnv(start_val=10, max_steps=int(1e5))  # Port: CountingBatchedEnv

        def policy(td):
            obs = td.get("observation")
            # This policy cannot work with obs all 0s
            if not obs.any():
                raise AssertionError
            action = (obs[..., 0] > 0).long()  # Port: obs.clone() (a Discrete(2) action)
            td.set("action", action)
            return td

        collector = Collector(env, policy=policy, frames_per_batch=10, total_frames=20)
        for _ in collector:
            break
        collector.shutdown()

    @pytest.mark.parametrize("ctype", [Collector])
    def test_env_that_errors(self, ctype):
        make_env = EnvThatErrorsAfter10Iters
        policy = RandomPolicy(make_env().action_space)
        collector = Collector(make_env, policy=policy, frames_per_batch=30, total_frames=60)
        with pytest.raises(RuntimeError):
            for _ in collector:
                break

    @pytest.mark.parametrize("ctype", [Collector])
    @pytest.mark.torchrl_difference(ENV_ARGUMENT, adapted=True)
    def test_no_stopiteration(self, ctype):
        # Tests that there is no StopIteration raised and that the length of the collector is properly set
        envs = counting_vec(16)  # Port: SerialEnv(16, CountingEnv)

        collector = ctype(envs, frames_per_batch=173, total_frames=300)  # Port: create_env_fn=
        try:
            c_iter = iter(collector)
            assert len(collector) == 2
            for i in range(len(collector)):  # noqa: B007
                c = next(c_iter)
                assert c is not None
            assert i == 1
        finally:
            collector.shutdown()
            del collector

    @pytest.mark.parametrize("collector_class", [Collector])
    @pytest.mark.torchrl_difference(COLLECTOR_STATE)
    def test_collector_reloading(self, collector_class):
        def make_env():
            return gym.make("Pendulum-v1")  # Port: ContinuousActionVecMockEnv

        dummy_env = make_env()
        policy_module = nn.Linear(dummy_env.observation_space.shape[-1], 1)
        policy = TensorDictModule(policy_module, in_keys=["observation"], out_keys=["action"])

        collector_kwargs = {
            "env": make_env,  # Port: "create_env_fn"
            "policy": policy,
            "frames_per_batch": 30,
            "total_frames": 90,
        }

        collector = collector_class(**collector_kwargs)
        for i, _ in enumerate(collector):
            if i == 3:
                break
        collector_frames = collector._frames
        collector_iter = collector._iter
        collector_state_dict = collector.state_dict()
        saved_traj_id = collector_state_dict["traj_pool"]["traj_id"].item()
        collector.shutdown()

        collector = collector_class(**collector_kwargs)
        collector.load_state_dict(collector_state_dict)
        assert collector._frames == collector_frames
        assert collector._iter == collector_iter
        assert collector.state_dict()["traj_pool"]["traj_id"].item() > saved_traj_id
        for _ in enumerate(collector):
            raise AssertionError
        collector.shutdown()
        del collector

    @pytest.mark.parametrize("env_class", ["CountingEnv", "CountingBatchedEnv"])
    @pytest.mark.torchrl_difference(ENV_ARGUMENT, adapted=True)
    @pytest.mark.torchrl_difference(COUNTING_ACTIONS, adapted=True)
    def test_initial_obs_consistency(self, env_class, seed=1):
        # non regression test on #938
        torch.manual_seed(seed)
        start_val = 4
        if env_class == "CountingEnv":
            num_envs = 1
            env = CountingEnv(max_steps=8, start_val=start_val)
            max_steps = 8
        elif env_class == "CountingBatchedEnv":
            num_envs = 2
            # Port: CountingBatchedEnv(max_steps=arange(2) + 17) is a vector env of two
            env = counting_vec(2, [17, 18], start_val=start_val)
            max_steps = 18
        policy = ones_policy  # Port: the same policy, written for a Discrete(2) action
        collector = Collector(
            env,  # Port: create_env_fn=env
            policy=policy,
            frames_per_batch=((max_steps - 3) * 2 + 2) * num_envs,  # at least two episodes
            split_trajs=False,
            total_frames=-1,
            seed=seed,  # Port: env.set_seed(seed)
        )
        for _d in collector:
            break
        obs = _d["observation"].squeeze()
        if env_class == "CountingEnv":
            arange_0 = start_val + torch.arange(max_steps - 3)
            arange = start_val + torch.arange(2)
            expected = torch.cat([arange_0, arange_0, arange])
        else:
            # the first env has a shorter horizon than the second
            arange_0 = start_val + torch.arange(max_steps - 3 - 1)
            arange = start_val + torch.arange(start_val)
            expected_0 = torch.cat([arange_0, arange_0, arange])
            arange_0 = start_val + torch.arange(max_steps - 3)
            arange = start_val + torch.arange(2)
            expected_1 = torch.cat([arange_0, arange_0, arange])
            expected = torch.stack([expected_0, expected_1])
        assert torch.allclose(obs, expected.to(obs.dtype))
        collector.shutdown()
        del collector


class TestCollectorRB:
    @pytest.mark.torchrl_difference(NO_NDIM)
    @pytest.mark.torchrl_difference(YIELDS_WITH_RB)
    def test_collector_rb_sync(self):
        env = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
        rb = ReplayBuffer(storage=LazyTensorStorage(256, ndim=2), batch_size=5)
        collector = Collector(
            env,
            RandomPolicy(env.single_action_space),
            replay_buffer=rb,
            total_frames=256,
            frames_per_batch=16,
            seed=0,
        )
        torch.manual_seed(0)

        for c in collector:
            assert c is None
            rb.sample()
        rbdata0 = rb[:].clone()
        collector.shutdown()

        env = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
        rb = ReplayBuffer(storage=LazyTensorStorage(256, ndim=2), batch_size=5)
        collector = Collector(
            env, RandomPolicy(env.single_action_space), total_frames=256, frames_per_batch=16
        )
        torch.manual_seed(0)

        for i, c in enumerate(collector):
            rb.extend(c)
            torch.testing.assert_close(
                rbdata0[:, : (i + 1) * 2]["observation"], rb[:]["observation"]
            )
            assert c is not None
            rb.sample()

        rbdata1 = rb[:].clone()
        collector.shutdown()
        assert assert_allclose_td(rbdata0, rbdata1)


class TestAsyncCollection:
    @pytest.mark.parametrize("total_frames", [-1, 1_000_000_000])
    def test_start_single(self, total_frames):
        rb = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000))
        env = CountingEnv()
        policy = RandomPolicy(action_space=env.action_space)
        collector = Collector(
            env,
            policy,
            replay_buffer=rb,
            total_frames=total_frames,
            frames_per_batch=16,
        )
        try:
            collector.start()
            for _ in range(10):
                time.sleep(0.1)
                if len(rb) >= 16:
                    break
            else:
                raise RuntimeError("RB is empty")
            assert len(rb) >= 16
        finally:
            collector.async_shutdown(timeout=10)
            del collector

    @pytest.mark.parametrize("total_frames", [-1, 1_000_000_000])
    @pytest.mark.parametrize("cls", [Collector])
    @pytest.mark.parametrize("weight_sync_scheme", [None, "MultiProcess", "SharedMem"])
    @pytest.mark.torchrl_difference(COUNTING_ACTIONS, adapted=True)
    def test_start_update_policy(self, total_frames, cls, weight_sync_scheme):
        # Port: weight_sync_scheme only parametrizes multi-process collectors (TorchRL-only);
        # for Collector it is unused, as in TorchRL.
        rb = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000))
        env = CountingEnv()
        m = nn.Linear(env.observation_space.shape[-1], 1)
        m.weight.data.fill_(0)
        m.bias.data.fill_(0)
        policy = TensorDictSequential(
            TensorDictModule(lambda x: x.float(), in_keys=["observation"], out_keys=["action"]),
            TensorDictModule(m, in_keys=["action"], out_keys=["action"]),
            TensorDictModule(
                # Port: x.to(torch.int8) -> a scalar int64 (Discrete(2) action)
                lambda x: x.squeeze(-1).to(torch.int64),
                in_keys=["action"],
                out_keys=["action"],
            ),
        )
        td = TensorDict.from_module(policy).data.clone()

        collector = cls(
            env,
            policy,
            replay_buffer=rb,
            total_frames=total_frames,
            frames_per_batch=16,
        )
        try:
            collector.start()
            for _ in range(10):
                time.sleep(0.1)
                if len(rb) >= 16:
                    break
            else:
                raise RuntimeError("RB is empty")
            assert (rb[-16:]["action"] == 0).all()
            td["module", "1", "module", "bias"] += 1
            collector.update_policy_weights_(td)
            for _ in range(10):
                time.sleep(0.1)
                if (rb[-16:]["action"] == 1).all():
                    break
            else:
                raise RuntimeError("Failed to update policy weights")
        finally:
            collector.async_shutdown(timeout=10)
            del collector

    @pytest.mark.torchrl_difference(IN_PROCESS, adapted=True)
    def test_pause(self):
        rb = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000))
        env = CountingEnv()
        policy = RandomPolicy(action_space=env.action_space)
        collector = Collector(  # Port: AsyncCollector(CountingEnv, ...)
            CountingEnv,
            policy,
            replay_buffer=rb,
            total_frames=-1,
            frames_per_batch=16,
        )
        try:
            num_pauses = 0
            collector.start()
            for _ in range(10):
                time.sleep(0.1)
                if len(rb) >= 16:
                    with collector.pause():
                        num_pauses += 1
                        n = rb.write_count
                        for _ in range(10):
                            assert rb.write_count == n
                            time.sleep(0.1)
                    time.sleep(1)
                    assert rb.write_count > n
                    if num_pauses == 2:
                        break
            else:
                raise RuntimeError("RB is empty")
            assert len(rb) >= 16
        finally:
            collector.async_shutdown(timeout=10)
            del collector


class _VersionStampModule(nn.Module):
    """Emits a constant unit action and stamps the module's current version."""

    def __init__(self):  # Port: no TorchRL action spec (a Discrete(2) action)
        super().__init__()
        self.version = 0

    def forward(self, obs):
        action = torch.ones(obs.shape[:-1], dtype=torch.int64)
        version = torch.full_like(obs, self.version)
        return action, version


class TestTrajsPerBatch:
    """Tests for the ``trajs_per_batch`` kwarg on collectors."""

    @pytest.mark.torchrl_difference(NO_TRAJ_FORMAT_WARNING)
    def test_traj_format_default_future_warning(self):
        """Omitting traj_format under trajs_per_batch warns about the v0.16 flip.

        The default currently resolves to "padded". The warning only fires
        when the layout choice matters: explicit formats, fixed-frame
        collection and replay-buffer writes stay silent.
        """
        env_fn = lambda: counting_env(max_steps=4)  # noqa: E731
        policy = RandomPolicy(CountingEnv().action_space)
        with pytest.warns(FutureWarning, match="will change to 'cat' in torchrl v0.16"):
            collector = Collector(
                env_fn,
                policy,
                frames_per_batch=8,
                total_frames=16,
                trajs_per_batch=2,
            )
        assert collector.traj_format == "padded"
        collector.shutdown()
        for kwargs in (
            {"trajs_per_batch": 2, "traj_format": "cat"},
            {"trajs_per_batch": 2, "traj_format": "padded"},
            {},
            {
                "trajs_per_batch": 2,
                "replay_buffer": ReplayBuffer(storage=LazyTensorStorage(100)),
            },
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                collector = Collector(
                    env_fn,
                    policy,
                    frames_per_batch=8,
                    total_frames=16,
                    **kwargs,
                )
            collector.shutdown()
            assert not any("traj_format" in str(w.message) for w in caught), kwargs

    @pytest.mark.torchrl_difference(PRIVATE_STATE, adapted=True)
    def test_reset_flushes_assembly_state(self):
        """collector.reset() drops in-flight and queued-but-unyielded episodes.

        Regression: the assembly queues survived reset(), so post-reset
        batches led with pre-reset episodes (stale data straddling a policy
        update), partial chunks of killed episodes leaked, and a stale
        partial could merge with a later episode reusing a rebased traj id.
        """
        env = counting_env(max_steps=2)
        inner = _VersionStampModule()
        policy = TensorDictModule(
            inner,
            in_keys=["observation"],
            out_keys=["action", "policy_version"],
        )
        # 3-step episodes, 10-frame polls: the first poll completes 3
        # episodes (one yielded batch of 2, one queued surplus) and leaves a
        # fourth in flight
        collector = Collector(
            env,
            policy,
            frames_per_batch=10,
            total_frames=-1,
            trajs_per_batch=2,
            traj_format="padded",
        )
        try:
            it = iter(collector)
            b1 = next(it)
            assert (b1["policy_version"] == 0).all()
            # Port: the queues are collector._traj_assembly in TorchRL; splice's
            # TrajectoryAssembler is internal, so only the effect is checked below
            inner.version = 1
            collector.reset()
            b2 = next(it)
            assert (b2["policy_version"][b2["collector", "mask"]] == 1).all()
        finally:
            collector.shutdown()

    def test_traj_format_validation(self):
        """traj_format is validated eagerly: bad value or missing trajs_per_batch."""
        env = counting_env(max_steps=4)
        policy = RandomPolicy(env.action_space)
        with pytest.raises(ValueError, match="must be 'padded' or 'cat'"):
            Collector(
                env,
                policy,
                frames_per_batch=8,
                total_frames=16,
                trajs_per_batch=2,
                traj_format="flat",
            )
        with pytest.raises(ValueError, match="trajs_per_batch"):
            Collector(
                env,
                policy,
                frames_per_batch=8,
                total_frames=16,
                traj_format="cat",
            )
        env.close()

    @pytest.mark.parametrize("collector_cls,multi", [(Collector, False)])
    @pytest.mark.torchrl_difference(END_OF_RUN)
    def test_trajs_per_batch_integration(self, collector_cls, multi):
        """trajs_per_batch yields (N, T) batches with valid done states for all collectors."""
        max_steps = 4
        env_fn = lambda: counting_env(max_steps=max_steps, limit=max_steps)  # noqa: E731
        policy = RandomPolicy(CountingEnv().action_space)

        env = env_fn()
        collector = collector_cls(
            env,
            policy,
            frames_per_batch=max_steps * 3,
            total_frames=max_steps * 9,
            trajs_per_batch=2,
            traj_format="padded",
        )

        try:
            batches = list(collector)
            assert len(batches) > 0
            for b in batches:
                assert b.shape[0] == 2
                mask = b[("collector", "mask")]
                assert mask.shape == b.shape
                # each trajectory must have at least one valid step
                assert mask.any(dim=-1).all()
                # the last valid step of each trajectory must be done
                for i in range(b.shape[0]):
                    last_valid = mask[i].sum().item() - 1
                    done = b[i, last_valid][("next", "done")]
                    assert done.any(), f"traj {i} last valid step is not done"
        finally:
            collector.shutdown()

    @pytest.mark.parametrize("collector_cls,multi", [(Collector, False)])
    @pytest.mark.torchrl_difference(NO_ENV_TRANSFORMS, adapted=True)
    @pytest.mark.torchrl_difference(END_OF_RUN)
    def test_traj_format_cat_integration(self, collector_cls, multi):
        """traj_format="cat" yields flat batches of whole trajectories.

        Each batch is 1-D, holds exactly trajs_per_batch done flags, carries
        no ("collector", "mask"), and its trajectories are contiguous: within
        a traj_ids segment the step counter increases by one and the segment
        ends with done=True.
        """
        max_steps = 4
        trajs_per_batch = 2
        env_fn = lambda: counting_env(max_steps=max_steps, limit=max_steps)  # noqa: E731
        policy = RandomPolicy(CountingEnv().action_space)

        env = env_fn()
        collector = collector_cls(
            env,
            policy,
            frames_per_batch=max_steps * 3,
            total_frames=max_steps * 9,
            trajs_per_batch=trajs_per_batch,
            traj_format="cat",
        )

        try:
            batches = list(collector)
            assert len(batches) > 0
            for b in batches:
                assert b.ndim == 1
                assert ("collector", "mask") not in b.keys(True)
                done = b["next", "done"].reshape(-1)
                assert done.sum().item() == trajs_per_batch
                # trajectories are contiguous segments delimited by traj_ids
                traj_ids = b["collector", "traj_ids"]
                step_count = steps_in_episode(b)  # Port: b["step_count"] (StepCounter)
                segment_ends = done.nonzero().reshape(-1).tolist()
                start = 0
                for end in segment_ends:
                    assert (traj_ids[start : end + 1] == traj_ids[start]).all()
                    steps = step_count[start : end + 1]
                    assert (steps[1:] - steps[:-1] == 1).all()
                    start = end + 1
                # the batch holds nothing past the last trajectory
                assert start == b.shape[0]
        finally:
            collector.shutdown()


class TestTrajsPerBatchReplayBuffer:
    @staticmethod
    def _make_env_and_policy(max_steps=4):
        # Port: TransformedEnv(CountingEnv(max_steps), StepCounter(max_steps))
        env_fn = lambda: counting_env(max_steps=max_steps, limit=max_steps)  # noqa: E731
        policy = RandomPolicy(CountingEnv().action_space)
        return env_fn, policy

    @staticmethod
    def _assert_rb_trajectories_complete(rb):
        """Assert that every trajectory stored in *rb* ends with done=True.

        Groups all stored timesteps by ``("collector", "traj_ids")`` and
        checks that the last timestep of each trajectory has
        ``("next", "done") == True``.  This is the core completeness
        guarantee of ``trajs_per_batch``.
        """
        all_data = rb[: len(rb)]  # Port: rb.storage[: len(rb)] (BUFFER_DRIVEN)
        traj_ids = all_data[("collector", "traj_ids")]
        done = all_data[("next", "done")]
        unique_ids = traj_ids.unique()
        assert len(unique_ids) > 0, "replay buffer has no trajectories"
        for tid in unique_ids:
            mask = traj_ids == tid
            traj_done = done[mask]
            assert traj_done[-1].any(), (
                f"trajectory {tid.item()} does not end with done=True — "
                "partial trajectory leaked into the replay buffer"
            )

    @pytest.mark.torchrl_difference(END_OF_RUN, adapted=True)
    @pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
    def test_trajs_per_batch_replay_buffer_sync(self):
        """Replay buffer receives complete trajectories as flat timesteps."""
        max_steps = 4
        num_trajs = 2
        env_fn, policy = self._make_env_and_policy(max_steps)
        rb = ReplayBuffer(storage=LazyTensorStorage(200))
        env = env_fn()
        collector = Collector(
            env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * 3,
            total_frames=max_steps * 12,
            trajs_per_batch=num_trajs,
            drop_incomplete=True,  # Port: TorchRL drops the unfinished episodes
        )
        try:
            list(collector)  # exhaust the collector
        finally:
            collector.shutdown()

        assert len(rb) > 0, "replay buffer must be non-empty"
        # Trajectories are stored as flat timestep sequences (1-D storage);
        # each sampled entry is a single timestep.
        sample = rb.sample(num_trajs)
        assert sample.ndim == 1, "sampled entries should be individual timesteps (1-D)"
        assert ("collector", "traj_ids") in sample.keys(True)
        self._assert_rb_trajectories_complete(rb)

    @pytest.mark.torchrl_difference(NO_PROCESS_OPTIONS, adapted=True)
    @pytest.mark.torchrl_difference(END_OF_RUN, adapted=True)
    @pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
    def test_trajs_per_batch_replay_buffer_start_async(self):
        """collector.start() fills the replay buffer with complete trajectories."""
        max_steps = 4
        num_trajs = 2
        env_fn, policy = self._make_env_and_policy(max_steps)
        rb = ReplayBuffer(storage=LazyTensorStorage(200))  # Port: shared=True dropped
        env = env_fn()
        collector = Collector(
            env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * 3,
            total_frames=max_steps * 12,
            trajs_per_batch=num_trajs,
            drop_incomplete=True,  # Port: TorchRL drops the unfinished episodes
        )
        collector.start()
        deadline = time.time() + 30
        while len(rb) < num_trajs and time.time() < deadline:
            time.sleep(0.05)
        collector.async_shutdown()

        assert len(rb) >= num_trajs, "replay buffer must have at least num_trajs entries"
        sample = rb.sample(num_trajs)
        assert sample.ndim == 1
        assert ("collector", "traj_ids") in sample.keys(True)
        self._assert_rb_trajectories_complete(rb)

    @pytest.mark.torchrl_difference(END_OF_RUN, adapted=True)
    @pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
    def test_trajs_per_batch_completeness_single(self):
        """All trajectories in the RB are complete (single-process collector).

        Fills the buffer with many trajectories and asserts every single one
        ends with ``("next", "done") == True``.  No partial trajectory may
        leak into the buffer — partials stay in the internal ``partial_trajs``
        dict until the episode finishes.
        """
        max_steps = 5
        num_trajs = 3
        env_fn, policy = self._make_env_and_policy(max_steps)
        rb = ReplayBuffer(storage=LazyTensorStorage(1000))
        env = env_fn()
        collector = Collector(
            env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * 4,
            total_frames=max_steps * 40,
            trajs_per_batch=num_trajs,
            drop_incomplete=True,  # Port: TorchRL drops the unfinished episodes
        )
        try:
            list(collector)
        finally:
            collector.shutdown()

        assert len(rb) > 0
        self._assert_rb_trajectories_complete(rb)

    @pytest.mark.torchrl_difference(END_OF_RUN, adapted=True)
    @pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
    def test_trajs_per_batch_completeness_batched_env(self):
        """All trajectories in the RB are complete (batched env).

        A batched env (SerialEnv with 3 sub-envs) produces interleaved steps
        from multiple environments.  ``_traj_ingest`` flattens and groups by
        ``traj_id``, so each trajectory is still written as a flat 1-D
        sequence.  Verify that every one ends with done=True.
        """
        max_steps = 4
        num_envs = 3
        num_trajs = 4

        batched_env = counting_vec(num_envs, max_steps, limit=max_steps)  # Port: SerialEnv
        policy = RandomPolicy(batched_env.single_action_space)
        rb = ReplayBuffer(storage=LazyTensorStorage(500))
        collector = Collector(
            batched_env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * num_envs * 3,
            total_frames=max_steps * num_envs * 20,
            trajs_per_batch=num_trajs,
            drop_incomplete=True,  # Port: TorchRL drops the unfinished episodes
        )
        try:
            list(collector)
        finally:
            collector.shutdown()

        assert len(rb) > 0, "replay buffer must be populated"
        self._assert_rb_trajectories_complete(rb)

    def test_trajs_per_batch_flat_storage_batched_env(self):
        """Batched env + trajs_per_batch writes flat 1-D sequences to the RB.

        Even though the environment has batch_size > 1, trajectories are
        disassembled by ``_traj_ingest`` (which flattens and groups by
        ``traj_id``) and written individually.  The replay buffer storage
        should be 1-D (ndim=1) — each entry is a single timestep.
        """
        max_steps = 4
        num_envs = 2
        num_trajs = 4

        batched_env = counting_vec(num_envs, max_steps, limit=max_steps)  # Port: SerialEnv
        policy = RandomPolicy(batched_env.single_action_space)
        rb = ReplayBuffer(storage=LazyTensorStorage(400))
        collector = Collector(
            batched_env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * num_envs * 3,
            total_frames=max_steps * num_envs * 12,
            trajs_per_batch=num_trajs,
        )
        try:
            list(collector)
        finally:
            collector.shutdown()

        assert len(rb) > 0
        # Storage is 1-D: each entry is one timestep, not an env-batch slice
        sample = rb.sample(4)
        assert sample.ndim == 1, f"Expected 1-D storage (flat timesteps) but got ndim={sample.ndim}"
        assert ("collector", "traj_ids") in sample.keys(True)

    def test_trajs_per_batch_slice_sampler(self):
        """SliceSampler samples contiguous slices from trajectory-filled buffer."""
        max_steps = 8
        num_trajs = 4
        slice_len = 3
        env_fn, policy = self._make_env_and_policy(max_steps)
        rb = ReplayBuffer(
            storage=LazyTensorStorage(800),
            sampler=SliceSampler(
                slice_len=slice_len,
                end_key=("next", "done"),
                strict_length=True,
            ),
        )
        env = env_fn()
        collector = Collector(
            env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * 3,
            total_frames=max_steps * 30,
            trajs_per_batch=num_trajs,
        )
        try:
            list(collector)
        finally:
            collector.shutdown()

        assert len(rb) > 0
        num_slices = 4
        sample = rb.sample(slice_len * num_slices)
        assert sample.shape[0] == slice_len * num_slices
        # Verify contiguity: within each slice, traj_ids are constant and
        # step counts are monotonically increasing
        sample_reshaped = sample.reshape(num_slices, slice_len)
        for i in range(num_slices):
            slice_data = sample_reshaped[i]
            tids = slice_data[("collector", "traj_ids")]
            assert (tids == tids[0]).all(), f"slice {i}: traj_ids should be constant within a slice"

    def test_trajs_per_batch_slice_sampler_batched_env(self):
        """SliceSampler + batched env: slices respect episode boundaries.

        Fills a buffer from a batched environment using ``trajs_per_batch``,
        then samples slices and verifies that no slice crosses an episode
        boundary (i.e. ``done=True`` only appears at the last position of a
        slice, or not at all).
        """
        max_steps = 6
        num_envs = 2
        num_trajs = 4
        slice_len = 3

        batched_env = counting_vec(num_envs, max_steps, limit=max_steps)  # Port: SerialEnv
        policy = RandomPolicy(batched_env.single_action_space)
        rb = ReplayBuffer(
            storage=LazyTensorStorage(600),
            sampler=SliceSampler(
                slice_len=slice_len,
                end_key=("next", "done"),
                strict_length=True,
            ),
        )
        collector = Collector(
            batched_env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * num_envs * 3,
            total_frames=max_steps * num_envs * 20,
            trajs_per_batch=num_trajs,
        )
        try:
            list(collector)
        finally:
            collector.shutdown()

        assert len(rb) > 0
        num_slices = 6
        sample = rb.sample(slice_len * num_slices)
        sample_reshaped = sample.reshape(num_slices, slice_len)
        for i in range(num_slices):
            slice_data = sample_reshaped[i]
            done = slice_data[("next", "done")].squeeze(-1)
            # done=True should only appear at the last step or not at all
            if done.any():
                # Find position of the first done=True
                done_pos = done.nonzero(as_tuple=True)[0]
                assert done_pos[-1] == slice_len - 1, (
                    f"slice {i}: done=True at position {done_pos.tolist()} "
                    f"but expected only at position {slice_len - 1}"
                )

    @pytest.mark.parametrize("with_rb", [False, True])
    @pytest.mark.torchrl_difference(END_OF_RUN, adapted=True)
    @pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
    def test_trajs_per_batch_batched_env(self, with_rb):
        """SerialEnv (batched) + trajs_per_batch, with and without replay buffer.

        Verifies trajectory completeness via InitTracker (is_init=True at start)
        and done=True at the last valid step (per ("collector", "mask")).
        When with_rb=True, trajectories are written as flat sequences to a 1-D
        replay buffer (ndim=2 is incompatible with variable-length trajectories).
        """
        max_steps = 4
        num_envs = 2
        num_trajs = 4

        batched_env = counting_vec(num_envs, max_steps, limit=max_steps)  # Port: SerialEnv
        policy = RandomPolicy(batched_env.single_action_space)
        rb = ReplayBuffer(storage=LazyTensorStorage(400)) if with_rb else None
        collector = Collector(
            batched_env,
            policy,
            replay_buffer=rb,
            frames_per_batch=max_steps * num_envs * 3,
            total_frames=max_steps * num_envs * 12,
            trajs_per_batch=num_trajs,
            drop_incomplete=True,  # Port: TorchRL drops the unfinished episodes
        )
        try:
            for traj_batch in collector:
                if traj_batch is None:
                    continue
                # traj_batch.shape == [num_trajs, max_len]
                mask = traj_batch[("collector", "mask")]
                is_init = traj_batch["is_init"]
                done = traj_batch[("next", "done")]
                for i in range(traj_batch.shape[0]):
                    row_mask = mask[i]
                    assert is_init[i][row_mask][0].any(), (
                        f"row {i}: first valid step must have is_init=True"
                    )
                    assert done[i][row_mask][-1].any(), (
                        f"row {i}: last valid step must have done=True"
                    )
        finally:
            collector.shutdown()

        if with_rb:
            assert len(rb) > 0, "replay buffer must be populated"
            assert ("collector", "traj_ids") in rb.sample(1).keys(True)
            self._assert_rb_trajectories_complete(rb)
