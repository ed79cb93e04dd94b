"""A hypothesis state machine drives a replay buffer through random valid and invalid operations
and checks it against a simple model after every step (issue 11).

The model is the list of the steps written since the last ``empty()``, in the order the buffer
stores them (each extend's real steps in the layout's order, a trajectory's steps made
consecutive: first appearance, time order kept); the live steps are its last ``capacity``
ones. Every step carries :class:`~splice.testing.SyntheticStream`'s counting labels (``g`` the
global step, ``ep`` its episode, ``t`` its step in the episode), so a lost, repeated, stale or
mixed step is visible in the data.

Operations (each machine picks a storage, memory or memory-mapped, and a sampler):

* ``extend`` in every layout: ``[B, T]``, flat ``[N]``, time-major flat (trajectories
  interleaved), padded ``[N, T]`` with a mask, "cat"; it returns the row of every input step;
* ``sample`` with every sampler (uniform, without replacement, prioritised, slice,
  slice without replacement, prioritised slice): every sampled step is live, its row holds it,
  slices are contiguous pieces of one episode, no row twice in an epoch without replacement;
* ``update_priority`` with the rows of a sample;
* ``dumps``/``loads`` and ``state_dict``/``load_state_dict`` into a fresh buffer: the same
  state, and the same next sample;
* reopening a memory-mapped directory; ``empty()``;
* invalid operations — a batch with a missing key, a wrong dtype, an id below -1, the wrong
  container; ``sample`` of a bad size or from an empty buffer; a priority that is NaN,
  negative or too large, or a row out of range; ``loads`` of a corrupted dump (a truncated
  column file, a made-up write count); ``load_state_dict`` of a tampered state dict; ``loads``
  into a buffer of another size — must raise the documented error and change nothing (the
  buffer's whole ``state_dict``, sampler state and generator included, compares equal).

``SPLICE_STATE_MACHINE_EXAMPLES`` sets the number of examples (default 30, CI-sized; the
reliability probe ran 400 x 30 steps: ``SPLICE_STATE_MACHINE_EXAMPLES=400``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tensordict import TensorDict, TensorDictBase

from splice import cat_trajectories, split_trajectories
from splice.layout import MASK, OBSERVATION, TRAJ_IDS, LayoutError
from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    Sampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.testing import SyntheticStream, assert_slices_contiguous

EXAMPLES = int(os.environ.get("SPLICE_STATE_MACHINE_EXAMPLES", "30"))
STEPS = 30
SLICE_LEN = 3
LAYOUTS = ["bt", "flat", "time-major", "padded", "cat"]


def make_sampler(kind: str, capacity: int, seed: int) -> Sampler:
    slices = dict(slice_len=SLICE_LEN, strict_length=False, as_sequences=True, seed=seed)
    if kind == "uniform":
        return RandomSampler(seed=seed)
    if kind == "without":
        return SamplerWithoutReplacement(seed=seed)
    if kind == "prioritized":
        return PrioritizedSampler(capacity, alpha=0.7, beta=0.5, seed=seed)
    if kind == "slice":
        return SliceSampler(**slices)  # type: ignore[arg-type]
    if kind == "slice-transition":
        return SliceSampler(weighting="transition", **slices)  # type: ignore[arg-type]
    if kind == "slice-without":
        return SliceSamplerWithoutReplacement(**slices)  # type: ignore[arg-type]
    assert kind == "prioritized-slice"
    return PrioritizedSliceSampler(alpha=0.7, beta=0.5, **slices)  # type: ignore[arg-type]


SAMPLER_KINDS = [
    "uniform",
    "without",
    "prioritized",
    "slice",
    "slice-transition",
    "slice-without",
    "prioritized-slice",
]
PRIORITIZED = {"prioritized", "prioritized-slice"}
SLICES = {"slice", "slice-transition", "slice-without", "prioritized-slice"}


def in_layout(batch: TensorDict, layout: str) -> TensorDictBase:
    """``batch`` (a ``[B, T]`` stream chunk) in ``layout``."""
    if layout == "flat":
        return batch.reshape(-1)
    if layout == "time-major":
        return batch.transpose(0, 1).reshape(-1)
    if layout == "padded":
        return split_trajectories(batch)
    if layout == "cat":
        return cat_trajectories(split_trajectories(batch))
    return batch


def storage_order(data: TensorDictBase) -> list[int]:
    """The ``g`` labels of ``data``'s real steps in the order a buffer stores them: the
    layout's order, then each episode's steps made consecutive (first appearance first)."""
    g, ep = data["g"], data["ep"]
    if MASK in data.keys(True):
        g, ep = g[data[MASK]], ep[data[MASK]]
    g, ep = g.reshape(-1).tolist(), ep.reshape(-1).tolist()
    first: dict[int, int] = {}
    for e in ep:
        first.setdefault(e, len(first))
    order = sorted(range(len(g)), key=lambda i: (first[ep[i]], i))
    return [g[i] for i in order]


class ReplayMachine(RuleBasedStateMachine):
    """See the module docstring. ``buffer_state`` and ``stored_steps`` are the fixtures of
    ``tests/replay/conftest.py``, set by the test."""

    buffer_state: Callable[[ReplayBuffer], Any]
    stored_steps: Callable[[ReplayBuffer], tuple[int, list[Any]]]

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="splice-state-machine-"))
        self.rb: ReplayBuffer | None = None
        self.written: list[int] = []  # g of every step since empty(), in storage order
        self.label: dict[int, tuple[int, int]] = {}  # g -> (ep, t) as given to extend
        self.epoch: set[int] = set()  # rows drawn in this epoch (without replacement)
        self.wrote_in_epoch = False  # written during the epoch: new rows wait for the next
        self.n_dirs = 0

    def teardown(self) -> None:
        self.rb = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ building
    def fresh_dir(self) -> Path:
        self.n_dirs += 1
        return self.tmp / f"d{self.n_dirs}"

    def build(self, *, capacity: int | None = None, scratch: Path | None = None) -> ReplayBuffer:
        cap = self.capacity if capacity is None else capacity
        storage = (
            LazyTensorStorage(cap)
            if self.storage_kind == "memory"
            else LazyMemmapStorage(cap, scratch_dir=scratch or self.fresh_dir())
        )
        sampler = make_sampler(self.sampler_kind, cap, self.seed)
        return ReplayBuffer(storage=storage, sampler=sampler, batch_size=2 * SLICE_LEN)

    @initialize(
        storage=st.sampled_from(["memory", "memmap"]),
        sampler=st.sampled_from(SAMPLER_KINDS),
        capacity=st.integers(4, 150),
        n_env=st.integers(1, 3),
        mean_len=st.sampled_from([1.5, 4.0, 12.0]),
        seed=st.integers(0, 2**16),
    )
    def start(
        self, storage: str, sampler: str, capacity: int, n_env: int, mean_len: float, seed: int
    ) -> None:
        self.storage_kind, self.sampler_kind = storage, sampler
        self.capacity, self.seed = capacity, seed
        self.stream = SyntheticStream(n_env, mean_len, seed=seed, labels=True)
        self.scratch = self.fresh_dir()
        self.rb = self.build(scratch=self.scratch)

    @property
    def buffer(self) -> ReplayBuffer:
        assert self.rb is not None
        return self.rb

    @property
    def live(self) -> list[int]:
        return self.written[-self.capacity :] if self.written else []

    def replace(self, other: ReplayBuffer, scratch: Path | None) -> None:
        """Continue with ``other`` (a restored copy); the old buffer's files go."""
        old = self.buffer
        self.rb = other
        if isinstance(old.storage, LazyMemmapStorage) and old.storage.scratch_dir != scratch:
            old.storage.cleanup()
        if scratch is not None:
            self.scratch = scratch

    def unchanged(self, action: Callable[[], object], error: type[Exception], match: str) -> None:
        """``action`` raises ``error`` (message matching ``match``) and changes nothing."""
        before = self.buffer_state(self.buffer)
        with pytest.raises(error, match=match):
            action()
        assert self.buffer_state(self.buffer) == before

    # ------------------------------------------------------------------ the model
    @invariant()
    def holds_what_the_model_says(self) -> None:
        if self.rb is None:
            return
        rb = self.rb
        live = self.live
        assert rb.write_count == len(self.written)
        assert len(rb) == len(live)
        rows = torch.from_numpy(rb.index.live_rows())
        if not live:
            assert rows.numel() == 0
            return
        stored = rb.storage.gather(rows)
        assert stored[("g",)].tolist() == live
        labels = list(zip(stored[("ep",)].tolist(), stored[("t",)].tolist(), strict=True))
        assert labels == [self.label[g] for g in live]

    # ------------------------------------------------------------------ valid operations
    @rule(chunks=st.lists(st.tuples(st.sampled_from(LAYOUTS), st.integers(1, 12)), max_size=3))
    def extend(self, chunks: list[tuple[str, int]]) -> None:
        for layout, steps in chunks:
            self.extend_one(layout, steps)

    def extend_one(self, layout: str, steps: int) -> None:
        batch = self.stream.chunk(steps)
        data = in_layout(batch, layout)
        order = storage_order(data)
        rows = self.buffer.extend(data)
        for g, e, t in zip(
            batch["g"].reshape(-1).tolist(),
            batch["ep"].reshape(-1).tolist(),
            batch["t"].reshape(-1).tolist(),
            strict=True,
        ):
            self.label[g] = (e, t)
        self.written.extend(order)
        self.wrote_in_epoch = True
        # The returned rows address the written steps (padding: -1).
        assert rows.shape == data.batch_size
        real = data[MASK] if MASK in data.keys(True) else torch.ones(rows.shape, dtype=torch.bool)
        assert bool((rows[~real] == -1).all()) and bool((rows[real] >= 0).all())
        live = set(self.live)
        kept = torch.tensor([g in live for g in data["g"][real].tolist()], dtype=torch.bool)
        if bool(kept.any()):
            at = self.buffer.storage.gather(rows[real][kept])[("g",)]
            assert at.tolist() == data["g"][real][kept].tolist()

    @precondition(lambda self: self.rb is not None and len(self.rb) > 0)
    @rule(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4))
    def sample(self, sizes: list[int]) -> None:
        for slices in sizes:
            self.draw(slices)

    def draw(self, slices: int) -> torch.Tensor:
        """Sample ``slices * SLICE_LEN`` steps, check the sample; return its index."""
        rb = self.buffer
        out, info = rb.sample(slices * SLICE_LEN, return_info=True)
        live = set(self.live)
        real = out[MASK] if MASK in out.keys(True) else torch.ones(out.batch_size, dtype=torch.bool)
        index = out["index"]
        assert bool((index[real] >= 0).all())
        assert set(out["g"][real].tolist()) <= live
        at = rb.storage.gather(index[real].reshape(-1))[("g",)]
        assert at.tolist() == out["g"][real].reshape(-1).tolist()
        if self.sampler_kind in SLICES:
            assert out.batch_dims == 2
            assert_slices_contiguous(out, live=live)
        self.track_epoch(rb, index)
        if self.sampler_kind in PRIORITIZED:
            assert np.isfinite(np.asarray(info["priority_weight"])).all()
        return index

    def track_epoch(self, rb: ReplayBuffer, index: torch.Tensor) -> None:
        """Without replacement: no row twice in a draw; in an epoch without writes, no row
        twice and every live row once. (Writes end an epoch early when the rest of it was
        overwritten, without ``ran_out``.)"""
        if self.sampler_kind != "without":
            return
        drawn = index.tolist()
        assert len(set(drawn)) == len(drawn)
        assert self.wrote_in_epoch or not (set(drawn) & self.epoch)
        self.epoch |= set(drawn)
        if rb.sampler.ran_out:
            if not self.wrote_in_epoch:
                assert self.epoch == set(rb.index.live_rows().tolist())
            self.new_epoch()

    def new_epoch(self) -> None:
        self.epoch, self.wrote_in_epoch = set(), False

    @precondition(lambda self: self.rb is not None and len(self.rb) > 0)
    @rule(scale=st.floats(0.01, 100.0), slices=st.integers(1, 3))
    def update_priority(self, scale: float, slices: int) -> None:
        rb = self.buffer
        index = self.draw(slices)
        priority = torch.rand(index.shape, dtype=torch.float64) * scale + 1e-3
        rb.update_priority(index, priority)
        for _ in range(2):
            self.draw(1)

    @rule(how=st.sampled_from(["dumps", "state_dict", "reopen", "empty"]))
    def persist(self, how: str) -> None:
        """Save and restore into a fresh buffer (same state, same next sample), reopen a
        memory-mapped directory, or empty the buffer."""
        if how == "reopen":
            self.reopen()
            return
        if how == "empty":
            self.buffer.empty()
            self.written = []
            self.new_epoch()
            return
        rb = self.buffer
        scratch = self.fresh_dir()
        copy = self.build(scratch=scratch)
        if how == "dumps":
            path = self.fresh_dir()
            rb.dumps(path)
            copy.loads(path)
        else:
            copy.load_state_dict(rb.state_dict())
        assert self.buffer_state(copy) == self.buffer_state(rb)
        drawn = None
        if len(rb) > 0:
            a, b = rb.sample(), copy.sample()
            assert torch.equal(a["index"], b["index"]) and torch.equal(a["g"], b["g"])
            drawn = b["index"]
        self.replace(copy, scratch)
        if drawn is not None:
            self.track_epoch(copy, drawn)  # the epoch goes on in the copy

    def reopen(self) -> None:
        """A memory-mapped directory reopens with the same contents (the sampler starts
        afresh: its state is not part of the files). A memory buffer: nothing to do."""
        if self.storage_kind != "memmap":
            return
        before = self.stored_steps(self.buffer)
        self.rb = None  # the old buffer and its maps go
        self.rb = self.build(scratch=self.scratch)
        assert self.stored_steps(self.rb) == before
        self.new_epoch()  # a fresh sampler

    # ------------------------------------------------------------------ invalid operations
    @rule(
        fault=st.sampled_from(
            [
                "extend: missing key",
                "extend: dtype",
                "extend: id below -1",
                "extend: tensor",
                "extend: list",
                "sample: size 0",
                "sample: negative size",
                "sample: size True",
                "sample: size 2.0",
                "sample: empty",
                "update_priority: nan",
                "update_priority: negative",
                "update_priority: huge",
                "update_priority: row out of range",
                "loads: truncated column",
                "loads: write count",
                "loads: other size",
                "load_state_dict: write count",
                "load_state_dict: generator",
                "load_state_dict: column dtype",
            ]
        ),
        layout=st.sampled_from(LAYOUTS),
    )
    def invalid(self, fault: str, layout: str) -> None:
        """An invalid operation raises the documented error and changes nothing."""
        what, _, how = fault.partition(": ")
        if what == "extend":
            self.extend_bad_batch(how, layout)
        elif what == "sample":
            self.sample_bad(how)
        elif what == "update_priority":
            self.update_priority_bad(how)
        elif what == "loads":
            self.loads_bad_dump(how)
        else:
            self.load_state_dict_bad(how)

    def extend_bad_batch(self, fault: str, layout: str) -> None:
        if self.buffer.storage.schema is None:
            return  # the first batch defines the keys
        stream = SyntheticStream(2, 3.0, seed=1, labels=True, first_id=10**9)
        data = in_layout(stream.chunk(4), layout)
        if fault == "missing key":
            self.unchanged(lambda: self.buffer.extend(data.exclude("t")), LayoutError, "t")
        elif fault == "dtype":
            data[OBSERVATION] = data[OBSERVATION].double()
            self.unchanged(lambda: self.buffer.extend(data), LayoutError, "observation")
        elif fault == "id below -1":
            ids = data[TRAJ_IDS].clone()
            ids.view(-1)[0] = -7
            data[TRAJ_IDS] = ids
            self.unchanged(lambda: self.buffer.extend(data), LayoutError, "below -1")
        elif fault == "tensor":
            self.unchanged(lambda: self.buffer.extend(torch.zeros(3)), TypeError, "tensor")
        else:
            self.unchanged(lambda: self.buffer.extend([1, 2]), TypeError, "list")  # type: ignore[arg-type]

    def sample_bad(self, fault: str) -> None:
        if fault == "empty":
            if len(self.buffer) == 0:
                self.unchanged(lambda: self.buffer.sample(), RuntimeError, "empty")
            return
        size: Any = {"size 0": 0, "negative size": -SLICE_LEN, "size True": True, "size 2.0": 2.0}[
            fault
        ]
        error = TypeError if isinstance(size, bool | float) else ValueError
        self.unchanged(lambda: self.buffer.sample(size), error, "batch_size")

    def update_priority_bad(self, fault: str) -> None:
        rows = torch.from_numpy(self.buffer.index.live_rows()[:3])
        if rows.numel() == 0:
            return
        prio = torch.ones(rows.shape, dtype=torch.float64)
        if fault == "row out of range":
            rows = rows.clone()
            rows[-1] = self.capacity + 5
            error: type[Exception] = IndexError
            match = "out of range"
        else:
            prio[-1] = {"nan": float("nan"), "negative": -1.0, "huge": 1e308}[fault]
            error, match = ValueError, "priorities must be finite"
        if self.sampler_kind not in PRIORITIZED:
            self.buffer.update_priority(rows, prio)  # ignored by the other samplers
            return
        if fault == "huge":  # refused if its weight could overflow the sums, else usable
            before = self.buffer_state(self.buffer)
            try:
                self.buffer.update_priority(rows, prio)
            except ValueError as err:
                assert "weight" in str(err) and self.buffer_state(self.buffer) == before
            for _ in range(3):
                self.draw(2)
            return
        self.unchanged(lambda: self.buffer.update_priority(rows, prio), error, match)

    def loads_bad_dump(self, fault: str) -> None:
        rb = self.buffer
        path = self.fresh_dir()
        if fault == "other size":
            self.build(capacity=self.capacity + 1, scratch=self.fresh_dir()).dumps(path)
            self.unchanged(lambda: rb.loads(path), ValueError, "capacity|max_size|size")
            return
        if rb.storage.schema is None and fault == "truncated column":
            return  # no column to truncate
        rb.dumps(path)
        doc = json.loads((path / "buffer.json").read_text())
        if fault == "truncated column":
            column = path / doc.get("data", "") / "storage" / "col_000.bin"
            column.write_bytes(column.read_bytes()[:5])
            match = r"col_000\.bin: expected \d+ bytes, found 5"
        else:
            doc["index"]["scalars"]["write_count"] = 10**15
            (path / "buffer.json").write_text(json.dumps(doc))
            match = r"buffer\.json: index\.lo: .* out of range"
        self.unchanged(lambda: rb.loads(path), ValueError, match)

    def load_state_dict_bad(self, fault: str) -> None:
        rb = self.buffer
        state = rb.state_dict()
        if fault == "write count":
            state["index"]["write_count"] = 10**15
            match = "write_count|lo"
        elif fault == "generator":
            state["sampler"]["rng"] = torch.zeros(3, dtype=torch.uint8)
            match = "rng"
        else:
            if not state["columns"]:
                return
            state["columns"][0] = state["columns"][0].double()
            match = "dtype"
        self.unchanged(lambda: rb.load_state_dict(state), ValueError, match)


@pytest.mark.timeout(900)
def test_a_buffer_under_random_valid_and_invalid_operations_matches_the_model(
    buffer_state, stored_steps
) -> None:
    ReplayMachine.buffer_state = staticmethod(buffer_state)  # type: ignore[assignment]
    ReplayMachine.stored_steps = staticmethod(stored_steps)  # type: ignore[assignment]
    run_state_machine_as_test(
        ReplayMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
