"""TorchRL's ``test/rb/test_rb_core.py`` (pytorch/rl at 6e18e35b2, the 0.14.0 release), ported.

Ported: ``TestBuffers`` for ``TensorDictReplayBuffer`` (splice's ``ReplayBuffer``) with the
lazy storages, ``TestRNG``, ``set_at_``/``set_``/``update_``, iteration and batch-size
errors. Imports changed; adaptations are marked ``torchrl_difference(..., adapted=True)``
and commented ``Port:``. TorchRL-only tests are listed in ``inventory.py``.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
)

from ..differences import (
    BUFFER_DRIVEN,
    LIST_STORAGE_OF_TENSORS,
    PRIVATE_STATE,
)

TensorDictReplayBuffer = ReplayBuffer
# TorchRL's _rb_common: buffers with their own generator (ReplayBuffer(generator=...)).
ReplayBufferRNG = functools.partial(ReplayBuffer, generator=torch.Generator())
TensorDictReplayBufferRNG = functools.partial(ReplayBuffer, generator=torch.Generator())


@pytest.mark.torchrl_difference(PRIVATE_STATE, adapted=True)
class TestRNG:
    def test_rb_rng(self):
        state = torch.random.get_rng_state()
        rb = ReplayBufferRNG(
            sampler=RandomSampler(), storage=LazyTensorStorage(100)
        )  # Port: delayed_init=False and rb.initialized (lazy init) dropped
        rb.extend(torch.arange(100))
        rb.sampler.generator.set_state(state)  # Port: rb._rng
        a = rb.sample(32)
        rb.sampler.generator.set_state(state)  # Port: rb._rng
        b = rb.sample(32)
        assert (a == b).all()
        c = rb.sample(32)
        assert (a != c).any()

    def test_prb_rng(self):
        state = torch.random.get_rng_state()
        rb = ReplayBuffer(
            sampler=PrioritizedSampler(100, 1.0, 1.0),
            storage=LazyTensorStorage(100),
            generator=torch.Generator(),
        )
        rb.extend(torch.arange(100))
        rb.update_priority(index=torch.arange(100), priority=torch.arange(1, 101))

        rb.sampler.generator.set_state(state)  # Port: rb._rng
        a = rb.sample(32)

        rb.sampler.generator.set_state(state)  # Port: rb._rng
        b = rb.sample(32)
        assert (a == b).all()

        c = rb.sample(32)
        assert (a != c).any()

    def test_slice_rng(self):
        state = torch.random.get_rng_state()
        rb = ReplayBuffer(
            sampler=SliceSampler(num_slices=4),
            storage=LazyTensorStorage(100),
            generator=torch.Generator(),
        )
        done = torch.zeros(100, 1, dtype=torch.bool)
        done[49] = 1
        done[-1] = 1
        data = TensorDict(
            {
                "data": torch.arange(100),
                ("next", "done"): done,
            },
            batch_size=[100],
        )
        rb.extend(data)

        rb.sampler.generator.set_state(state)  # Port: rb._rng
        a = rb.sample(32)

        rb.sampler.generator.set_state(state)  # Port: rb._rng
        b = rb.sample(32)
        assert (a == b).all()

        c = rb.sample(32)
        assert (a != c).any()

    def test_rng_state_dict(self):
        state = torch.random.get_rng_state()
        rb = ReplayBufferRNG(sampler=RandomSampler(), storage=LazyTensorStorage(100))
        rb.extend(torch.arange(100))
        rb.sampler.generator.set_state(state)  # Port: rb._rng
        sd = rb.state_dict()
        assert sd["sampler"].get("rng") is not None  # Port: sd.get("_rng")
        a = rb.sample(32)

        rb.load_state_dict(sd)
        b = rb.sample(32)
        assert (a == b).all()
        c = rb.sample(32)
        assert (a != c).any()

    def test_rng_dumps(self, tmpdir):
        state = torch.random.get_rng_state()
        rb = ReplayBufferRNG(sampler=RandomSampler(), storage=LazyTensorStorage(100))
        rb.extend(torch.arange(100))
        rb.sampler.generator.set_state(state)  # Port: rb._rng
        rb.dumps(tmpdir)
        a = rb.sample(32)

        rb.loads(tmpdir)
        b = rb.sample(32)
        assert (a == b).all()
        c = rb.sample(32)
        assert (a != c).any()


@pytest.mark.parametrize(
    "rbtype,storage",
    [
        # Port: the combinations with ListStorage (and list data), PrioritizedReplayBuffer
        # and TensorDictPrioritizedReplayBuffer are TorchRL-only (inventory.py).
        (TensorDictReplayBuffer, None),
        (TensorDictReplayBuffer, LazyTensorStorage),
        (TensorDictReplayBuffer, LazyMemmapStorage),
        (TensorDictReplayBufferRNG, None),
        (TensorDictReplayBufferRNG, LazyTensorStorage),
        (TensorDictReplayBufferRNG, LazyMemmapStorage),
    ],
)
@pytest.mark.parametrize("size", [3, 5, 100])
@pytest.mark.parametrize("prefetch", [0])
class TestBuffers:
    default_constr = {
        TensorDictReplayBuffer: TensorDictReplayBuffer,
        TensorDictReplayBufferRNG: TensorDictReplayBufferRNG,
    }

    def _get_rb(self, rbtype, size, storage, prefetch):
        if storage is not None:
            storage = storage(size)
        rb = self.default_constr[rbtype](
            storage=storage,
            batch_size=3,  # Port: prefetch=prefetch (0) dropped
        )
        return rb

    def _get_datum(self, rbtype):
        # Port: the branches of TorchRL-only buffer types removed
        if rbtype in (TensorDictReplayBuffer, TensorDictReplayBufferRNG):
            data = TensorDict({"a": torch.randint(100, (1,))}, [])
        else:
            raise NotImplementedError(rbtype)
        return data

    def _get_data(self, rbtype, size):
        # Port: the branches of TorchRL-only buffer types removed
        if rbtype in (TensorDictReplayBuffer, TensorDictReplayBufferRNG):
            data = TensorDict(
                {
                    "a": torch.randint(100, (size,)),
                    "b": TensorDict({"c": torch.randint(100, (size,))}, [size]),
                },
                [size],
            )
        else:
            raise NotImplementedError(rbtype)
        return data

    @pytest.mark.torchrl_difference(PRIVATE_STATE)
    def test_cursor_position2(self, rbtype, storage, size, prefetch):
        torch.manual_seed(0)
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        batch1 = self._get_data(rbtype, size=5)
        cond = False  # Port: OLD_TORCH (torch < 2.0) is False
        with (
            pytest.warns(
                UserWarning,
                match="A cursor of length superior to the storage capacity was provided",
            )
            if cond
            else contextlib.nullcontext()
        ):
            rb.extend(batch1)

        # Added fewer data than storage max size
        if size > 5 or storage is None:
            assert rb.writer._cursor == 5
        # Added more data than storage max size
        elif size < 5:
            assert rb.writer._cursor == 5 - size
        # Added as data as storage max size
        else:
            assert rb.writer._cursor == 0
            batch2 = self._get_data(rbtype, size=size - 1)
            rb.extend(batch2)
            assert rb.writer._cursor == size - 1

    def test_add(self, rbtype, storage, size, prefetch):
        torch.manual_seed(0)
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        data = self._get_datum(rbtype)
        rb.add(data)
        s = rb.sample(1)[0]
        if isinstance(s, TensorDictBase):
            s = s.select(*data.keys(True), strict=False)
            data = data.select(*s.keys(True), strict=False)
            assert (s == data).all()
            assert list(s.keys(True, True))
        else:
            assert (s == data).all()

    def test_empty(self, rbtype, storage, size, prefetch):
        torch.manual_seed(0)
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        data = self._get_datum(rbtype)
        for _ in range(2):
            rb.add(data)
            s = rb.sample(1)[0]
            if isinstance(s, TensorDictBase):
                s = s.select(*data.keys(True), strict=False)
                data = data.select(*s.keys(True), strict=False)
                assert (s == data).all()
                assert list(s.keys(True, True))
            else:
                assert (s == data).all()
            rb.empty()
            with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
                rb.sample()

    @pytest.mark.torchrl_difference(BUFFER_DRIVEN, adapted=True)
    def test_extend(self, rbtype, storage, size, prefetch):
        torch.manual_seed(0)
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        data = self._get_data(rbtype, size=5)
        cond = False  # Port: OLD_TORCH (torch < 2.0) is False
        with (
            pytest.warns(
                UserWarning,
                match="A cursor of length superior to the storage capacity was provided",
            )
            if cond
            else contextlib.nullcontext()
        ):
            rb.extend(data)
        length = len(rb)
        for d in data[-length:]:
            for b in rb[:]:  # Port: iterating rb.storage
                if isinstance(b, TensorDictBase):
                    keys = set(d.keys()).intersection(b.keys())
                    b = b.exclude("index").select(*keys, strict=False)
                    keys = set(d.keys()).intersection(b.keys())
                    d = d.select(*keys, strict=False)

                value = b == d
                if isinstance(value, (torch.Tensor, TensorDictBase)):
                    value = value.all()
                if value:
                    break
            else:
                raise RuntimeError("did not find match")

    def test_sample(self, rbtype, storage, size, prefetch):
        torch.manual_seed(0)
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        data = self._get_data(rbtype, size=5)
        cond = False  # Port: OLD_TORCH (torch < 2.0) is False
        with (
            pytest.warns(
                UserWarning,
                match="A cursor of length superior to the storage capacity was provided",
            )
            if cond
            else contextlib.nullcontext()
        ):
            rb.extend(data)
        new_data = rb.sample()
        if not isinstance(new_data, (torch.Tensor, TensorDictBase)):
            new_data = new_data[0]

        for d in new_data:
            for b in data:
                if isinstance(b, TensorDictBase):
                    keys = set(d.keys()).intersection(b.keys())
                    b = b.exclude("index").select(*keys, strict=False)
                    keys = set(d.keys()).intersection(b.keys())
                    d = d.select(*keys, strict=False)

                value = b == d
                if isinstance(value, (torch.Tensor, TensorDictBase)):
                    value = value.all()
                if value:
                    break
            else:
                raise RuntimeError("did not find matching value")

    @pytest.mark.torchrl_difference(BUFFER_DRIVEN)
    def test_index(self, rbtype, storage, size, prefetch):
        torch.manual_seed(0)
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        data = self._get_data(rbtype, size=5)
        cond = False  # Port: OLD_TORCH (torch < 2.0) is False
        with (
            pytest.warns(
                UserWarning,
                match="A cursor of length superior to the storage capacity was provided",
            )
            if cond
            else contextlib.nullcontext()
        ):
            rb.extend(data)
        d1 = rb[2]
        d2 = rb.storage[2]
        if type(d1) is not type(d2):
            d1 = d1[0]
        b = d1 == d2
        if not isinstance(b, bool):
            b = b.all()
        assert b

    def test_index_nonfull(self, rbtype, storage, size, prefetch):
        # checks that indexing the buffer before it's full gives the accurate view of the data
        rb = self._get_rb(rbtype, storage=storage, size=size, prefetch=prefetch)
        data = self._get_data(rbtype, size=size - 1)
        rb.extend(data)
        assert len(rb[: size - 1]) == size - 1
        assert len(rb[size - 2 :]) == 1


def test_replay_buffer_set_at_():
    """Tests that set_at_ writes through to storage in-place."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        batch_size=5,
    )
    data = TensorDict({"a": torch.zeros(10), "b": torch.ones(10)}, batch_size=[10])
    rb.extend(data)
    # Modify key "a" at indices [2, 5]
    rb.set_at_("a", torch.tensor([99.0, 99.0]), torch.tensor([2, 5]))
    assert rb["a"][2] == 99.0
    assert rb["a"][5] == 99.0
    assert rb["a"][0] == 0.0  # unchanged
    assert rb["b"][2] == 1.0  # other key unchanged


def test_replay_buffer_set_():
    """Tests that set_ writes through to storage in-place."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        batch_size=5,
    )
    data = TensorDict({"a": torch.zeros(10), "b": torch.ones(10)}, batch_size=[10])
    rb.extend(data)
    rb.set_("a", torch.full((10,), 42.0))
    assert (rb["a"] == 42.0).all()
    assert (rb["b"] == 1.0).all()  # other key unchanged


def test_replay_buffer_update_():
    """Tests that update_ writes through to storage in-place."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        batch_size=5,
    )
    data = TensorDict({"a": torch.zeros(10), "b": torch.ones(10)}, batch_size=[10])
    rb.extend(data)
    update = TensorDict(
        {"a": torch.full((10,), 7.0), "b": torch.full((10,), 8.0)},
        batch_size=[10],
    )
    rb.update_(update)
    assert (rb["a"] == 7.0).all()
    assert (rb["b"] == 8.0).all()


@pytest.mark.torchrl_difference(LIST_STORAGE_OF_TENSORS, adapted=True)
def test_multi_loops():
    """Tests that one can iterate multiple times over a buffer without rep."""
    rb = ReplayBuffer(
        batch_size=5, storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement()
    )
    rb.extend(torch.zeros(10))
    for i, d in enumerate(rb):  # noqa: B007
        assert (d == 0).all()
    assert i == 1
    for i, d in enumerate(rb):  # noqa: B007
        assert (d == 0).all()
    assert i == 1


@pytest.mark.torchrl_difference(LIST_STORAGE_OF_TENSORS, adapted=True)
def test_batch_errors():
    """Tests error messages related to batch-size"""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(drop_last=False)
    )
    rb.extend(torch.zeros(10))
    rb.sample(3)  # that works
    with pytest.raises(
        RuntimeError,
        match="Cannot iterate over the replay buffer. Batch_size was not specified",
    ):
        for _ in rb:
            pass
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.sample()
    with pytest.raises(ValueError, match="Samplers with drop_last=True"):
        ReplayBuffer(
            storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(drop_last=True)
        )
    # that works
    ReplayBuffer(
        storage=LazyTensorStorage(10),
    )
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=SamplerWithoutReplacement(drop_last=False),
        batch_size=3,
    )
    rb.extend(torch.zeros(10))
    for _ in rb:
        pass
    rb.sample()


@pytest.mark.parametrize("size", [10, 15, 20])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.torchrl_difference(LIST_STORAGE_OF_TENSORS, adapted=True)
def test_replay_buffer_iter(size, drop_last):
    torch.manual_seed(0)
    storage = LazyTensorStorage(size)  # Port: ListStorage(size)
    sampler = SamplerWithoutReplacement(drop_last=drop_last)
    # Port: writer=RoundRobinWriter() (splice's only write policy) dropped

    rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=3)
    rb.extend(torch.stack([torch.randint(100, (1,)) for _ in range(size)]))  # Port: a list

    for i, _ in enumerate(rb):
        if i == 20:
            # guard against infinite loop if error is introduced
            raise RuntimeError("Iteration didn't terminate")

    if drop_last:
        assert i == size // 3 - 1
    else:
        assert i == (size - 1) // 3
