"""The write path (``splice.replay._write.Writer``): a batch prepared outside the buffer's lock
is committed as if it had been prepared under it, whatever another writer committed between."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from splice.layout import TRAJ_IDS
from splice.replay import LazyTensorStorage, RandomSampler, Sampler, SliceSampler
from splice.replay._write import Writer
from splice.testing import SyntheticStream


def _writer(sampler: Sampler | None = None) -> Writer:
    sampler = sampler if sampler is not None else SliceSampler(slice_len=2)
    return Writer(LazyTensorStorage(100), sampler, owner=object(), batch_size=None)


def _flag_batches(count: int) -> list[TensorDict]:
    stream = SyntheticStream(2, 4.0, seed=3)
    return [stream.chunk(6).exclude(TRAJ_IDS) for _ in range(count)]  # end flags only


def test_a_batch_prepared_before_another_writers_commit_is_keyed_again() -> None:
    """``extend`` derives the trajectory keys before taking the lock; with end flags they
    continue the trajectories another writer may have committed meanwhile. The interleaving
    "prepare B, another writer extends C, write B" (what two threads can do) must index B as
    the in-order writes A, C, B do. (Drives the two halves of ``extend`` directly: the race
    itself is not reproducible.)"""
    a, b, c = _flag_batches(3)
    raced = _writer()
    raced.store(raced.prepare(a))
    prepared = raced.prepare(b)
    raced.store(raced.prepare(c))
    rows_b = raced.store(prepared)
    ordered = _writer()
    for batch in (a, c, b):
        rows = ordered.store(ordered.prepare(batch))
    assert torch.equal(rows_b, rows)
    for r in range(len(ordered.index)):
        assert raced.index.describe(r) == ordered.index.describe(r)


def test_a_batch_prepared_before_the_first_write_is_prepared_again() -> None:
    """A batch prepared against an empty buffer (no schema, no boundaries yet) commits after
    another writer's first write as if prepared after it; one that the first write made the
    wrong kind of container is refused then, with nothing written."""
    a, b = _flag_batches(2)
    raced = _writer()
    prepared = raced.prepare(b)
    raced.store(raced.prepare(a))
    rows_b = raced.store(prepared)
    ordered = _writer()
    for batch in (a, b):
        rows = ordered.store(ordered.prepare(batch))
    assert torch.equal(rows_b, rows)
    assert [raced.index.describe(r) for r in range(24)] == [
        ordered.index.describe(r) for r in range(24)
    ]
    writer = _writer(RandomSampler())
    tensor = writer.prepare(torch.arange(4.0))
    writer.store(writer.prepare({"x": torch.arange(4.0)}))
    with pytest.raises(TypeError, match="holds dict data; got a tensor"):
        writer.store(tensor)
    assert (len(writer.index), writer.index.write_count) == (4, 4)
