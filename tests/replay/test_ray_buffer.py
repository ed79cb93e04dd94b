"""``RayReplayBuffer`` on a local Ray instance (``ray_instance`` in tests/conftest.py): two
writers in two processes (this one and a Ray task holding a pickled handle) while this one
samples, the replay guarantees through the actor, errors, state, and the handle's ownership.
The collectors writing into it by object reference are tested in
tests/collectors/test_ray.py."""

from __future__ import annotations

import pytest
import torch

from splice import LazyTensorStorage, RayReplayBuffer, SliceSampler
from splice.layout import TRAJ_IDS
from splice.testing import SyntheticStream, assert_slices_contiguous

pytestmark = pytest.mark.timeout(180)


def test_actor_options_that_break_the_buffer_are_refused_before_any_actor_starts():
    # No Ray instance needed: the checks come first.
    for option in ("max_restarts", "max_task_retries"):
        with pytest.raises(ValueError, match=option):
            RayReplayBuffer(storage=LazyTensorStorage(10), actor_options={option: 1})
    with pytest.raises(TypeError, match="actor_options"):
        RayReplayBuffer(storage=LazyTensorStorage(10), actor_options=[("num_cpus", 1)])


def test_two_writers_and_a_sampler_keep_the_replay_guarantees(ray_instance):
    ray = ray_instance
    rb = RayReplayBuffer(
        storage=LazyTensorStorage(10_000),
        sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
        batch_size=32,
    )

    @ray.remote(num_cpus=0)
    def remote_writer(handle: RayReplayBuffer, chunks: int) -> str:
        # Another id range and other global steps: the two writers' data never coincide.
        stream = SyntheticStream(3, 6.0, seed=1, first_id=10**6, first_step=10**7, labels=True)
        for _ in range(chunks):
            rows = handle.extend(stream.chunk(20))
            assert rows.numel() == 60
        try:
            handle.shutdown()
        except RuntimeError as error:  # a copy does not own the actor
            return str(error)
        return "the copy shut the buffer down"

    with rb:
        writing = remote_writer.remote(rb, 10)
        local = SyntheticStream(2, 5.0, seed=0, labels=True)
        for _ in range(10):
            rows = rb.extend(local.chunk(25))
            assert rows.numel() == 50 and rows.dtype == torch.int64
            if len(rb) >= 100:
                sample = rb.sample()  # while the other process writes
                assert sample.batch_size == torch.Size([8, 4])
                assert_slices_contiguous(sample)
        assert "copy" in ray.get(writing)
        assert len(rb) == rb.write_count == 10 * 50 + 10 * 60
        seen_writers = set()
        for _ in range(20):
            sample = rb.sample()
            assert_slices_contiguous(sample)  # one episode's consecutive steps per slice
            writer = sample[TRAJ_IDS] >= 10**6
            assert bool((writer == writer[:, :1]).all()), "a slice mixes writers"
            seen_writers.update(writer[:, 0].tolist())
        assert seen_writers == {False, True}

        # Errors raised in the actor keep their type; the buffer is left unchanged.
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            rb.sample(batch_size=-3)
        with pytest.raises(TypeError, match="holds tensordict data"):
            rb.extend({"observation": torch.zeros(3)})
        assert len(rb) == rb.write_count == 1100

        state = rb.state_dict()
        rb.empty()
        assert len(rb) == 0
        rb.load_state_dict(state)
        assert len(rb) == rb.write_count == 1100
        assert_slices_contiguous(rb.sample())
    with pytest.raises(RuntimeError, match="shut down"):
        len(rb)
    rb.shutdown()  # idempotent
