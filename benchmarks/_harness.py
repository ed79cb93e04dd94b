"""Timing, memory and reporting helpers shared by every benchmark.

Every benchmark measures splice, TorchRL and the raw limit *in the same process run* and
prints ratios: the machine is shared and noisy, so absolute figures are only indicative.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Timing:
    """Median and spread of repeated calls, in seconds."""

    median: float
    low: float
    high: float
    repeats: int

    def ms(self) -> str:
        return f"{self.median * 1e3:.2f} ms"


def time_call(fn: Callable[[], object], *, repeats: int = 7, warmup: int = 1) -> Timing:
    """Time ``fn`` ``repeats`` times after ``warmup`` calls; report the median."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), min(samples), max(samples), repeats)


def interleaved(
    contenders: dict[str, Callable[[], object]],
    *,
    rounds: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time several contenders round-robin so that machine noise hits them alike.

    ``clock``: wall time by default; ``time.process_time`` (CPU time of every thread of the
    process) leaves out the time other processes take from a busy machine.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            gc.collect()
            start = clock()
            fn()
            samples[name].append(clock() - start)
    return {
        name: Timing(statistics.median(s), min(s), max(s), rounds) for name, s in samples.items()
    }


def frames_per_second(
    runs: dict[str, tuple[Callable[[int], int], int]],
    *,
    rounds: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Frames/s of every contender, timed round-robin (:func:`interleaved`).

    Args:
        runs: name -> ``(run, frames)``, where ``run(frames)`` collects about that many frames
            and returns how many it did.
        rounds: timed rounds (median reported).
        clock: as for :func:`interleaved` (``time.process_time``: frames per CPU second).
    """
    done: dict[str, int] = {}

    def contender(name: str, run: Callable[[int], int], n: int) -> Callable[[], None]:
        def call() -> None:
            done[name] = run(n)

        return call

    timings = interleaved(
        {k: contender(k, r, n) for k, (r, n) in runs.items()}, rounds=rounds, clock=clock
    )
    return {k: done[k] / t.median for k, t in timings.items()}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, set up so that the resident set tracks live memory.

    By default glibc raises its mmap threshold after the first large frees and keeps freed
    blocks resident for reuse, so an allocation that reuses them never shows in VmHWM. A fixed
    64 KiB threshold returns every large block to the kernel when it is freed.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 64 * 1024)
    libc.mallopt(m_trim_threshold, 128 * 1024)
    return libc


def peak_extra_bytes(fn: Callable[[], object]) -> tuple[int, object]:
    """Peak resident memory added while ``fn`` runs (VmHWM - VmRSS, HWM reset first).

    tracemalloc cannot see torch allocations, so this reads the kernel's high-water mark
    (Linux with glibc). The output counts: it is part of what ``fn`` allocates.
    Returns ``(bytes, fn's result)``; keep the result alive to measure the output's share.
    """
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss_kib("VmRSS")
    result = fn()
    peak = _rss_kib("VmHWM")
    return (peak - before) * 1024, result


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain Markdown table (paste-able into docs and issue notes)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    lines = [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines.extend(fmt(r) for r in cells[1:])
    return "\n".join(lines)


def ratio(slow: float, fast: float) -> str:
    """``slow / fast`` formatted as ``12.3x``."""
    return f"{slow / fast:.1f}x" if fast > 0 else "inf"


def load() -> str:
    """The machine's load average, for the record next to timings."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def parser(description: str) -> argparse.ArgumentParser:
    """The common command line: ``--quick`` for a CI-sized run."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (CI smoke run)")
    return p
