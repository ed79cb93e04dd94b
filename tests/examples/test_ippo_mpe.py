"""The multi-agent example (splice.examples.ippo_mpe): its references, and that what the
collector stores per agent slot replays exactly in training (the log-probabilities PPO's
ratio starts from, recomputed from the stored recurrent states, equal the stored ones)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from splice import Collector
from splice.envs.pettingzoo import PettingZooEnvs
from splice.examples.ippo_mpe import IPPOConfig, make_env, reference_returns
from splice.examples.ppo import (
    LOG_PROB_KEY,
    STATE_KEY,
    TRAINING_KEYS,
    PPOPolicy,
    RecurrentActorCritic,
    add_advantages,
    training_sequences,
)
from splice.layout import ACTION, MASK, OBSERVATION

pytestmark = pytest.mark.timeout(120)


def test_the_heuristic_reference_beats_random_moves():
    refs = reference_returns(episodes=5)
    assert refs["heuristic"] > refs["random"] + 3


def test_stored_states_and_log_probs_replay_exactly_per_agent():
    torch.manual_seed(0)
    net = RecurrentActorCritic(18, 5, hidden=16)
    with torch.no_grad():
        net.actor.weight.normal_(0, 0.5)  # a policy far from uniform
    config = IPPOConfig(seq_len=10)
    with Collector(PettingZooEnvs(make_env, 2), PPOPolicy(net, seed=0), frames_per_batch=6 * 30,
                   total_frames=6 * 30 * 2, seed=0) as collector:  # fmt: skip
        for batch in collector:
            add_advantages(net, batch, config)
            seqs = training_sequences(batch.select(*TRAINING_KEYS), config.seq_len)
            logits, _, _ = net(seqs[OBSERVATION], seqs[STATE_KEY][:, 0])
            mask = seqs[MASK]
            log_prob = F.log_softmax(logits[mask], -1).gather(-1, seqs[ACTION][mask][:, None])
            np.testing.assert_allclose(
                log_prob.squeeze(-1).detach().numpy(), seqs[LOG_PROB_KEY][mask].numpy(), atol=1e-5
            )
