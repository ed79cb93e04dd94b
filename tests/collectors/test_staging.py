"""Batches copied out of staging live in recycled memory blocks: a block is written again only
once nothing refers to any piece of the batch it held."""

from __future__ import annotations

import gc

import torch

from splice import Collector
from splice.testing import counting_vec, threshold_policy


def test_a_kept_piece_of_a_batch_is_never_overwritten():
    kwargs = {"frames_per_batch": 12, "total_frames": 12 * 8, "worker_id": 94}
    with Collector(counting_vec([3, 5]), threshold_policy, **kwargs) as c:
        reference = [b.clone() for b in c]
    with Collector(counting_vec([3, 5]), threshold_policy, **kwargs) as c:
        kept = []
        for k, batch in enumerate(c):
            # one tensor of each batch (an unsqueezed view, a nested key, a numpy view...);
            # the rest of the batch is dropped at once
            pieces = [
                batch["next", "reward"],
                batch["observation"][0],
                batch["collector", "traj_ids"].numpy(),
            ]
            kept.append(pieces[k % 3])
            del batch, pieces
            gc.collect()
    for k, (piece, ref) in enumerate(zip(kept, reference, strict=True)):
        want = [ref["next", "reward"], ref["observation"][0], ref["collector", "traj_ids"]][k % 3]
        assert torch.equal(torch.as_tensor(piece), want)


def test_a_dropped_batch_frees_its_block_for_the_next():
    with Collector(counting_vec([3, 5]), threshold_policy, frames_per_batch=12) as c:
        it = iter(c)
        first = next(it)
        address = first["observation"].data_ptr()
        kept_address = next(it)["observation"].data_ptr()  # first is held: a new block
        assert kept_address != address
        del first
        # the second batch was dropped at once too, so one of the two blocks is free again
        assert next(it)["observation"].data_ptr() in (address, kept_address)
