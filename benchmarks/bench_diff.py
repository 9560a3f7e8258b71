"""First and repeat `diff` of two traces, each run in a fresh process with the caches in a temporary
folder (so the first run writes them and the next two read them). Prints wall and CPU seconds per
run, imports included (what a user's `tokentrace diff` costs). A benchmark, not a test.

    python3 benchmarks/bench_diff.py benchmarks/data/hf_1000.json benchmarks/data/serving_1000.json
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_RUN = r"""
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
from tokentrace.analysis.allocator import keep_freed_blocks
keep_freed_blocks()  # as the tokentrace program does when it starts
from tokentrace.analysis.compare.diff import diff
diff(sys.argv[1], sys.argv[2]).to_json()
print(f"{time.perf_counter() - t0:.2f} ({time.process_time() - c0:.2f})")
"""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="bench-diff-")
    env = dict(os.environ, TOKENTRACE_CACHE_DIR=folder)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # An installed package has its bytecode compiled (pip does it, or the first import): a
    # PYTHONDONTWRITEBYTECODE environment would make each fresh process compile tokentrace's
    # modules again (0.3 s on this VM), which no user's repeat run pays.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        for label in ("first", "repeat", "repeat"):
            out = subprocess.run([sys.executable, "-c", _RUN, *argv], env=env, capture_output=True, text=True)
            print(f"{label}: {out.stdout.strip() if out.returncode == 0 else 'failed: ' + out.stderr.strip()[-300:]} s wall (CPU)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
