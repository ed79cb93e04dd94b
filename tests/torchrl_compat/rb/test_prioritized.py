"""TorchRL's ``test/rb/test_prioritized.py`` (pytorch/rl at 6e18e35b2, the 0.14.0 release), ported.

Ported: the two ``PrioritizedSampler`` tests whose behaviour splice has (new items get the
largest priority given so far, transformed by ``alpha`` once; ``alpha == 0`` keeps the raw
maximum), driven through a buffer instead of a standalone sampler. TorchRL-only (see
``inventory.py``): ``TensorDictPrioritizedReplayBuffer`` and ``priority_key``,
``max_priority_within_buffer``, changing ``alpha`` on a filled sampler, CUDA trees.
"""

from __future__ import annotations

import pytest
import torch

from splice.replay import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

from ..differences import BUFFER_DRIVEN


@pytest.mark.parametrize("alpha", [0.4, 0.7])
# Port: max_priority_within_buffer=True is TorchRL-only
@pytest.mark.parametrize("max_priority_within_buffer", [False])
@pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
def test_prb_new_item_gets_max_priority(alpha, max_priority_within_buffer):
    """A freshly added item with no priority key must be written to the sum-tree at
    the current max priority, transformed by ``alpha`` exactly once.

    This is PER's "new experience is sampled at least once" guarantee. Regression
    test for the double-``alpha`` transform in
    :meth:`~torchrl.data.replay_buffers.samplers.PrioritizedSampler.default_priority`,
    which wrote new items at ``((p + eps) ** alpha + eps) ** alpha`` and so
    systematically under-prioritized them for ``alpha < 1``.
    """
    sampler = PrioritizedSampler(
        max_capacity=10,
        alpha=alpha,
        beta=0.9,
    )
    # Port: a buffer writes the items (TorchRL: sampler.update_priority / mark_update)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    rb.extend(torch.zeros(1))
    # index 0 receives a large TD-error priority
    rb.update_priority(torch.tensor([0]), torch.tensor([100.0]))
    # index 1 is a fresh item written at the default (max) priority, as writers do
    rb.extend(torch.zeros(1))
    eps = sampler.eps
    expected = (100.0 + eps) ** alpha
    got = float(sampler.priority(torch.tensor([1]))[0])  # Port: sampler._sum_tree[1]
    assert got == pytest.approx(expected, rel=1e-4), (got, expected)
    # the new item is exactly as sample-able as the current max item
    assert got == pytest.approx(float(sampler.priority(torch.tensor([0]))[0]), rel=1e-4)


# Port: max_priority_within_buffer=True is TorchRL-only
@pytest.mark.parametrize("max_priority_within_buffer", [False])
@pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
def test_prb_alpha_zero_keeps_raw_max(max_priority_within_buffer):
    """With ``alpha == 0`` every tree entry is ``(p + eps) ** 0 == 1``, so the
    within-buffer recompute cannot recover raw priorities from the tree. It must
    keep the previously tracked raw max rather than store the transformed value
    (1.0) into ``_max_priority``."""
    sampler = PrioritizedSampler(
        max_capacity=5,
        alpha=0.0,
        beta=0.9,
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=sampler)  # Port: a buffer
    rb.extend(torch.zeros(2))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([100.0, 10.0]))
    # updating the tracked max index triggers the within-buffer recompute
    rb.update_priority(torch.tensor([0]), torch.tensor([50.0]))
    assert float(sampler.max_priority) == pytest.approx(100.0)  # Port: _max_priority[0]
    # Port: default_priority is the max priority in splice; a new step gets (100 + eps) ** 0
    rb.extend(torch.zeros(1))
    assert float(sampler.priority(torch.tensor([2]))[0]) == pytest.approx(1.0)
