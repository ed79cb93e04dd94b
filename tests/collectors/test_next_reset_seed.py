"""TorchRL's iteration helpers: ``Collector.next()``, ``reset()`` and ``set_seed()``."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from splice import Collector, ReplayBuffer
from splice.layout import IS_INIT, TRAJ_IDS
from splice.testing import counting_vec


def test_next_continues_one_iteration_and_ends_with_none() -> None:
    c = Collector(counting_vec([3, 4]), frames_per_batch=10, total_frames=30, worker_id=80)
    batches = [c.next() for _ in range(4)]
    assert [b is None for b in batches] == [False, False, False, True]
    obs = torch.cat([b["observation"][:, :, 0] for b in batches if b is not None], 1)
    assert torch.equal(obs, torch.arange(15.0).expand(2, 15))  # consecutive steps, no repeat
    assert c.next() is None
    c.shutdown()


def test_reset_starts_new_episodes_and_drops_buffered_ones() -> None:
    # Env 0 plays 2-step episodes, env 1 a 40-step one; batches are 5 steps per env.
    c = Collector(counting_vec([2, 40]), frames_per_batch=10, trajs_per_batch=2, traj_format="cat")
    first = c.next()
    assert first is not None and first["observation"][:, 0].tolist() == [0, 1, 2, 3]
    # Env 0's third episode began at its step 4 and is still in flight (env 1's too).
    c.reset()
    after = c.next()
    assert after is not None
    # Without the reset the in-flight episode (first step 4) would come out first; the
    # envs restarted instead: the first episode begins at env 0's next step, 5.
    assert after["observation"][:2].tolist() == [[5.0, 0.0, 0.0], [6.0, 1.0, 0.0]]
    assert int(after[TRAJ_IDS].min()) > int(first[TRAJ_IDS].max())
    assert int(after[IS_INIT].sum()) == 2  # two whole episodes
    c.shutdown()


def test_set_seed_reproduces_the_data() -> None:
    c = Collector(gym.make_vec("CartPole-v1", num_envs=3), frames_per_batch=30)
    assert c.set_seed(11) == 13  # the last env's seed
    a = [c.next() for _ in range(2)]
    c.set_seed(11)
    b = [c.next() for _ in range(2)]
    for x, y in zip(a, b, strict=True):
        assert x is not None and y is not None
        assert torch.equal(x["observation"], y["observation"])
        assert torch.equal(x["action"], y["action"])
        assert not bool((x[TRAJ_IDS] == y[TRAJ_IDS]).any())  # new episodes, new ids
    with pytest.raises(TypeError, match="seed must be an int"):
        c.set_seed(1.5)  # type: ignore[arg-type]
    c.shutdown()


def test_random_actions_without_a_seed_follow_torchs_global_rng() -> None:
    # The env's own observations are not seeded here; the random actions are the collector's
    # stream and follow torch.manual_seed, at the first batch and after reset() alike.
    def actions() -> list[torch.Tensor]:
        torch.manual_seed(5)
        c = Collector(counting_vec([50]), frames_per_batch=20)
        first = c.next()
        c.reset()
        again = c.next()
        c.shutdown()
        assert first is not None and again is not None
        return [first["action"], again["action"]]

    a, b = actions(), actions()
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], a[1])  # the reset draws a new seed: a new stream
    torch.manual_seed(6)
    c = Collector(counting_vec([50]), frames_per_batch=20)
    other = c.next()
    c.shutdown()
    assert other is not None and not torch.equal(other["action"], a[0])
    # A collector that never acts at random leaves the global RNG alone.
    state = torch.get_rng_state()
    c = Collector(
        counting_vec([50]),
        lambda td: td.set("action", torch.zeros(1, dtype=torch.long)),
        frames_per_batch=20,
    )
    assert c.next() is not None
    c.shutdown()
    assert torch.equal(torch.get_rng_state(), state)


def test_reset_and_set_seed_refuse_while_collecting_in_the_background() -> None:
    rb = ReplayBuffer()
    c = Collector("CartPole-v1", frames_per_batch=10, total_frames=10_000, replay_buffer=rb)
    c.start()
    try:
        with pytest.raises(RuntimeError, match="background"):
            c.reset()
        with pytest.raises(RuntimeError, match="background"):
            c.set_seed(0)
        with pytest.raises(RuntimeError, match="background"):
            c.next()
    finally:
        c.shutdown()
