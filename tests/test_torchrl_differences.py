"""Every row of docs/coming_from_torchrl.rst, checked against both libraries.

Each test pins TorchRL 0.14.1's behaviour AND splice's, so that the page stays true: if either
side changes, the test says which claim broke. TorchRL is installed by the test command (the
``bench`` extra); the module is skipped only where torchrl is genuinely absent.
"""

from __future__ import annotations

import inspect
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

import splice
from splice import (
    Collector,
    LazyTensorStorage,
    ReplayBuffer,
    SliceSampler,
    split_trajectories,
)

pytest.importorskip("torchrl")
warnings.filterwarnings("ignore", module="torchrl")

from torchrl.collectors import Collector as TCollector  # noqa: E402
from torchrl.collectors.utils import split_trajectories as torchrl_split  # noqa: E402
from torchrl.data import LazyTensorStorage as TStorage  # noqa: E402
from torchrl.data import ReplayBuffer as TReplayBuffer  # noqa: E402
from torchrl.data import SliceSampler as TSliceSampler  # noqa: E402
from torchrl.envs import GymEnv, GymWrapper, InitTracker, TransformedEnv  # noqa: E402
from torchrl.modules import GRUModule, LSTMModule  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def ids_td(ids: list[int]) -> TensorDict:
    n = len(ids)
    return TensorDict(
        {"observation": torch.arange(float(n)), ("collector", "traj_ids"): torch.tensor(ids)},
        batch_size=[n],
    )


def t_collector(**kw) -> TCollector:
    """A TorchRL collector on CartPole with a seeded env (and torch seeded by conftest)."""
    kw.setdefault("frames_per_batch", 50)
    kw.setdefault("total_frames", 50)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    return TCollector(env, None, **kw)


def s_collector(env="CartPole-v1", policy=None, **kw) -> Collector:
    kw.setdefault("frames_per_batch", 50)
    kw.setdefault("total_frames", 50)
    return Collector(env, policy, seed=0, **kw)


K = np.array([12.9898, 78.233, 37.719, 4.581], dtype=np.float32)


def long_episode_policy(td):
    """The tutorial's noisy heuristic: episodes of ~100-200 steps."""
    obs = td["observation"].numpy()
    push = obs[..., 2] + 0.5 * obs[..., 3] > 0
    flip = np.modf(np.abs(np.sin(obs @ K) * 43758.5453))[0] < 0.2
    td["action"] = torch.from_numpy((push ^ flip).astype(np.int64))
    return td


# ----------------------------------------------------------------- names that map one to one
def test_argument_names_map_one_to_one():
    from torchrl.collectors._single import Collector as TSingle
    from torchrl.data import PrioritizedSliceSampler, SliceSamplerWithoutReplacement

    def params(f):
        return set(inspect.signature(f).parameters) - {"self", "args", "kwargs"}

    collector_shared = {
        "policy", "frames_per_batch", "total_frames", "max_frames_per_traj",
        "init_random_frames", "reset_at_each_iter", "split_trajs", "set_truncated",
        "trajs_per_batch", "traj_format", "replay_buffer", "device", "storing_device",
    }  # fmt: skip
    assert collector_shared <= params(TSingle.__init__) & params(Collector.__init__)
    assert "create_env_fn" in params(TSingle.__init__) and "env" in params(Collector.__init__)
    from torchrl.collectors._multi_base import MultiCollector  # MultiAsync forwards to it

    multi_shared = collector_shared | {
        "create_env_fn", "num_workers", "policy_factory", "num_sub_threads",
    }  # fmt: skip
    for s_multi in (splice.MultiSyncCollector, splice.MultiAsyncCollector):
        assert multi_shared <= params(MultiCollector.__init__) & params(s_multi.__init__)
    slice_shared = {
        "num_slices", "slice_len", "end_key", "traj_key", "truncated_key", "init_key",
        "strict_length", "pad_output", "cache_values",
    }  # fmt: skip
    t_slice = inspect.signature(TSliceSampler.__init__).parameters
    s_slice = inspect.signature(SliceSampler.__init__).parameters
    assert slice_shared <= set(t_slice) & set(s_slice)
    assert all(t_slice[k].default == s_slice[k].default for k in slice_shared)
    assert {"weighting", "as_sequences", "burn_in", "state_keys"} <= set(s_slice) - set(t_slice)
    assert {"drop_last", "shuffle"} <= params(SliceSamplerWithoutReplacement.__init__) & params(
        splice.SliceSamplerWithoutReplacement.__init__
    )
    assert {"max_capacity", "alpha", "beta", "eps"} <= params(
        PrioritizedSliceSampler.__init__
    ) & params(splice.PrioritizedSliceSampler.__init__)
    assert {"storage", "sampler", "batch_size"} <= params(TReplayBuffer.__init__) & params(
        ReplayBuffer.__init__
    )
    assert {"max_size", "device"} <= params(TStorage.__init__) & params(LazyTensorStorage.__init__)
    from torchrl.data import LazyMemmapStorage as TMemmap
    from torchrl.data import PrioritizedSampler as TPrioritized
    from torchrl.data import SamplerWithoutReplacement as TWithout

    assert {"max_size", "scratch_dir", "device", "ndim", "auto_cleanup"} <= params(
        TMemmap.__init__
    ) & params(splice.LazyMemmapStorage.__init__)
    assert {"max_capacity", "alpha", "beta", "eps", "reduction"} <= params(
        TPrioritized.__init__
    ) & params(splice.PrioritizedSampler.__init__)
    assert {"drop_last", "shuffle"} <= params(TWithout.__init__) & params(
        splice.SamplerWithoutReplacement.__init__
    )
    assert "generator" in params(TReplayBuffer.__init__) & params(ReplayBuffer.__init__)
    in_place = ["set_at_", "set_", "update_", "state_dict", "load_state_dict", "__setitem__"]
    assert all(hasattr(TReplayBuffer, m) and hasattr(ReplayBuffer, m) for m in in_place)
    assert all(hasattr(TCollector, m) for m in ("next", "reset", "set_seed"))
    assert all(hasattr(Collector, m) for m in ("next", "reset", "set_seed"))
    split_kw = {"prefix", "trajectory_key", "done_key", "as_nested"}
    t_split = inspect.signature(torchrl_split).parameters
    s_split = inspect.signature(split_trajectories).parameters
    assert all(t_split[k].default == s_split[k].default for k in split_kw)
    assert next(iter(t_split)) == "rollout_tensordict" and next(iter(s_split)) == "td"


@pytest.mark.parametrize("module", [GRUModule, LSTMModule])
def test_torchrl_recurrent_modules_as_splice_policies(module):
    rnn = module(input_size=4, hidden_size=8, in_key="observation", out_key="embed")
    head = TensorDictModule(torch.nn.Linear(8, 2), ["embed"], ["logits"])

    class Argmax(torch.nn.Module):
        def forward(self, logits):
            return logits.argmax(-1)

    policy = TensorDictSequential(rnn, head, TensorDictModule(Argmax(), ["logits"], ["action"]))
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with s_collector(env, policy, frames_per_batch=60, total_frames=60) as collector:
        batch = next(iter(collector))
    init = batch["is_init"].squeeze(-1)
    state_keys = [k for k in rnn.out_keys if isinstance(k, tuple) and k[0] == "next"]
    assert state_keys
    for key in state_keys:
        entering, produced = batch[key[1:]], batch[key]
        assert (entering[init] == 0).all() and (entering[~init].abs().sum(-1) > 0).all()
        carried = ~init[:, 1:]
        assert torch.equal(produced[:, :-1][carried], entering[:, 1:][carried])

    # TorchRL without a primer: the state is never fed back, every step starts from zero.
    if module is GRUModule:
        t_env = TransformedEnv(
            GymEnv("CartPole-v1", categorical_action_encoding=True), InitTracker()
        )
        tc = TCollector(
            t_env,
            policy,
            frames_per_batch=30,
            total_frames=30,
            auto_register_policy_transforms=False,
        )
        data = next(iter(tc))
        assert "recurrent_state" not in data.keys()
        with torch.no_grad():
            from_zero = rnn.gru(data["observation"].unsqueeze(1), torch.zeros(1, 30, 8))[1][0]
        assert torch.allclose(from_zero, data["next", "recurrent_state"].squeeze(-2), atol=1e-6)


def test_layout_details():
    batch = next(iter(s_collector()))
    assert batch["action"].dtype == torch.int64 and batch["action"].shape == (50,)
    assert "done" not in batch.keys()
    env = GymEnv("CartPole-v1")
    assert env.rand_step(env.reset())["action"].shape[-1] == 2  # one-hot by default
    assert "done" in next(iter(t_collector())).keys()


# ----------------------------------------------------------------- trajectory splitting
def test_padding_id():
    td = ids_td([4, 4, 4, 5, 5, 6])
    assert (torchrl_split(td)["collector", "traj_ids"][2, 1:] == 0).all()
    assert (split_trajectories(td)["collector", "traj_ids"][2, 1:] == -1).all()


def test_non_adjacent_ids():
    td = ids_td([0, 0, 1, 1, 0, 0])
    with pytest.raises(RuntimeError, match="split_with_sizes"):
        torchrl_split(td)
    assert split_trajectories(td)["observation"][0].tolist() == [0, 1, 4, 5]


def test_nested_mask():
    td = ids_td([4, 4, 4, 5, 5, 6])
    assert ("collector", "mask") not in torchrl_split(td, as_nested=True).keys(True)
    assert split_trajectories(td, as_nested=True)["collector", "mask"].is_nested
    assert split_trajectories(td, as_nested=torch.jagged).batch_size == (3,)


def test_padding_in_input():
    td = ids_td([4, 4, -1, -1, 5, 5])
    assert torchrl_split(td).batch_size[0] == 3
    assert split_trajectories(td).batch_size[0] == 2


# ----------------------------------------------------------------- collector
def test_ids_never_restart():
    a, b = next(iter(t_collector())), next(iter(t_collector()))
    assert a["collector", "traj_ids"][0] == b["collector", "traj_ids"][0] == 0
    a, b = next(iter(s_collector())), next(iter(s_collector()))
    assert not set(a["collector", "traj_ids"].tolist()) & set(b["collector", "traj_ids"].tolist())


def test_cut_flag_and_set_truncated():
    data = next(iter(t_collector(frames_per_batch=60, total_frames=60)))
    last = data[-1]
    if not last["next", "terminated"]:
        assert not last["next", "done"] and not last["next", "truncated"]  # nothing marks it
    data = next(iter(t_collector(frames_per_batch=60, total_frames=60, set_truncated=True)))
    assert data["next", "truncated"][-1] and data["next", "done"][-1]
    # splice: cut on every batch, and set_truncated adds truncated/done on top
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    plain = next(iter(s_collector(env, frames_per_batch=200, total_frames=200)))
    cut = plain["collector", "cut"]
    assert torch.equal(cut[:, -1], ~plain["next", "done"][:, -1, 0]) and not cut[:, :-1].any()
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    marked = next(
        iter(s_collector(env, frames_per_batch=200, total_frames=200, set_truncated=True))
    )
    assert torch.equal(marked["collector", "cut"], cut)
    assert marked["next", "truncated"][cut].all() and marked["next", "done"][cut].all()
    assert not marked["next", "terminated"][cut].any()


def test_trajs_per_batch_with_set_truncated():
    torch.manual_seed(0)
    kw = dict(frames_per_batch=20, total_frames=400, set_truncated=True, trajs_per_batch=2)
    ended = []
    for out in t_collector(traj_format="cat", **kw):
        ended += out["collector", "traj_ids"][out["next", "done"].squeeze(-1)].tolist()
    assert len(ended) != len(set(ended))  # the same id emitted as "complete" more than once
    outs = list(s_collector(traj_format="cat", **kw))
    for out in outs[:-1]:
        _, counts = torch.unique_consecutive(out["collector", "traj_ids"], return_counts=True)
        starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
        assert out["is_init"].squeeze(-1)[starts].all()
        assert int(out["next", "done"].sum()) == 2 and not out["collector", "cut"].any()


def test_end_of_run_and_len():
    kw = dict(frames_per_batch=50, total_frames=200, trajs_per_batch=3)
    outs = list(t_collector(**kw))
    assert sum(int(o["collector", "mask"].sum()) for o in outs) < 200  # leftovers dropped
    assert len(t_collector(**kw)) != len(outs)
    collector = s_collector(**kw)
    outs = list(collector)
    assert sum(int(o["collector", "mask"].sum()) for o in outs) == 200
    assert outs[-1]["collector", "cut"].any()
    with pytest.raises(TypeError):
        len(collector)
    collector = s_collector(drop_incomplete=True, **kw)
    list(collector)
    assert collector.dropped_trajs > 0
    collector = s_collector(frames_per_batch=50, total_frames=180)
    assert len(collector) == len(list(collector)) == 4


def test_reset_at_each_iter_with_trajs_per_batch_refused():
    with pytest.raises(ValueError, match="reset_at_each_iter"):
        Collector("CartPole-v1", frames_per_batch=50, trajs_per_batch=2, reset_at_each_iter=True)


def test_autoreset_modes_and_vector_entry_points():
    with pytest.raises(RuntimeError, match="SAME_STEP or DISABLED"):
        GymWrapper(gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"))
    with pytest.raises(AttributeError, match="autoreset_mode"):
        vec = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
        next(iter(TCollector(GymWrapper(vec), None, frames_per_batch=40, total_frames=40)))
    vec = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    assert next(iter(s_collector(vec, frames_per_batch=40, total_frames=40))).batch_size == (4, 10)
    # identical data in the three modes (tests/test_collector_autoreset.py checks more)
    data = []
    for mode in gym.vector.AutoresetMode:
        env = gym.make_vec(
            "CartPole-v1",
            num_envs=4,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": mode},
        )
        with Collector(
            env, long_episode_policy, frames_per_batch=400, total_frames=800, seed=0, worker_id=77
        ) as collector:
            data.append(torch.cat(list(collector), 1))
    assert all((d == data[0]).all() for d in data)


def test_yields_with_replay_buffer_and_pause():
    trb = TReplayBuffer(storage=TStorage(1000))
    assert next(iter(t_collector(replay_buffer=trb))) is None
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    assert next(iter(s_collector(replay_buffer=rb))) is not None and len(rb) == 50
    tc = t_collector(total_frames=-1, replay_buffer=TReplayBuffer(storage=TStorage(1000)))
    with pytest.raises(NotImplementedError):
        tc.pause()
    tc.shutdown()
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = s_collector(total_frames=-1, replay_buffer=rb)
    collector.start()
    try:
        deadline = time.monotonic() + 30
        while rb.write_count == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        with collector.pause(timeout=30):
            frozen = rb.write_count
            time.sleep(0.05)
            assert rb.write_count == frozen > 0
    finally:
        collector.shutdown(timeout=30)


def test_traj_format_default_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(t_collector(total_frames=200, trajs_per_batch=1)))
    assert any(issubclass(w.category, FutureWarning) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iter(s_collector(total_frames=200, trajs_per_batch=1)))


# ----------------------------------------------------------------- multi-process
def _t_cartpole():
    return GymEnv("CartPole-v1")


def _t_two_cartpoles():
    from torchrl.envs import SerialEnv

    return SerialEnv(2, _t_cartpole)


def _s_two_cartpoles():
    return gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")


@pytest.mark.timeout(600)  # TorchRL's workers take ~20 s to start on a loaded 2-core machine
def test_multi_sync_layout_and_ids():
    from torchrl.collectors import MultiSyncCollector as TMultiSync

    tc = TMultiSync([_t_two_cartpoles] * 2, None, frames_per_batch=40, total_frames=40)
    (t_batch,) = list(tc)
    tc.shutdown()
    assert t_batch.batch_size == torch.Size([2, 2, 10])  # stacked: [workers, envs, T]
    t_ids = t_batch["collector", "traj_ids"][..., 0].flatten().tolist()
    assert sorted(t_ids) == [0, 1, 2, 3]  # one counter shared by every env of every worker
    with splice.MultiSyncCollector(
        [_s_two_cartpoles] * 2, frames_per_batch=40, total_frames=40
    ) as sc:
        (s_batch,) = list(sc)
    assert s_batch.batch_size == torch.Size([4, 10])  # env rows concatenated: [B_total, T]
    spaces = splice.collectors.ids.worker_of(s_batch["collector", "traj_ids"][:, 0]).tolist()
    assert spaces[0] == spaces[1] != spaces[2] == spaces[3]  # an id space per worker


@pytest.mark.timeout(600)
def test_multi_start_honours_total_frames():
    from torchrl.collectors import MultiSyncCollector as TMultiSync

    trb = TReplayBuffer(storage=TStorage(100_000))
    tc = TMultiSync(
        [_t_cartpole] * 2, None, frames_per_batch=20, total_frames=40, replay_buffer=trb
    )
    tc.start()
    deadline = time.monotonic() + 120
    while len(trb) <= 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    tc.async_shutdown()
    assert len(trb) > 200  # far past total_frames=40: the workers run until shutdown
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    sc = splice.MultiSyncCollector(
        [_s_two_cartpoles] * 2, frames_per_batch=20, total_frames=40, replay_buffer=rb
    )
    sc.start()
    sc.wait(timeout=60)
    sc.shutdown()
    assert len(rb) == rb.write_count == 40 == sum(sc.worker_frames)


# ----------------------------------------------------------------- replay
def _cartpole_batch(n_env=4, frames=400, **kw):
    env = gym.make_vec("CartPole-v1", num_envs=n_env, vectorization_mode="sync")
    return next(iter(s_collector(env, frames_per_batch=frames, total_frames=frames, **kw)))


def test_replay_accepts_every_layout():
    batch = _cartpole_batch()
    episodes = next(iter(s_collector(frames_per_batch=100, total_frames=-1, trajs_per_batch=5)))
    for data in (batch, episodes):
        trb = TReplayBuffer(
            storage=TStorage(1000),
            sampler=TSliceSampler(slice_len=8, end_key=("next", "done")),
            batch_size=32,
        )
        trb.extend(data)
        with pytest.raises(RuntimeError, match="1-dimensional"):
            trb.sample()
        rb = ReplayBuffer(
            storage=LazyTensorStorage(1000),
            sampler=SliceSampler(slice_len=8, as_sequences=True, seed=0),
            batch_size=32,
        )
        rb.extend(data)
        mask = data.get(("collector", "mask"), None)
        assert len(rb) == (data.numel() if mask is None else int(mask.sum()))
        ids = rb.sample()["collector", "traj_ids"]
        assert (ids == ids[:, :1]).all() and (ids >= 0).all()


def test_slices_join_pieces_stored_apart():
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    batches = list(
        s_collector(env, long_episode_policy, frames_per_batch=200, total_frames=2000)
    )  # [4, 50] batches, episodes of 100+ steps: a 60-step slice needs two pieces
    trb = TReplayBuffer(
        storage=TStorage(10_000),
        sampler=TSliceSampler(slice_len=60, traj_key=("collector", "traj_ids")),
        batch_size=600,
    )
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10_000),
        sampler=SliceSampler(slice_len=60, as_sequences=True, seed=0),
        batch_size=600,
    )
    for batch in batches:
        trb.extend(batch.reshape(-1))
        rb.extend(batch.reshape(-1))
    with pytest.raises(RuntimeError, match="sufficient length"):
        trb.sample()
    ids = rb.sample()["collector", "traj_ids"]
    assert (ids == ids[:, :1]).all()


def test_sample_marks_in_plain_buffer():
    batch = _cartpole_batch(n_env=1, frames=200)
    trb = TReplayBuffer(
        storage=TStorage(1000),
        sampler=TSliceSampler(slice_len=8, end_key=("next", "done")),
        batch_size=32,
    )
    trb.extend(batch[0])
    assert not trb.sample()["next", "truncated"].reshape(4, 8)[:, -1].all()
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1000), sampler=SliceSampler(slice_len=8, seed=0), batch_size=32
    )
    rb.extend(batch[0])
    sample = rb.sample()
    assert sample["next", "truncated"].reshape(4, 8)[:, -1].all()
    assert sample["is_init"].reshape(4, 8)[:, 0].all() and "index" in sample.keys()


def test_explicit_end_key_does_not_switch_ids_off():
    td = ids_td([0] * 5 + [1] * 5)
    td["next", "done"] = torch.zeros(10, 1, dtype=torch.bool)  # flags that miss the boundary
    trb = TReplayBuffer(
        storage=TStorage(100),
        sampler=TSliceSampler(slice_len=3, end_key=("next", "done")),
        batch_size=30,
    )
    trb.extend(td)
    ids = trb.sample()["collector", "traj_ids"].reshape(10, 3)
    assert not (ids == ids[:, :1]).all()  # TorchRL's slices cross the id boundary
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=SliceSampler(slice_len=3, end_key=("next", "done"), as_sequences=True, seed=0),
        batch_size=30,
    )
    rb.extend(td)
    ids = rb.sample()["collector", "traj_ids"]
    assert (ids == ids[:, :1]).all()


def test_single_step_storage():
    step = _cartpole_batch(n_env=1, frames=10)[0][:1]
    kw = dict(num_slices=1, end_key=("next", "done"), strict_length=False)
    trb = TReplayBuffer(storage=TStorage(10), sampler=TSliceSampler(**kw), batch_size=1)
    trb.extend(step)
    with pytest.raises(IndexError):
        trb.sample()
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SliceSampler(seed=0, **kw), batch_size=1
    )
    rb.extend(step.exclude(("collector", "traj_ids")))
    assert rb.sample().batch_size == (1,)


def test_sampler_extras():
    batch = _cartpole_batch(n_env=2, frames=200)
    batch["hidden"] = torch.randn(2, 100, 3)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1000),
        sampler=SliceSampler(
            slice_len=4,
            burn_in=2,
            as_sequences=True,
            state_keys=["hidden"],
            weighting="transition",
            seed=0,
        ),
        batch_size=16,
    )
    rb.extend(batch)
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == (4, 6) and ("collector", "burn_in") in sample.keys(True)
    assert torch.equal(info["initial_state"]["hidden"], sample["hidden"][:, 0])


def test_tensordict_replay_buffer_marks_match():
    """The marks splice writes into every sample are those of TorchRL's TensorDictReplayBuffer."""
    from torchrl.data import TensorDictReplayBuffer

    batch = _cartpole_batch(n_env=1, frames=200)[0]
    trb = TensorDictReplayBuffer(
        storage=TStorage(1000),
        sampler=TSliceSampler(slice_len=8, end_key=("next", "done")),
        batch_size=32,
    )
    trb.extend(batch)
    sample = trb.sample()
    assert sample["next", "truncated"].reshape(4, 8)[:, -1].all()
    assert sample["is_init"].reshape(4, 8)[:, 0].all()


def test_default_weighting_is_per_trajectory():
    """A 4-step and a 100-step episode: TorchRL and splice's default pick each half the time;
    ``weighting="transition"`` picks by stored steps."""
    ids = torch.tensor([0] * 4 + [1] * 100)
    td = ids_td(ids.tolist())
    td["next", "done"] = torch.zeros(104, 1, dtype=torch.bool)
    td["next", "done"][[3, 103]] = True
    torch.manual_seed(0)
    trb = TReplayBuffer(
        storage=TStorage(200),
        sampler=TSliceSampler(slice_len=2, traj_key=("collector", "traj_ids")),
        batch_size=2000,
    )
    trb.extend(td)
    short = (trb.sample()["collector", "traj_ids"] == 0).float().mean()
    assert 0.4 < short < 0.6
    for weighting, low, high in [("trajectory", 0.4, 0.6), ("transition", 0.0, 0.07)]:
        rb = ReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=SliceSampler(slice_len=2, weighting=weighting, seed=0),
            batch_size=2000,
        )
        rb.extend(td)
        short = (rb.sample()["collector", "traj_ids"] == 0).float().mean()
        assert low < short < high, weighting


# --------------------------------------------------------------------------- value targets


def _two_trajectories(set_truncated: bool) -> TensorDict:
    """The "cat" layout: trajectory 4 cut after 3 steps, then trajectory 5 terminated."""
    cut = torch.tensor([False, False, True, False, False])
    ended = torch.tensor([False, False, False, False, True])
    flag = lambda x: x.unsqueeze(-1)  # noqa: E731
    return TensorDict(
        {
            ("next", "reward"): torch.ones(5, 1),
            ("next", "terminated"): flag(ended),
            ("next", "truncated"): flag(cut & set_truncated),
            ("next", "done"): flag(ended | (cut & set_truncated)),
            ("collector", "traj_ids"): torch.tensor([4, 4, 4, 5, 5]),
            ("collector", "cut"): cut,
        },
        batch_size=[5],
    )


def test_value_targets_stop_at_cuts_and_id_changes():
    from torchrl.objectives.value.functional import generalized_advantage_estimate

    value, next_value = torch.zeros(5, 1), torch.full((5, 1), 10.0)
    for set_truncated in (False, True):
        td = _two_trajectories(set_truncated)
        ours = splice.targets.gae(td, value, next_value, gamma=0.5, lmbda=1.0)[0]
        theirs = generalized_advantage_estimate(
            0.5, 1.0, value, next_value, td["next", "reward"], td["next", "done"],
            td["next", "terminated"],
        )[0]  # fmt: skip
        # splice: the cut step bootstraps (1 + 0.5 * 10 = 6), either way
        assert ours[2].item() == 6.0
        if set_truncated:
            assert torch.equal(ours, theirs)
        else:  # TorchRL runs on past the cut into trajectory 5
            assert theirs[2].item() != 6.0
            assert torch.equal(ours[3:], theirs[3:])


def test_value_targets_ignore_padding():
    from torchrl.objectives.value.functional import generalized_advantage_estimate

    td = _two_trajectories(False)[:3].unsqueeze(0)  # one fragment: cut after 3 steps
    padded = torch.cat([td, td[:, :1].clone().zero_()], 1)  # + 1 padding step
    padded["collector", "mask"] = torch.tensor([[True, True, True, False]])
    padded["next", "reward"][0, 3] = 100.0  # garbage on the padding
    value = torch.zeros(1, 4, 1)
    next_value = torch.tensor([[10.0, 10.0, 10.0, float("nan")]]).unsqueeze(-1)
    ours = splice.targets.gae(padded, value, next_value, gamma=0.5, lmbda=1.0)[0]
    theirs = generalized_advantage_estimate(
        0.5, 1.0, value, next_value.nan_to_num(), padded["next", "reward"],
        padded["next", "done"], padded["next", "terminated"],
    )[0]  # fmt: skip
    assert torch.equal(ours[0, :3].squeeze(-1), torch.tensor([10.5, 9.0, 6.0]))
    assert ours[0, 3].item() == 0.0
    assert theirs[0, 2].item() == 6.0 + 0.5 * 100.0  # the padding's reward leaked in


def test_vec_gae_fails_at_lambda_zero():
    from torchrl.objectives.value.functional import vec_generalized_advantage_estimate

    td = _two_trajectories(True)
    value, next_value = torch.zeros(5, 1), torch.full((5, 1), 10.0)
    with pytest.raises(IndexError, match="tuple index out of range"):
        vec_generalized_advantage_estimate(
            0.5, 0.0, value, next_value, td["next", "reward"], td["next", "done"],
            td["next", "terminated"],
        )  # fmt: skip
    ours = splice.targets.gae(td, value, next_value, gamma=0.5, lmbda=0.0)[0]
    assert torch.equal(ours.squeeze(-1), torch.tensor([6.0, 6.0, 6.0, 6.0, 1.0]))
