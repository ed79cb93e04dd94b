"""Replay windows: the steps before each slice's training steps (RNN burn-in, transformer
context) against a ground truth, both layouts, ``burn_in_keys``, every sampler and storage,
the attention-mask recipe, the cost of keyed reads, and bad input."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import attention_mask, split_trajectories
from splice.layout import MASK, TRAJ_IDS, LayoutError
from splice.replay import (
    BURN_IN,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    Storage,
)
from splice.testing import SyntheticStream

MEMORY_SHAPE = (2, 3)  # a per-step "memory" entry: e.g. 2 layers' activations of width 3


def memory_of(g: torch.Tensor) -> torch.Tensor:
    """The per-step memory entry stored with global step ``g`` (a policy's activations)."""
    layer = torch.arange(1, 1 + math.prod(MEMORY_SHAPE), dtype=torch.float32)
    return g.to(torch.float32)[..., None] * 1000 + layer.reshape(MEMORY_SHAPE).flatten()


@dataclass
class Truth:
    """What was written, step by step: the ground truth a window is checked against."""

    step_of: dict[int, tuple[int, int]] = field(default_factory=dict)  # g -> (episode, t)
    g_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (episode, t) -> g
    written: list[int] = field(default_factory=list)  # g, in write order

    def live(self, capacity: int) -> set[int]:
        return set(self.written[-capacity:])

    def record(self, batch: TensorDict) -> None:
        """Note the steps of a ``SyntheticStream`` chunk (labels on)."""
        for g, e, t in zip(
            batch["g"].reshape(-1).tolist(),
            batch["ep"].reshape(-1).tolist(),
            batch["t"].reshape(-1).tolist(),
            strict=True,
        ):
            self.step_of[g] = (e, t)
            self.g_of[(e, t)] = g


def make_sampler(kind: str, **kwargs: object) -> SliceSampler:
    if kind == "prioritized":
        return PrioritizedSliceSampler(alpha=0.7, beta=0.5, **kwargs)
    if kind == "without":
        return SliceSamplerWithoutReplacement(**kwargs)
    return SliceSampler(weighting=kind, **kwargs)


@contextmanager
def make_storage(kind: str, capacity: int) -> Iterator[Storage]:
    if kind == "memory":
        yield LazyTensorStorage(capacity)
        return
    with tempfile.TemporaryDirectory() as scratch:
        storage = LazyMemmapStorage(capacity, scratch_dir=scratch)
        yield storage


def fill(
    rb: ReplayBuffer, stream: SyntheticStream, chunk: int, n_chunks: int, layout: str, ids: bool
) -> Truth:
    """Extend ``rb`` with ``n_chunks`` chunks (a per-step ``"memory"`` entry added) and
    return the ground truth."""
    truth = Truth()
    for _ in range(n_chunks):
        batch = stream.chunk(chunk)
        batch["memory"] = memory_of(batch["g"])
        truth.record(batch)
        if layout == "flat":
            batch = batch.reshape(-1)
        elif layout == "padded":
            batch = split_trajectories(batch)
        if not ids:
            batch = batch.exclude(TRAJ_IDS)
        g = batch["g"][batch[MASK]] if layout == "padded" else batch["g"].reshape(-1)
        truth.written.extend(g.tolist())
        rb.extend(batch)
    return truth


def check_windows(
    sample: TensorDict,
    info: dict,
    truth: Truth,
    live: set[int],
    *,
    K: int,
    L: int,
    align: str,
    keys: list | None,
    strict: bool,
) -> None:
    """Every row against the ground truth: its context is the ``K`` steps before its first
    training step in the same episode, masked exactly where they precede the episode's start
    or are no longer stored; its training steps are the episode's next steps."""
    S, W = sample.shape
    assert W == K + L
    mask, burn, index = sample[MASK], sample[BURN_IN], sample["index"]
    # The first stored step of each episode (live steps of an episode are a suffix of it).
    first_live: dict[int, int] = {}
    for g in live:
        e, t = truth.step_of[g]
        first_live[e] = min(t, first_live.get(e, t))
    read_everywhere = keys is None
    for i in range(S):
        train = mask[i] & ~burn[i]
        cols = torch.nonzero(train).squeeze(1).tolist()
        assert cols == list(range(cols[0], cols[0] + len(cols))), f"row {i}: gaps {cols}"
        n_train = len(cols)
        assert 1 <= n_train <= L and (n_train == L or not strict)
        p0 = cols[0]
        e0, t0 = truth.step_of[int(sample["g"][i, p0])]
        b = min(K, t0 - first_live[e0])  # the stored steps of the episode before t0
        assert p0 == (K if align == "right" else b), f"row {i}: first training step at {p0}"
        assert int(info["burn_in"][i]) == b and int(info["length"][i]) == b + n_train
        ctx_cols = list(range(p0 - b, p0))
        real = set(ctx_cols) | set(cols)
        for c in range(W):
            assert bool(mask[i, c]) == (c in real), f"row {i} col {c}: mask"
            assert bool(burn[i, c]) == (c in ctx_cols), f"row {i} col {c}: burn-in flag"
            if c not in real:
                assert int(index[i, c]) == -1
        for c in ctx_cols + cols:
            e, t = e0, t0 - (p0 - c)  # the step this column must hold
            g = truth.g_of[(e, t)]
            assert g in live, f"row {i} col {c}: step {g} was overwritten"
            assert int(sample["g"][i, c]) == g, f"row {i} col {c}: {sample['g'][i, c]} != {g}"
            full = c >= p0 or read_everywhere
            if full or "memory" in keys:
                assert bool((sample["memory"][i, c] == memory_of(torch.tensor(g))).all())
            if full:
                assert (int(sample["ep"][i, c]), int(sample["t"][i, c])) == (e, t)
                assert float(sample["observation"][i, c, 0]) == g
                assert float(sample["next", "observation"][i, c, 0]) == g + 0.5
            else:  # keys not asked for are zero before the training steps
                assert int(sample["ep"][i, c]) == 0 and int(sample["t"][i, c]) == 0
                assert not bool(sample["observation"][i, c].any())
                if ("next",) in [tuple(k) if isinstance(k, tuple) else (k,) for k in keys]:
                    assert float(sample["next", "observation"][i, c, 0]) == g + 0.5


KEY_CHOICES = [None, ["g"], ["g", "memory"], ["g", "next"]]


@settings(max_examples=150, deadline=None)
@given(
    n_env=st.integers(1, 3),
    chunk=st.integers(1, 12),
    n_chunks=st.integers(1, 8),
    mean_len=st.sampled_from([1.5, 4.0, 15.0]),
    capacity=st.integers(4, 80),
    slice_len=st.integers(1, 6),
    K=st.integers(1, 7),
    strict=st.booleans(),
    kind=st.sampled_from(["trajectory", "transition", "prioritized", "without"]),
    align=st.sampled_from(["left", "right"]),
    keys=st.sampled_from(KEY_CHOICES),
    layout=st.sampled_from(["bt", "flat", "padded"]),
    ids=st.booleans(),
    storage=st.sampled_from(["memory", "memory", "memmap"]),
    obs_width=st.sampled_from([4, 16, 32]),
    seed=st.integers(0, 3),
)
def test_every_window_is_the_k_steps_before_the_slice_in_its_episode(
    n_env,
    chunk,
    n_chunks,
    mean_len,
    capacity,
    slice_len,
    K,
    strict,
    kind,
    align,
    keys,
    layout,
    ids,
    storage,
    obs_width,
    seed,
) -> None:
    """Random episode lengths, chunkings, layouts, storages (overwriting, wrap-around;
    observations of 16 and 32 floats are stored once with their next values; those of 32
    floats are read at the training steps only, the smaller keys with their neighbours),
    slice lengths and K: every window of every sampler holds exactly the ground truth."""
    if align == "right":
        capacity = max(capacity, K + slice_len)  # (longer windows are refused: tested below)
    if not ids:
        layout = "bt"  # without ids only a [B, T] batch says which steps continue which
    sampler = make_sampler(
        kind,
        slice_len=slice_len,
        burn_in=K,
        burn_in_align=align,
        burn_in_keys=keys,
        strict_length=strict,
        as_sequences=True,
        seed=seed,
    )
    with make_storage(storage, capacity) as store:
        rb = ReplayBuffer(storage=store, sampler=sampler, batch_size=slice_len * 3)
        stream = SyntheticStream(n_env, mean_len, seed=seed, labels=True, obs_shape=(obs_width,))
        truth = fill(rb, stream, chunk, n_chunks, layout, ids)
        live = truth.live(capacity)
        assert len(rb) == len(live)
        for _ in range(2):
            try:
                sample, info = rb.sample(return_info=True)
            except RuntimeError as err:
                assert strict and "no trajectory" in str(err)
                event("no slice long enough")
                return
            full = bool((info["burn_in"] == K).all())
            event(f"windows checked, contexts {'all full' if full else 'some cut short'}")
            check_windows(
                sample, info, truth, live, K=K, L=slice_len, align=align, keys=keys, strict=strict
            )
            # The flat output of the fixed layout is the same layout, flattened.
            if align == "right":
                flat, flat_info = rb.sample(return_info=True, as_sequences=False)
                n = flat_info["length"].numel()  # (3, or fewer at an epoch's end)
                assert flat.shape == (n * (K + slice_len),)
                check_windows(
                    flat.reshape(n, K + slice_len),
                    flat_info,
                    truth,
                    live,
                    K=K,
                    L=slice_len,
                    align=align,
                    keys=keys,
                    strict=strict,
                )


def _filled(sampler: SliceSampler, capacity: int = 400, **stream: object) -> ReplayBuffer:
    """A buffer of 3 envs x 120 steps (12-step episodes, a ``"memory"`` entry per step),
    drawing 8 slices."""
    batch_size = 8 * (sampler.slice_len or 1)
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=batch_size)
    s = SyntheticStream(3, 12.0, seed=1, labels=True, **stream)  # type: ignore[arg-type]
    for _ in range(6):
        batch = s.chunk(20)
        batch["memory"] = memory_of(batch["g"])
        rb.extend(batch)
    return rb


def test_left_alignment_is_todays_burn_in() -> None:
    """``burn_in=K`` (default ``"left"``) draws the same rows as before the layouts existed:
    the right-aligned rows of the same draw, shifted left by each row's missing steps."""
    left = _filled(SliceSampler(slice_len=8, burn_in=5, as_sequences=True, seed=3))
    right = _filled(
        SliceSampler(slice_len=8, burn_in=5, burn_in_align="right", as_sequences=True, seed=3)
    )
    for _ in range(3):
        a, ai = left.sample(return_info=True)
        b, bi = right.sample(return_info=True)
        assert torch.equal(ai["burn_in"], bi["burn_in"]) and torch.equal(ai["length"], bi["length"])
        for i in range(a.shape[0]):
            shift = 5 - int(ai["burn_in"][i])
            n = int(ai["length"][i])
            assert torch.equal(a["index"][i, :n], b["index"][i, shift : shift + n])
            assert torch.equal(a["g"][i, :n], b["g"][i, shift : shift + n])
            assert torch.equal(a[BURN_IN][i, :n], b[BURN_IN][i, shift : shift + n])


def test_state_keys_are_read_at_the_first_step_when_burn_in_keys_leave_them_out() -> None:
    rb = _filled(
        SliceSampler(
            slice_len=4,
            burn_in=6,
            burn_in_keys=["observation"],
            state_keys=["memory", "g"],
            as_sequences=True,
            seed=0,
        )
    )
    sample, info = rb.sample(return_info=True)
    first = info["index"][:, 0]
    assert bool((first >= 0).all())
    stored = rb.storage.gather(first)
    assert torch.equal(info["initial_state"]["g"], stored[("g",)])
    assert torch.equal(info["initial_state"]["memory"], stored[("memory",)])
    # ... while the sample itself has zeros there, where burn-in steps are (keys not read).
    burned = info["burn_in"] > 0
    assert bool(burned.any())
    assert not bool(sample["g"][burned, 0].any())


def test_burn_in_keys_read_only_those_keys_before_the_training_steps() -> None:
    """The cost of a window: a key not asked for is read at the training steps only
    (``num_slices * slice_len`` rows; keys of a few bytes per step are read with their
    neighbours and zeroed, which costs less than a second gather), the asked ones at every
    column."""

    class Counting(LazyTensorStorage):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.reads: dict[tuple[str, ...], int] = {}

        def gather(self, rows, keys=None):  # type: ignore[no-untyped-def]
            out = super().gather(rows, keys)
            for key in out:
                self.reads[key] = self.reads.get(key, 0) + rows.numel()
            return out

    S, K, L = 4, 16, 8
    storage = Counting(2000)
    sampler = SliceSampler(
        slice_len=L,
        burn_in=K,
        burn_in_align="right",
        burn_in_keys=["observation", "memory"],
        as_sequences=True,
        seed=0,
    )
    rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=S * L)
    stream = SyntheticStream(2, 200.0, seed=0, labels=True)
    batch = stream.chunk(400)
    batch["memory"] = memory_of(batch["g"])
    batch["pixels"] = torch.ones(2, 400, 8, 8)  # 256 bytes per step
    rb.extend(batch)
    storage.reads.clear()
    sample = rb.sample()
    assert storage.reads[("observation",)] == S * (K + L)
    assert storage.reads[("memory",)] == S * (K + L)
    assert storage.reads[("pixels",)] == S * L
    assert bool((sample["pixels"][:, K:] == 1).all()) and not bool(sample["pixels"][:, :K].any())
    for key in (("action",), ("g",), TRAJ_IDS):  # small: read with their neighbours ...
        assert storage.reads[key] == S * (K + L), key
        assert not bool(sample.get(key)[:, :K].any())  # ... and zero before the training steps


def test_attention_mask_recipe_gives_each_training_step_its_collection_window() -> None:
    """The documented recipe: one causal attention layer over a sample, masked with
    ``attention_mask(sample[MASK], window=K)``, gives every training step the output it had
    over its ground-truth window (itself and the K steps before it in its episode, as a
    policy with a context of K steps saw them at collection) — in both layouts."""
    K, L, D = 6, 5, 8
    torch.manual_seed(0)
    wq, wk, wv = (torch.randn(D, D) for _ in range(3))

    def embed(g: torch.Tensor) -> torch.Tensor:
        return torch.sin(g.to(torch.float32)[..., None] * torch.arange(1, D + 1) * 0.01)

    def attend(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            x @ wq, x @ wk, x @ wv, attn_mask=mask
        )

    for align in ("left", "right"):
        rb = _filled(
            SliceSampler(
                slice_len=L,
                burn_in=K,
                burn_in_align=align,
                burn_in_keys=["g"],
                strict_length=False,
                as_sequences=True,
                seed=1,
            ),
            capacity=150,  # overwritten episode starts: windows cut by the ring too
        )
        for _ in range(3):
            sample = rb.sample()
            valid = sample[MASK]
            out = attend(embed(sample["g"]), attention_mask(valid, window=K))
            train = valid & ~sample[BURN_IN]
            ids = rb.index
            for i, c in torch.nonzero(train).tolist():
                # Ground truth: the stored steps of the episode, the K before step c and c.
                row = int(sample["index"][i, c])
                before = min(K, int(ids.steps_before(np.array([row]))[0]))
                window_rows = ids.window_rows(np.array([row]), 0, np.array([before + 1]), K + 1)
                g = rb.storage.gather(torch.from_numpy(window_rows[0, : before + 1]))[("g",)]
                expected = attend(embed(g)[None], None)[0, -1]  # the last step's output
                assert torch.allclose(out[i, c], expected, atol=1e-5), (align, i, c)
            if align == "right":  # training outputs are a plain slice of columns
                assert bool(train[:, K:].any()) and not bool(train[:, :K].any())


def test_attention_mask() -> None:
    valid = torch.tensor([[True, True, True, False], [False, True, True, True]])
    m = attention_mask(valid)
    assert m.shape == (2, 4, 4)
    # Causal over real steps; a padding step attends to itself only.
    assert m[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    assert m[1].int().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]
    w = attention_mask(torch.ones(5, dtype=torch.bool), window=1)
    assert w.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert attention_mask(torch.ones(3, dtype=torch.bool), window=0).int().tolist() == [
        [1, 0, 0],
        [0, 1, 0],
        [0, 0, 1],
    ]
    ep = torch.tensor([[3, 3, 4, 4, 4]])
    e = attention_mask(torch.ones(1, 5, dtype=torch.bool), window=1, episode=ep)[0]
    assert e.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    # Softmax attention over it never gives NaN, padding rows included.
    x = torch.randn(2, 4, 3)
    out = torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=m)
    assert bool(torch.isfinite(out).all())
    with pytest.raises(TypeError, match="valid must be a bool tensor"):
        attention_mask(torch.ones(3))
    with pytest.raises(ValueError, match="time dim"):
        attention_mask(torch.tensor(True))
    with pytest.raises(ValueError, match="window must be a non-negative int"):
        attention_mask(valid, window=-1)
    with pytest.raises(TypeError, match="window must be an int"):
        attention_mask(valid, window=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="episode must be an integer tensor"):
        attention_mask(valid, episode=valid)
    with pytest.raises(ValueError, match="episode must have the shape of valid"):
        attention_mask(valid, episode=torch.zeros(4, dtype=torch.int64))


@pytest.mark.timeout(180)
def test_windows_through_a_ray_buffer(ray_instance) -> None:
    """The sample path runs in the buffer's actor: right-aligned keyed windows come back
    exactly as from a local buffer with the same seed and data."""
    from splice import RayReplayBuffer

    def sampler() -> SliceSampler:
        return PrioritizedSliceSampler(
            slice_len=6,
            burn_in=9,
            burn_in_align="right",
            burn_in_keys=["g", "memory"],
            strict_length=False,
            as_sequences=True,
            seed=5,
        )

    local = ReplayBuffer(storage=LazyTensorStorage(300), sampler=sampler(), batch_size=24)
    remote = RayReplayBuffer(storage=LazyTensorStorage(300), sampler=sampler(), batch_size=24)
    with remote:
        truth = Truth()
        stream = SyntheticStream(2, 15.0, seed=2, labels=True)
        for _ in range(12):
            batch = stream.chunk(17)
            batch["memory"] = memory_of(batch["g"])
            truth.record(batch)
            truth.written.extend(batch["g"].reshape(-1).tolist())
            local.extend(batch)
            remote.extend(batch)
        for _ in range(3):
            a, ai = local.sample(return_info=True)
            b, bi = remote.sample(return_info=True)
            assert (a == b).all() and torch.equal(ai["index"], bi["index"])
            check_windows(
                b,
                bi,
                truth,
                truth.live(300),
                K=9,
                L=6,
                align="right",
                keys=["g", "memory"],
                strict=False,
            )


def test_bad_input_is_refused_by_name_and_changes_nothing(buffer_state) -> None:
    with pytest.raises(ValueError, match="burn_in must be a non-negative int"):
        SliceSampler(slice_len=2, burn_in=-1)
    with pytest.raises(ValueError, match=r"burn_in_align='right' needs burn_in >= 1"):
        SliceSampler(slice_len=2, burn_in_align="right")
    with pytest.raises(ValueError, match="burn_in_keys needs burn_in >= 1"):
        SliceSampler(slice_len=2, burn_in_keys=["observation"])
    with pytest.raises(ValueError, match="burn_in_align must be one of"):
        SliceSampler(slice_len=2, burn_in=2, burn_in_align="centre")
    with pytest.raises(ValueError, match="burn_in_keys must name at least one key"):
        SliceSampler(slice_len=2, burn_in=2, burn_in_keys=[])
    with pytest.raises(TypeError, match="burn_in_keys must be a list of keys"):
        SliceSampler(slice_len=2, burn_in=2, burn_in_keys="observation")  # type: ignore
    with pytest.raises(TypeError, match="burn_in_keys: 3 is not a key"):
        SliceSampler(slice_len=2, burn_in=2, burn_in_keys=[3])  # type: ignore[list-item]
    for make in (SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler):
        with pytest.raises(ValueError, match="burn_in_keys needs burn_in >= 1"):
            make(slice_len=2, burn_in_keys=["observation"])

    # A window longer than the storage (fixed layout): refused when the buffer is built ...
    with pytest.raises(ValueError, match=r"burn_in=6 \+ slice_len=5 = 11 steps .* \(10 steps\)"):
        ReplayBuffer(
            storage=LazyTensorStorage(10),
            sampler=SliceSampler(slice_len=5, burn_in=6, burn_in_align="right"),
            batch_size=10,
        )
    # ... or when a sample asks for one, the buffer unchanged.
    sampler = SliceSampler(num_slices=2, burn_in=6, burn_in_align="right", seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=8)
    rb.extend(SyntheticStream(1, 20.0, seed=0, labels=True).chunk(10))
    before = buffer_state(rb)
    with pytest.raises(ValueError, match=r"burn_in=6 \+ slice_len=5 = 11 steps"):
        rb.sample(batch_size=10)
    assert buffer_state(rb) == before
    assert rb.sample().shape == (2 * 10,)  # flat, the layout kept: 2 x (6 + 4)
    assert rb.sample(as_sequences=True).shape == (2, 10)

    # Keys the data does not have: at the first sample, before anything is drawn.
    for keys, state, name in (
        (["observation", ("next", "memory")], [], "burn_in_keys"),
        (None, ["hidden"], "state_keys"),
    ):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(50),
            sampler=SliceSampler(
                slice_len=2, burn_in=3, burn_in_keys=keys, state_keys=state, seed=0
            ),
            batch_size=4,
        )
        rb.extend(SyntheticStream(1, 20.0, seed=0, labels=True).chunk(30))
        before = buffer_state(rb)
        with pytest.raises(LayoutError, match=rf"{name}: .* is not stored in the buffer"):
            rb.sample()
        assert buffer_state(rb) == before


def test_layout_settings_are_part_of_a_saved_buffers_configuration(tmp_path) -> None:
    """A buffer saved with a context layout loads only into one with the same; a default
    sampler's configuration is what it was before these settings existed."""
    assert set(SliceSampler(slice_len=2, burn_in=1).config()) == {
        "type",
        "num_slices",
        "slice_len",
        "weighting",
        "strict_length",
        "burn_in",
        "end_key",
        "traj_key",
    }

    def make(**kwargs: object) -> ReplayBuffer:
        sampler = SliceSampler(slice_len=2, burn_in=3, seed=0, **kwargs)  # type: ignore[arg-type]
        return ReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=4)

    rb = make(burn_in_align="right", burn_in_keys=["observation"])
    rb.extend(SyntheticStream(2, 9.0, seed=0, labels=True).chunk(15))
    rb.dumps(tmp_path / "saved")
    again = make(burn_in_align="right", burn_in_keys=["observation"])
    again.loads(tmp_path / "saved")
    assert torch.equal(rb.sample()["index"], again.sample()["index"])
    for other in (make(), make(burn_in_align="right"), make(burn_in_keys=["observation"])):
        with pytest.raises(ValueError, match="sampler"):
            other.loads(tmp_path / "saved")
