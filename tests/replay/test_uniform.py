"""``RandomSampler`` (``splice/replay/samplers/uniform.py``): uniform draws of live steps, with
replacement; ``replacement=False`` is TorchRL's dispatch to ``SamplerWithoutReplacement``."""

from __future__ import annotations

import numpy as np
import torch

from splice.replay import (
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
)


def test_draws_every_live_row_uniformly_and_no_other() -> None:
    """After the ring wrapped, draws land on the live rows only, each about equally often
    (a chi-square test of the counts, upper tail 1e-4, Wilson-Hilferty quantile)."""
    rb = ReplayBuffer(storage=LazyTensorStorage(50), sampler=RandomSampler(seed=0))
    rb.extend(torch.arange(70))  # 70 steps into 50 rows: values 20 .. 69 are live
    drawn = torch.cat([rb.sample(500) for _ in range(40)]).numpy()
    assert drawn.min() >= 20 and drawn.max() <= 69
    counts = np.bincount(drawn - 20, minlength=50)
    expected = drawn.size / 50
    stat = float(((counts - expected) ** 2 / expected).sum())
    df, c = 49, 2 / (9 * 49)
    assert stat < df * (1 - c + 3.719 * c**0.5) ** 3, stat


def test_replacement_false_is_a_sampler_without_replacement() -> None:
    sampler = RandomSampler(replacement=False, drop_last=True, shuffle=False)
    assert type(sampler) is SamplerWithoutReplacement
    assert (sampler.drop_last, sampler.shuffle) == (True, False)
    assert type(RandomSampler(replacement=True)) is RandomSampler
