"""Property tests: for any episode lengths, batch size and autoreset mode, the data is the same
stream of steps, cut into full batches, with one id per episode."""

from __future__ import annotations

import torch
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

from splice import Collector
from splice.layout import CUT, DONE, IS_INIT, TRAJ_IDS
from splice.testing import counting_vec, threshold_policy

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    steps=st.integers(1, 12),
    n_batches=st.integers(1, 4),
    mode=st.sampled_from(MODES),
    max_len=st.one_of(st.none(), st.integers(1, 6)),
)
def test_stream_invariants(lengths, steps, n_batches, mode, max_len):
    b = len(lengths)
    kwargs = {"frames_per_batch": b * steps, "total_frames": b * steps * n_batches}
    with Collector(
        counting_vec(lengths, mode),
        threshold_policy,
        worker_id=80,
        max_frames_per_traj=max_len,
        **kwargs,
    ) as c:
        batches = list(c)
    with Collector(
        counting_vec(lengths), threshold_policy, worker_id=80, max_frames_per_traj=max_len, **kwargs
    ) as c:
        reference = list(c)  # NEXT_STEP
    assert len(batches) == n_batches
    for x, y in zip(batches, reference, strict=True):
        assert x.batch_size == torch.Size([b, steps])
        assert (x == y).all()  # every autoreset mode: the same data
        assert bool(x[CUT][:, -1].eq(~x[DONE][:, -1, 0]).all()) and not bool(x[CUT][:, :-1].any())
    data = torch.cat(batches, 1)
    obs = data["observation"]
    total = steps * n_batches
    assert torch.equal(obs[..., 0], torch.arange(total, dtype=torch.float32).expand(b, -1))
    done = data[DONE].squeeze(-1)
    init = data[IS_INIT].squeeze(-1)
    assert torch.equal(init[:, 1:], done[:, :-1]) and bool(init[:, 0].all())
    limit = (
        torch.tensor(lengths)[:, None]
        if max_len is None
        else torch.tensor(lengths).clamp(max=max_len)[:, None]
    )
    assert bool((obs[..., 1] < limit).all())  # no episode runs past its end
    ids = data[TRAJ_IDS]
    assert torch.equal(ids[:, 1:] != ids[:, :-1], init[:, 1:])  # a new id exactly at each start
    starts = ids[init]
    assert starts.unique().numel() == starts.numel()
