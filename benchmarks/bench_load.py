"""Time and measure memory of loading one trace three ways, in the same run, on the same file.

- tokentrace: `tokentrace.load(path)` (the whole Trace: typed columns, sort, link columns);
- hta: Holistic Trace Analysis' `TraceAnalysis(trace_dir=...)` on a folder holding only this file
  (needs the `hta` extra);
- naive: `json.load` and `pandas.DataFrame(traceEvents)`, what a notebook would do.

Each runs in its own subprocess, so its peak RSS (getrusage ru_maxrss of that process, which
includes the interpreter and libraries: reported too, as `baseline`) is its own. The load time
excludes imports. Results print as a table and, with --json, are written as JSON.

    python3 benchmarks/bench_load.py --file benchmarks/data/large.json
    python3 benchmarks/bench_load.py --file ../shared/traces/h100_hf_qwen05b_forward_bs16.json.gz --repeat 3

Long runs: the naive way needs several times the file size in memory (Python dicts), and HTA
more time; --only limits the run to some of them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("tokentrace", "hta", "naive")

# Runs inside the subprocess: argv = method, path. Prints one JSON line.
_RUNNER = r"""
import json, os, resource, sys, time
method, path = sys.argv[1], sys.argv[2]

def rss_peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

if method == "tokentrace":
    import tokentrace
    import tokentrace.analysis  # the analysis stack (numpy, pandas, msgspec): imports are not timed
    base = rss_peak()
    t0 = time.perf_counter()
    t = tokentrace.load(path, progress=False)
    seconds = time.perf_counter() - t0
    rows = len(t.events)
elif method == "hta":
    import logging, tempfile
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    folder = tempfile.mkdtemp(prefix="bench-hta-")
    suffix = ".json.gz" if path.endswith(".gz") else ".json"
    os.symlink(os.path.abspath(path), os.path.join(folder, "rank-0" + suffix))
    base = rss_peak()
    t0 = time.perf_counter()
    a = TraceAnalysis(trace_dir=folder)
    seconds = time.perf_counter() - t0
    rows = int(a.t.get_trace(0).shape[0])
elif method == "naive":
    import gzip
    import pandas as pd
    base = rss_peak()
    t0 = time.perf_counter()
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
        doc = json.load(fh)
    df = pd.DataFrame(doc["traceEvents"] if isinstance(doc, dict) else doc)
    seconds = time.perf_counter() - t0
    rows = len(df)
else:
    raise SystemExit(f"unknown method {method}")
print(json.dumps({"method": method, "seconds": seconds, "rows": rows, "peak_rss": rss_peak(), "baseline_rss": base}))
"""


def json_size(path: Path) -> int:
    """Bytes of uncompressed JSON."""
    if path.name.endswith(".gz"):
        n = 0
        with gzip.open(path, "rb") as fh:
            while chunk := fh.read(1 << 24):
                n += len(chunk)
        return n
    return path.stat().st_size


def run_one(method: str, path: Path, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as cwd:  # HTA writes logs next to where it runs
        proc = subprocess.run([sys.executable, "-c", _RUNNER, method, str(path)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd)
    if proc.returncode != 0:
        return {"method": method, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", type=Path, default=ROOT / "benchmarks" / "data" / "large.json")
    ap.add_argument("--only", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--repeat", type=int, default=1, help="runs per method; the fastest is reported")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    args.file = args.file.resolve()
    size = json_size(args.file)
    results: dict[str, dict[str, Any]] = {}
    for method in args.only:
        runs = [run_one(method, args.file, args.timeout) for _ in range(args.repeat)]
        ok = [r for r in runs if "error" not in r]
        results[method] = min(ok, key=lambda r: r["seconds"]) if ok else runs[-1]
        print(f"{method}: {results[method]}", file=sys.stderr)
    report = summarize(args.file, size, results)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def summarize(path: Path, size: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ours = results.get("tokentrace", {}).get("seconds")
    out: dict[str, Any] = {"file": str(path), "json_bytes": size, "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                           "results": {}}
    for method, r in results.items():
        if "error" in r:
            out["results"][method] = r
            continue
        out["results"][method] = {
            **r,
            "mb_per_s": size / 1e6 / r["seconds"],
            "peak_rss_over_json": r["peak_rss"] / size,
            "times_tokentrace": (r["seconds"] / ours) if ours else None,
        }
    return out


def render(report: dict[str, Any]) -> str:
    lines = [f"file: {report['file']} ({report['json_bytes'] / 1e6:.1f} MB of JSON)",
             f"{'method':<11} {'seconds':>8} {'MB/s':>7} {'x ours':>7} {'peak RSS MB':>12} {'RSS/JSON':>9} {'baseline MB':>12} {'rows':>10}"]
    for method, r in report["results"].items():
        if "error" in r:
            lines.append(f"{method:<11} error: {r['error']}")
            continue
        lines.append(f"{method:<11} {r['seconds']:8.2f} {r['mb_per_s']:7.1f} {r['times_tokentrace']:7.1f} {r['peak_rss'] / 1e6:12.0f} "
                     f"{r['peak_rss_over_json']:9.2f} {r['baseline_rss'] / 1e6:12.0f} {r['rows']:10d}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
