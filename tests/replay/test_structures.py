"""The numpy containers behind the index and the samplers (``splice/replay/_structures.py``)
against plain-numpy references (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from splice.replay._structures import KeyMap, Pool


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(-3, 60), min_size=1, max_size=8)),
        min_size=1,
        max_size=30,
    )
)
def test_key_map_matches_a_dict(ops: list[tuple[bool, list[int]]]) -> None:
    m, ref = KeyMap(), {}
    value = 0
    for insert, keys in ops:
        q = np.unique(np.array(keys, dtype=np.int64))
        if insert:
            v = np.arange(value, value + q.size, dtype=np.int64)
            value += q.size
            m.assign(q, v)
            ref.update(zip(q.tolist(), v.tolist(), strict=True))
        else:
            m.remove(q)
            for k in q.tolist():
                ref.pop(k, None)
        probe = np.arange(-5, 65, dtype=np.int64)
        assert m.lookup(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
    big = np.array([np.iinfo(np.int64).max], dtype=np.int64)  # the sentinel's value
    assert m.lookup(big).tolist() == [-1]
    m.assign(big, np.array([7]))
    assert m.lookup(big).tolist() == [7]


def test_pool_scratch_column_absorbs_writes_to_id_minus_one() -> None:
    pool = Pool(("a", "b"), size=4)
    ids = pool.alloc(4)
    pool.data[0, ids] = [1, 2, 3, 4]
    pool.data[0][np.array([-1, 2])] = [99, 30]
    assert pool.a["a"].tolist() == [1, 2, 30, 4]  # id -1 wrote the scratch column only
    pool.alloc(3)  # grows: live ids keep their fields
    assert pool.a["a"][:4].tolist() == [1, 2, 30, 4]
    state = pool.state()
    other = Pool(("a", "b"))
    other.restore(state)
    assert other.a["a"][:4].tolist() == [1, 2, 30, 4] and other.size == pool.size
