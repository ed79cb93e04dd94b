"""The recurrent PPO example: its sequences, its targets, and a short run that learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splice import Collector, targets
from splice.examples.masked_cartpole import greedy_returns, make_masked_cartpole
from splice.examples.ppo import (
    STATE_KEY,
    PPOConfig,
    PPOPolicy,
    RecurrentActorCritic,
    add_advantages,
    train,
    training_sequences,
)
from splice.layout import IS_INIT, MASK, OBSERVATION, TRAJ_IDS
from splice.testing import synthetic_rollout


@settings(max_examples=40, deadline=None)
@given(
    n_env=st.integers(1, 4),
    n_steps=st.integers(1, 40),
    mean_len=st.sampled_from([1.0, 3.0, 10.0, 100.0]),
    seq_len=st.integers(1, 12),
    seed=st.integers(0, 10_000),
)
def test_sequences_hold_every_step_once_within_one_episode(
    n_env: int, n_steps: int, mean_len: float, seq_len: int, seed: int
) -> None:
    chunk = synthetic_rollout(n_env, n_steps, mean_len, seed=seed)
    chunk[STATE_KEY] = chunk[OBSERVATION][..., :1] * 10  # a "stored state" per step
    seqs = training_sequences(chunk, seq_len)
    mask = seqs[MASK]
    assert seqs.batch_size[1] == seq_len
    assert mask[:, 0].all()  # no empty sequence
    assert (mask[:, 1:] <= mask[:, :-1]).all()  # left-aligned
    step = seqs[OBSERVATION][..., 0]
    got = torch.sort(step[mask]).values
    assert torch.equal(got, torch.arange(n_env * n_steps, dtype=got.dtype))  # each step once
    ids = seqs[TRAJ_IDS]
    assert (ids[mask] == ids[:, :1].expand_as(ids)[mask]).all()  # one trajectory each
    # consecutive steps of one env, in time order
    gaps = (step[:, 1:] - step[:, :-1])[mask[:, 1:]]
    assert (gaps == 1).all()
    # the state to start from is the one stored at the sequence's first step
    assert torch.equal(seqs[STATE_KEY][:, 0, 0], step[:, 0] * 10)


def test_advantages_bootstrap_from_stored_states_on_real_chunks() -> None:
    """V(s) and V(s') from one LSTM step on the stored states equal a full replay of the
    trajectory from its first step, and GAE is what splice.targets computes from them."""
    torch.manual_seed(0)
    net = RecurrentActorCritic(2, 2, hidden=16, cell="lstm")
    config = PPOConfig(gamma=0.9, gae_lambda=0.8, reward_scale=1.0)
    collector = Collector(
        make_masked_cartpole(4),
        PPOPolicy(net, seed=0),
        frames_per_batch=4 * 30,
        total_frames=4 * 30 * 2,
        seed=0,
    )
    batch = list(collector)[-1]
    collector.shutdown()
    add_advantages(net, batch, config)
    with torch.no_grad():
        for b in range(4):  # replay each env row step by step, resetting at episode starts
            state = batch[STATE_KEY][b, :1]
            for t in range(30):
                if batch[IS_INIT][b, t]:
                    state = net.initial_state(1)
                _, value, state = net(batch[OBSERVATION][b, t].view(1, 1, 2), state)
                target_minus_adv = batch["value_target"][b, t] - batch["advantage"][b, t]
                torch.testing.assert_close(target_minus_adv, value[0], rtol=1e-4, atol=1e-4)
    obs = torch.cat([batch[OBSERVATION], batch["next", "observation"]]).flatten(0, 1)
    states = torch.cat([batch[STATE_KEY], batch["next", STATE_KEY]]).flatten(0, 1)
    with torch.no_grad():
        values = net(obs[:, None], states)[1].view(2, 4, 30)
    want = targets.gae(batch, values[0], values[1], gamma=0.9, lmbda=0.8)
    torch.testing.assert_close(batch["advantage"], want[0])


@pytest.mark.timeout(120)
def test_short_run_learns_well_above_a_random_policy() -> None:
    """A CI-sized run (~50k frames, well under a minute) beats random play by far."""
    config = PPOConfig(total_frames=49_152, eval_every=8_192, seed=0)
    result = train(config)
    rng = np.random.default_rng(0)
    random = greedy_returns(lambda obs: rng.integers(0, 2, len(obs)), 20, seed=999_000)
    assert result.frames >= 49_152 and result.updates > 0
    assert len(result.final_returns) == 20 and len(result.last_returns) == 20
    assert result.final_mean > max(100.0, 4 * random.mean()), (result.final_mean, random)
    assert result.collect_seconds > 0 and result.update_seconds > 0
    assert [p["frames"] for p in result.curve] == sorted(p["frames"] for p in result.curve)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        PPOConfig(seq_len=0)
    with pytest.raises(ValueError, match="cell must be"):
        RecurrentActorCritic(2, 2, cell="rnn")
