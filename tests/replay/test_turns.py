"""``SamplesFirst``: a writer waits while samples are in flight, at most its patience.

Each test holds a "sample" in flight with an event, so what the writer does is decided by
the events, not by timing: a writer that must wait is shown still waiting after a pause (it
is blocked on a condition, so no amount of machine load lets it through early), and one
that must pass is given a generous bound.
"""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from splice.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
from splice.replay._turns import SamplesFirst

PATIENCE = 30.0  # the bound for what must happen (never reached unless broken)


def _hold_sample(turns: SamplesFirst) -> tuple[threading.Event, threading.Thread]:
    """A thread with one sample in flight until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def sample() -> None:
        with turns.sampling():
            started.set()
            release.wait(PATIENCE)

    thread = threading.Thread(target=sample)
    thread.start()
    assert started.wait(PATIENCE)
    return release, thread


def _writer(turns: SamplesFirst) -> tuple[threading.Event, threading.Thread]:
    passed = threading.Event()

    def write() -> None:
        turns.give_way()
        passed.set()

    thread = threading.Thread(target=write)
    thread.start()
    return passed, thread


def _join(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(PATIENCE)
        assert not thread.is_alive()


def test_nothing_in_flight_does_not_wait() -> None:
    turns = SamplesFirst(patience=PATIENCE)
    turns.give_way()  # would block for PATIENCE if it waited
    with turns.sampling():
        assert turns.in_flight == 1
    assert turns.in_flight == 0


def test_a_writer_waits_for_the_sample_in_flight() -> None:
    turns = SamplesFirst(patience=PATIENCE)
    release, sampler = _hold_sample(turns)
    passed, writer = _writer(turns)
    assert not passed.wait(0.2)  # blocked on the condition while the sample runs
    release.set()
    assert passed.wait(PATIENCE)
    _join(sampler, writer)
    assert turns.in_flight == 0


def test_a_writer_waits_until_no_sample_is_in_flight() -> None:
    turns = SamplesFirst(patience=PATIENCE)
    release_first, first = _hold_sample(turns)
    passed, writer = _writer(turns)
    release_second, second = _hold_sample(turns)  # started while the writer waits
    release_first.set()
    assert not passed.wait(0.2)  # the second sample is still in flight
    release_second.set()
    assert passed.wait(PATIENCE)
    _join(first, second, writer)


def test_the_wait_is_bounded_by_the_patience() -> None:
    """A thread that samples without pause delays a writer, never stops it."""
    turns = SamplesFirst(patience=0.05)
    release, sampler = _hold_sample(turns)
    passed, writer = _writer(turns)
    assert passed.wait(PATIENCE)  # gave up waiting; the sample is still in flight
    assert turns.in_flight == 1
    release.set()
    _join(sampler, writer)


def test_a_sample_that_raises_is_no_longer_in_flight() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=4))
    with pytest.raises(RuntimeError):
        rb.sample(8)  # nothing to draw from
    assert rb._turns.in_flight == 0


def test_extend_gives_way_to_a_sample_in_flight() -> None:
    """Through the buffer: an extend waits (before it flattens, and again before it takes the
    lock) while a sample is in flight, and rows written meanwhile are exactly the batch."""
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb._turns.patience = PATIENCE
    batch = TensorDict({"x": torch.arange(10)}, [10])
    release, sampler = _hold_sample(rb._turns)
    done: list[torch.Tensor] = []
    writer = threading.Thread(target=lambda: done.append(rb.extend(batch)))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive() and len(rb) == 0
    release.set()
    _join(sampler, writer)
    assert torch.equal(rb[done[0]]["x"], batch["x"])
