"""Samplers written by a user from the documented contract of ``splice.replay.Sampler`` alone:
the hooks, their call order, slices with the buffer's marks, priorities and saved state."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from splice.layout import TRAJ_IDS, TRUNCATED
from splice.replay import (
    Draw,
    LazyTensorStorage,
    ReplayBuffer,
    ReplayIndex,
    Sampler,
    SamplerState,
    SliceMarks,
    WriteReport,
)
from splice.testing import SyntheticStream, assert_slices_contiguous


@dataclass
class TailState(SamplerState):
    draws: int


class TailSlices(Sampler):
    """Slices of ``length`` steps ending at the newest stored step of random trajectories,
    among those that received data in the last write; records every hook call."""

    needs_trajectories = True
    state_type = TailState

    def __init__(self, length: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.length = length
        self.calls: list[str] = []
        self.recent = np.zeros(0, dtype=np.int64)
        self.draws = 0
        self.priorities: list[tuple[list[int], list[float]]] = []

    def check_batch_size(self, batch_size: int) -> None:
        super().check_batch_size(batch_size)
        if batch_size % self.length:
            raise ValueError(f"batch_size must be a multiple of {self.length}")

    def rebuild(self) -> None:
        self.calls.append("rebuild")
        self.recent = self.index.live_slots()

    def on_write(self, report: WriteReport) -> None:
        self.calls.append("on_write")
        self.recent = np.unique(report.touched_slots)

    def draw(self, batch_size: int) -> Draw:
        self.calls.append("draw")
        index = self.index
        slots = self.recent[self.randint(self.recent.size, batch_size // self.length)]
        traj = index.traj.a
        last_row = traj["last_row"][slots]
        stored = traj["last"][slots] - traj["first"][slots] + 1
        length = np.minimum(stored, self.length)
        self.draws += 1
        return Draw(rows=index.window_rows(last_row, 0, length, self.length), length=length)

    def update_priority(self, rows: np.ndarray, priority: np.ndarray) -> None:
        self.priorities.append((rows.tolist(), np.broadcast_to(priority, rows.shape).tolist()))

    @property
    def marks(self) -> SliceMarks:
        return SliceMarks(as_sequences=True)

    def state(self) -> TailState:
        base = super().state()
        return TailState(base.rng, base.ran_out, self.draws)

    def restore(self, state: SamplerState) -> None:
        assert isinstance(state, TailState)
        super().restore(state)
        self.draws = state.draws


def test_a_user_sampler_drives_the_buffer_through_the_documented_hooks() -> None:
    sampler = TailSlices(4, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(200), sampler=sampler, batch_size=12)
    assert sampler.calls == ["rebuild"] and isinstance(sampler.index, ReplayIndex)
    stream = SyntheticStream(3, 8.0, seed=1, labels=True)
    rb.extend(stream.chunk(10))
    rb.extend(stream.chunk(10))
    s = rb.sample()
    assert sampler.calls == ["rebuild", "on_write", "on_write", "draw"]
    # The buffer marks the slices as for its own slice samplers.
    assert s.batch_size == torch.Size([3, 4])
    assert_slices_contiguous(s)
    real = s["collector", "mask"]
    ends = real.sum(1) - 1
    assert bool(s[TRUNCATED][torch.arange(3), ends].all())
    assert all(int(s["g"][i, ends[i]]) >= 30 for i in range(3))  # ends in the newest chunk
    rb.update_priority(s["index"], 2.0)
    assert sampler.priorities == [(s["index"].tolist(), [[2.0] * 4] * 3)]
    with pytest.raises(ValueError, match="multiple of 4"):
        rb.sample(10)
    # empty() and load_state_dict() attach again (rebuild), then restore the saved state.
    state = rb.state_dict()
    rb.empty()
    assert sampler.calls[-1] == "rebuild" and sampler.recent.size == 0
    other_sampler = TailSlices(4, seed=5)
    other = ReplayBuffer(storage=LazyTensorStorage(200), sampler=other_sampler, batch_size=12)
    other.load_state_dict(state)
    assert other_sampler.draws == 1 and other_sampler.calls[-1] == "rebuild"
    assert other_sampler.recent.size > 0


class Newest(Sampler):
    """Single steps: the newest ``batch_size`` stored steps (the docstring's example)."""

    def draw(self, batch_size: int) -> Draw:
        index = self.index
        start = max(index.lo, index.write_count - batch_size)
        return Draw(rows=np.arange(start, index.write_count) % index.capacity)


def test_a_minimal_sampler_needs_only_draw() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=Newest(seed=0), batch_size=3)
    rb.extend(TensorDict({"x": torch.arange(7), TRAJ_IDS: torch.zeros(7, dtype=torch.long)}, [7]))
    assert rb.sample()["x"].tolist() == [4, 5, 6]
    with pytest.raises(ValueError, match="as_sequences needs a slice sampler"):
        rb.sample(as_sequences=True)
    with pytest.raises(ValueError, match="already belongs"):
        ReplayBuffer(sampler=rb.sampler)


def test_the_buffer_does_not_depend_on_private_sampler_or_storage_attributes() -> None:
    """The buffer reaches neither ``sampler._index`` nor ``storage._owner``: it uses the
    public ``attached`` / ``owner`` / ``claim`` / ``attach`` (grep guards a regression)."""
    import inspect

    from splice.replay import buffer

    source = inspect.getsource(buffer)
    for private in ("sampler._", "storage._", "isinstance(self.sampler", "import SliceSampler"):
        assert private not in source, private
