"""The `tokentrace` program keeps large freed blocks for reuse (glibc); the API and tests do not."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
from conftest import SAMPLE_TRACES

from tokentrace import cli
from tokentrace.analysis import allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Page faults taken by a second 64 MiB array after the first was freed (fresh process each).
_REFAULTS = r"""
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from tokentrace.analysis.allocator import keep_freed_blocks
    assert keep_freed_blocks()
a = np.ones(8 << 20)  # 64 MiB
del a
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(8 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _refaults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _REFAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="the allocator settings are glibc's")
def test_a_freed_large_block_is_reused_without_faulting_its_pages_again():
    # By default glibc unmaps a freed 64 MiB block (above its largest adaptive threshold, 32 MiB):
    # the next one faults in at least one page per 2 MiB (huge pages) or per 4 KiB.
    assert _refaults("default") >= 32
    # Kept: the second array reuses the first one's pages.
    assert _refaults("keep") < 8


def test_the_program_sets_the_allocator_and_runs_the_command(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "keep_freed_blocks", lambda: calls.append("keep") or True)
    monkeypatch.setattr(sys, "argv", ["tokentrace", "--version"])
    with pytest.raises(SystemExit) as exit_info:
        cli.run()
    assert exit_info.value.code == 0 and calls == ["keep"]


def test_the_python_api_leaves_the_allocator_alone():
    # A fresh process that analyses a trace through the API never reaches mallopt: the module
    # that calls it is not even imported.
    trace = next(iter(sorted(SAMPLE_TRACES.glob("gpu_*/*/*.pt.trace.json.gz"))), None)
    if trace is None:
        pytest.skip("no GPU sample traces")
    code = ("import sys, tokentrace; tokentrace.analyze(sys.argv[1], cache=False).to_json(); "
            "print('tokentrace.analysis.allocator' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# The same, with both arrays made and freed in a thread other than the main one.
_THREAD_REFAULTS = r"""
import resource, sys, threading
import numpy as np
if sys.argv[1] == "keep":
    from tokentrace.analysis.allocator import keep_freed_blocks
    assert keep_freed_blocks()
out = []
def work():
    a = np.ones(6 << 20)  # 48 MiB: within a thread arena's heap (64 MiB)
    del a
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.ones(6 << 20)
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    del b
    c = np.ones(8 << 20)  # 64 MiB: larger than such a heap
    del c
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    d = np.ones(8 << 20)
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
t = threading.Thread(target=work)
t.start()
t.join()
print(*out)
"""


@pytest.mark.skipif(not GLIBC, reason="the allocator settings are glibc's")
def test_a_thread_reuses_freed_large_blocks_too():
    # The detectors' threads (analysis.parallel) allocate from the heap that keeps freed blocks:
    # with an arena of its own, a thread's 64 MiB block is mapped for itself and unmapped when
    # freed, and the next one faults in again.
    def run(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", _THREAD_REFAULTS, mode], capture_output=True, text=True, check=True)
        return [int(x) for x in out.stdout.split()]

    assert run("default")[1] >= 32
    assert max(run("keep")) < 8
