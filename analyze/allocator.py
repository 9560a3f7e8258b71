"""The C allocator told to keep a run's large freed blocks for reuse (glibc only).

Owns `keep_freed_blocks()`, which the command line calls once when it starts (and the benchmark
scripts do, to measure what the command runs).

Why: glibc serves each block above its mmap threshold (128 KiB at first, raised by every such
block freed, but never past 32 MiB) from a mapping of its own, unmapped when the block is freed,
so the next block of that size is fresh memory the kernel faults in and zeroes, a page (or a
huge page) at a time. An analysis of a 1 GB trace makes and drops hundreds of 20-40 MB arrays
(a column of 3-4.5 M rows): on the development VM its detectors took ~80 k page faults, and
their time grew faster than the trace (train at 1 GB: phases 5-7x, shapes 7-8x their 200 MB
time). With the threshold at 1 GiB, a freed block stays in the heap (trimmed only above 2 GiB
free) and the next one reuses its pages: ~24 k faults, the detectors 7-18% faster at 1 GB (about
even at 200 MB), the peak RSS 1-6% higher (benchmarks/README.md).

Threads (the detectors run in a few, analysis.parallel): glibc gives each thread an arena of its
own, whose heaps are at most 64 MiB and give freed memory back to the kernel, so a thread's
large arrays would fault in afresh each time; with one arena every thread allocates from the
main heap that keeps its freed blocks (at 1 GB, two detector threads took 0.85 s of wall time
against 1.32 s with an arena per thread, and 0.2 GB less peak memory; benchmarks/README.md).
The contention is on malloc's lock, taken per array, not per element.

Only for a process that exits after its work (the `tokentrace` command): the settings stay for
the process's life (glibc cannot go back to its adaptive threshold), and a library changing
how its caller's allocator returns memory would be a side effect, so the Python API leaves the
allocator alone. Elsewhere (musl, macOS, Windows) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 1 << 30  # blocks below 1 GiB come from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # the largest value mallopt takes (an int): free heap kept up to 2 GiB


def keep_freed_blocks() -> bool:
    """Have glibc keep freed large blocks in the heap for reuse, and every thread allocate from
    that heap; False where it is not glibc (or refuses), leaving the allocator as it was."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return (bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            and bool(mallopt(M_ARENA_MAX, 1)))
