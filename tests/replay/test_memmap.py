"""Storages on a full disk (issue 11, defect 3): an ``OSError`` naming the file, the buffer
unchanged, never ``SIGBUS``.

The scenario runs on a real full filesystem: a 1 MiB tmpfs mounted in a private mount
namespace (``unshare --mount``, so that nothing is left mounted whatever happens), in a
subprocess, where a ``SIGBUS`` would show as the exit status instead of killing the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from splice.replay import LazyMemmapStorage, ReplayBuffer
from splice.testing import SyntheticStream

SCENARIO = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import torch

    from splice.replay import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, SliceSampler
    from splice.testing import SyntheticStream

    mnt = Path(sys.argv[1])
    out = {}


    def contents(rb):
        rows = torch.from_numpy(rb.index.live_rows())
        return [len(rb), rb.write_count, rb.storage.gather(rows)[("g",)].tolist()]


    # 1. The first extend needs more space than the disk has: allocating the columns fails
    #    (sparse files took the 12,000 steps, then died of SIGBUS writing them).
    rb = ReplayBuffer(storage=LazyMemmapStorage(20_000, scratch_dir=mnt / "big"))
    try:
        rb.extend(SyntheticStream(4, 10.0, labels=True).chunk(3000))
        out["big"] = "extended"
    except OSError as err:
        out["big"] = {
            "error": str(err),
            "filename": err.filename,
            "state": [len(rb), rb.write_count, rb.storage.schema is None],
            "files": sorted(p.name for p in (mnt / "big").iterdir()),
        }
    rb.storage.cleanup()

    # 2. A buffer that fits, then the disk fills up (another file takes the rest).
    path = mnt / "small"
    make = lambda: ReplayBuffer(
        storage=LazyMemmapStorage(1000, scratch_dir=path),
        sampler=SliceSampler(slice_len=4, seed=0),
        batch_size=8,
    )
    rb = make()
    stream = SyntheticStream(4, 10.0, seed=1, labels=True)
    for _ in range(3):
        rb.extend(stream.chunk(50))
    rb.dumps(mnt / "dump")
    before = contents(rb)
    with open(mnt / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError:
            pass
    errors = []
    for _ in range(4):  # each wraps the ring: the rows it would overwrite hold live data
        try:
            rb.extend(stream.chunk(75))
            errors.append(None)
        except OSError as err:
            errors.append([str(err), err.filename])
    try:
        rb.empty()
        errors.append(None)
    except OSError as err:
        errors.append([str(err), err.filename])
    try:
        rb.dumps(mnt / "dump")
        dumped = "dumped"
    except OSError as err:
        dumped = str(err)
    out["full"] = {
        "errors": errors,
        "unchanged": contents(rb) == before,
        "sample": rb.sample().batch_size[0],
        "dumps": dumped,
        "dump_dirs": sorted(p.name[:2] for p in (mnt / "dump").iterdir()),
    }
    copy = ReplayBuffer(
        storage=LazyTensorStorage(1000), sampler=SliceSampler(slice_len=4, seed=0), batch_size=8
    )
    copy.loads(mnt / "dump")  # the dump made before the disk filled up is intact
    out["dump_intact"] = contents(copy) == before
    (mnt / "filler").unlink()  # space again: everything works, the files reopen committed
    rb.extend(stream.chunk(75))
    after = contents(rb)
    del rb
    out["reopened"] = contents(make()) == after and after[1] == before[1] + 300
    print(json.dumps(out))
    """
)


def _run_on_a_small_tmpfs(tmp_path: Path) -> dict:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        pytest.skip("needs Linux and unshare(1) to mount a small tmpfs in a private namespace")
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs the tests as root)")
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs -o size=1m tmpfs "$1" && echo MOUNTED && exec "$2" "$3" "$1"',
            "sh",
            str(mnt),
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "MOUNTED" not in proc.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_full_disk_is_an_oserror_naming_the_file_never_sigbus(tmp_path: Path) -> None:
    out = _run_on_a_small_tmpfs(tmp_path)
    # The columns did not fit: OSError naming a column file, nothing allocated or left.
    big = out["big"]
    assert big != "extended"
    assert "No space left on device" in big["error"] and "/big/col_" in big["filename"]
    assert big["state"] == [0, 0, True]
    assert big["files"] == ["rows_key.bin", "rows_seq.bin"]
    # The disk filled up later: every extend (and empty) fails before changing anything,
    # naming the metadata file it could not write; the buffer still samples.
    full = out["full"]
    for error in full["errors"]:
        assert error is not None and "No space left on device" in error[0]
        assert error[1].endswith("meta.json.tmp")
    assert full["unchanged"] and full["sample"] == 8
    # dumps fails too, and keeps the previous dump (no half-written directory left).
    assert "No space left on device" in full["dumps"]
    assert full["dump_dirs"] == ["bu", "v-"]
    assert out["dump_intact"]
    # With space again the buffer extends, and reopens at its last commit.
    assert out["reopened"]


def test_memmap_files_are_preallocated(tmp_path: Path) -> None:
    """Every block of the files is reserved when they are created (no sparse file that a
    later write would have to fill on a full disk)."""
    rb = ReplayBuffer(storage=LazyMemmapStorage(50_000, scratch_dir=tmp_path / "mm"))
    rb.extend(SyntheticStream(2, 10.0).chunk(5))
    for path in (tmp_path / "mm").glob("*.bin"):
        size = path.stat().st_size
        assert path.stat().st_blocks * 512 >= size, path.name
