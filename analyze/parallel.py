"""How many threads run the detectors of one analysis (the pipeline's `jobs`).

Owns the rule for the default and the program's permission to use more than one.

Why threads: after `phases`, most detectors need only its result (a few also need `gaps`), and
their work is numpy passes over large arrays, which let go of the GIL; on two cores the detectors
of a 1 GB trace take ~0.65x the wall time in two threads (benchmarks/README.md). Results do not
depend on it: each detector reads the trace and the results it declared, and what they share
(Context.shared, the trace's views) is computed once under a lock.

Why only the program: glibc gives each new thread its own arena, whose freed blocks go back to
the kernel and fault in again, so threads gain little unless all of them allocate from the one
heap that keeps its freed blocks (analysis.allocator); that setting is the program's to make, not a
library's. So the default is one thread, except in the `tokentrace` process that set the
allocator (not in worker processes forked from it, which analyse traces side by side already).
"""

from __future__ import annotations

import os

JOBS_ENV = "TOKENTRACE_JOBS"
# More threads than this gain nothing measurable: after phases and gaps, three or four detectors
# at a time fill the longest chain (phases -> gaps -> launches), and each adds its temporaries
# to the peak memory.
MAX_DEFAULT_JOBS = 4

# Below this many events the program's default is one thread: the detectors of a smaller trace
# spend their time in Python (pandas' per-call work) under the GIL, and two threads were no
# faster at 0.6-0.75 M events (200 MB of JSON), 0.72x the wall time at 3.1 M (benchmarks/README.md).
AUTO_MIN_EVENTS = 1_500_000

_program_pid: int | None = None


def allow_threads() -> None:
    """Called by the `tokentrace` program once its allocator shares one heap among threads."""
    global _program_pid
    _program_pid = os.getpid()


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def jobs(requested: int | None = None, events: int = 0) -> int:
    """Threads for the detectors of a trace of `events` events: `requested` when given, else
    $TOKENTRACE_JOBS when it is a positive integer, else, in the program that allowed threads and
    for a trace of AUTO_MIN_EVENTS or more, up to MAX_DEFAULT_JOBS of this process's CPUs; else 1."""
    if requested is not None:
        return max(1, int(requested))
    env = os.environ.get(JOBS_ENV, "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if _program_pid is not None and _program_pid == os.getpid() and events >= AUTO_MIN_EVENTS:
        return max(1, min(MAX_DEFAULT_JOBS, cpus()))
    return 1
