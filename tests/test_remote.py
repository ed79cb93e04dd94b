"""``splice._remote``: the wire format of everything splice sends through Ray (no Ray
instance needed: ``pack``/``unpack`` are plain functions), and the exit-time registry."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice._remote import ActorRegistry, pack, unpack

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]


@st.composite
def tensordicts(draw: st.DrawFn) -> TensorDict:
    batch = draw(st.lists(st.integers(0, 3), min_size=0, max_size=2))
    entries: dict = {}
    for name in draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True)):
        dtype = draw(st.sampled_from(DTYPES))
        extra = draw(st.lists(st.integers(1, 3), max_size=2))
        values = torch.randint(0, 7, (*batch, *extra)).to(dtype)
        if draw(st.booleans()):
            entries[("next", name)] = values
        else:
            entries[name] = values
    return TensorDict(entries, batch_size=batch)


@settings(max_examples=60, deadline=None)
@given(tensordicts())
def test_pack_unpack_round_trip_is_exact_and_sends_no_tensor(td: TensorDict):
    wire = pack(td)

    def leaves(value):
        if isinstance(value, dict):
            for item in value.values():
                yield from leaves(item)
        elif isinstance(value, tuple):
            for item in value:
                yield from leaves(item)
        else:
            yield value

    assert not any(isinstance(leaf, torch.Tensor) for leaf in leaves(wire))  # numpy only
    back = unpack(wire)
    assert back.batch_size == td.batch_size
    assert set(back.keys(True, True)) == set(td.keys(True, True))
    for key, value in td.items(True, True):
        assert back[key].dtype == value.dtype and back[key].shape == value.shape
        assert torch.equal(back[key], value)


def test_unpack_gives_writable_tensors_that_share_nothing_with_the_wire():
    td = TensorDict({"x": torch.arange(4.0)}, [4])
    wire = pack(td)
    array = wire[2]["x"][1]
    assert np.shares_memory(array, td["x"].numpy())  # packing copies nothing
    array.flags.writeable = False  # as Ray returns it: a read-only view of its buffer
    back = unpack(wire)
    back["x"][0] = 100.0  # writable, and a copy
    assert array[0] == 0.0 and td["x"][0] == 0.0


def test_unpack_without_copy_uses_writable_arrays_and_copies_read_only_ones():
    td = TensorDict({"x": torch.arange(4.0), ("next", "y"): torch.zeros(4, 2)}, [4])
    wire = pack(td)
    wire[2]["x"][1].flags.writeable = False  # as Ray returns it
    back = unpack(wire, copy=False)
    assert back.batch_size == td.batch_size and set(back.keys(True, True)) == set(
        td.keys(True, True)
    )
    assert not np.shares_memory(back["x"].numpy(), td["x"].numpy())  # read-only: copied
    assert np.shares_memory(back["next", "y"].numpy(), td["next", "y"].numpy())  # as it is
    back["x"][0] = 100.0
    assert td["x"][0] == 0.0


def test_non_numpy_dtypes_and_plain_values_travel_as_they_are():
    value = {"w": torch.ones(2, dtype=torch.bfloat16), "n": 3, "s": "text", "l": [torch.ones(1)]}
    back = unpack(pack(value))
    assert back["w"].dtype == torch.bfloat16 and back["n"] == 3 and back["s"] == "text"
    assert torch.equal(back["l"][0], torch.ones(1))


def test_registry_ends_every_owner_once_and_survives_a_failing_one():
    ended = []

    class Owner:
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def end_actors(self, deadline: float) -> None:
            ended.append(self.name)
            if self.fail:
                raise RuntimeError("Ray is already shut down")

    registry = ActorRegistry(timeout=1.0)
    owners = [Owner("a", fail=True), Owner("b"), Owner("c")]
    for owner in owners:
        registry.add(owner)
    registry.discard(owners[2])
    registry.close_all()
    registry.close_all()  # nothing left to end
    assert sorted(ended) == ["a", "b"]
