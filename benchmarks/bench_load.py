"""Load, analyze and repeat-run figures for every benchmark trace shape, beside HTA and json.load.

For each file (default: the three shapes of benchmarks/README.md at each size found under
benchmarks/data/, `{shape}_{size}.json`), each in its own subprocess so that its peak RSS is its
own (getrusage ru_maxrss, which includes the interpreter and libraries: `base` in the table):

- load: `tokentrace.load(path, cache=False)`: wall and CPU seconds, MB/s of uncompressed JSON;
- gz: the same load of `{shape}_{size}.json.gz` (made with gzip -6 when missing and --gz is given);
- analyze: load + every detector (`tokentrace.analyze`, cache off), with each detector's seconds
  (with the detectors in threads, each one's own wall time, its waits for the GIL included);
- repeat: after one `analyze` + HTML report that writes the caches (loaded trace, detector
  results and drawn figures, in a temporary folder; timed as `first report`), new processes run
  `load`, `analyze`, `analyze` + HTML report, and `analyze --min-gap-us 10` (other options: gaps
  and the three detectors that read it made again from their cached results, each detector's
  `refresh`) on the same file;
- hta: Holistic Trace Analysis' `TraceAnalysis` on a folder holding only this file (hta extra);
- naive: `json.load` + `pandas.DataFrame(traceEvents)`.

Our methods run as the `tokentrace` program does: the allocator first told to keep large freed
blocks and share one heap among threads (`tokentrace.analysis.allocator`, which the command
calls when it starts; the Python API does not), and the detectors of a trace of 1.5 M events or
more in up to four threads (`tokentrace.analysis.parallel`; TOKENTRACE_JOBS=1 for one). The
table's "analyze" is wall time; its CPU seconds are in the JSON. HTA and the naive loader run
with glibc's defaults.

Nothing here asserts a time. Typical runs:

    python3 benchmarks/bench_load.py --make --gz                       # every shape, 200 MB and 1 GB
    python3 benchmarks/bench_load.py --sizes 200 --only load analyze   # quicker
    python3 benchmarks/bench_load.py --file some.json.gz --only load hta naive

HTA and the naive loader need several times the file size in memory and HTA minutes per GB:
`--hta-max-mb` (default 300) skips them above that size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
SHARED = ROOT.parent / "shared" / "traces"
# Shape name -> the real trace it repeats (see benchmarks/README.md for why each).
SHAPES = {
    "hf": "h100_hf_qwen05b_forward_bs16.json.gz",
    "train": "v100_cnn_ddp_ns_resolution.pt.trace.json.gz",
    "serving": "mi300x_vllm_mixed_prefill_decode_piecewise_graph.json.gz",
}
METHODS = ("load", "gz", "analyze", "repeat", "hta", "naive")

# Runs inside the subprocess: argv = method, path[, cache folder]. Prints one JSON line.
_RUNNER = r"""
import json, os, resource, sys, time
method, path = sys.argv[1], sys.argv[2]
cache = sys.argv[3] if len(sys.argv) > 3 else None

def rss_peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

out = {}
if method not in ("hta", "naive"):  # as the tokentrace program runs (cli.run)
    from tokentrace.analysis.allocator import keep_freed_blocks
    if keep_freed_blocks():
        from tokentrace.analysis import parallel
        parallel.allow_threads()  # its detectors' threads ($TOKENTRACE_JOBS=1: one)
if method in ("load", "gz", "repeat_load"):
    from tokentrace.analysis.loading import loader
    use = cache if method == "repeat_load" else False
    base = rss_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    trace = loader.load(path, cache=use, progress=False)
    seconds = time.perf_counter() - t0
    out.update(cache=trace.meta["_load"].get("cache"), load_seconds=seconds, cpu_seconds=time.process_time() - c0)
    rows = len(trace.events)
elif method in ("analyze", "fill", "repeat_analyze", "repeat_other", "repeat_report"):
    # What `tokentrace analyze` runs: load, graph maps, every detector (the results cache with
    # it for fill and the repeats; repeat_other changes min_gap_us, which gaps and its readers use).
    # fill and repeat_report also render the HTML report (what `tokentrace report` adds).
    from tokentrace.analysis import pipeline
    opts = pipeline.Options(cache=cache if method != "analyze" else False, min_gap_us=10.0 if method == "repeat_other" else 3.0)
    base = rss_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    a = pipeline.run_pipeline(path, opts)
    if method in ("fill", "repeat_report"):
        a.to_html()
    seconds = time.perf_counter() - t0
    out.update(cache=a.trace.meta["_load"].get("cache"), load_seconds=a.trace.meta["_load"]["seconds"],
               load_cpu_seconds=a.trace.meta["_load"].get("cpu_seconds"),
               cpu_seconds=time.process_time() - c0, detectors=a.seconds, cached=list(a.cached), refreshed=list(a.refreshed),
               events_read=not getattr(a.trace, "deferred", False))
    rows = len(a.trace.events) if out["events_read"] else None  # a deferred trace's columns are not read for this
elif method == "hta":
    import logging, tempfile
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    folder = tempfile.mkdtemp(prefix="bench-hta-")
    suffix = ".json.gz" if path.endswith(".gz") else ".json"
    os.symlink(os.path.abspath(path), os.path.join(folder, "rank-0" + suffix))
    base = rss_peak()
    t0 = time.perf_counter()
    c0 = time.process_time()
    a = TraceAnalysis(trace_dir=folder)
    seconds = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0
    rows = int(a.t.get_trace(0).shape[0])
elif method == "naive":
    import gzip
    import pandas as pd
    base = rss_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
        doc = json.load(fh)
    df = pd.DataFrame(doc["traceEvents"] if isinstance(doc, dict) else doc)
    seconds = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0
    rows = len(df)
else:
    raise SystemExit(f"unknown method {method}")
out.update(method=method, seconds=seconds, rows=rows, peak_rss=rss_peak(), baseline_rss=base)
print(json.dumps(out))
"""


def run_one(method: str, path: Path, timeout: float, cache: Path | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # An installed package has its bytecode compiled (pip does it, or the first import): a
    # PYTHONDONTWRITEBYTECODE environment would make each fresh process compile tokentrace's
    # modules again (0.3 s on this VM), which no user's repeat run pays.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    args = [sys.executable, "-c", _RUNNER, method, str(path)] + ([str(cache)] if cache else [])
    with tempfile.TemporaryDirectory() as cwd:  # HTA writes logs next to where it runs
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
        except subprocess.TimeoutExpired:
            return {"method": method, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"method": method, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(path: Path, methods: list[str], *, repeat: int, timeout: float, hta_max_mb: float) -> dict[str, Any]:
    size = path.stat().st_size
    res: dict[str, Any] = {"file": path.name, "json_bytes": size}

    def best(method: str, p: Path, cache: Path | None = None) -> dict[str, Any]:
        runs = [run_one(method, p, timeout, cache) for _ in range(repeat)]
        ok = [r for r in runs if "error" not in r]
        return min(ok, key=lambda r: r["seconds"]) if ok else runs[-1]

    for method in methods:
        if method in ("hta", "naive") and size > hta_max_mb * 1e6:
            res[method] = {"skipped": f"above --hta-max-mb {hta_max_mb:.0f}"}
        elif method == "gz":
            gz = path.with_name(path.name + ".gz")
            res[method] = best("gz", gz) if gz.exists() else {"skipped": "no .json.gz (use --gz)"}
        elif method == "repeat":
            folder = Path(tempfile.mkdtemp(prefix="bench-cache-"))
            try:
                res["first_report"] = run_one("fill", path, timeout, folder)
                res["repeat_load"] = best("repeat_load", path, folder)
                res["repeat_analyze"] = best("repeat_analyze", path, folder)
                res["repeat_report"] = best("repeat_report", path, folder)
                res["repeat_other"] = run_one("repeat_other", path, timeout, folder)  # once: it writes what a second would read
                res["cache_bytes"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            res[method] = best(method, path)
        print(f"{path.name} {method}: {json.dumps(res.get(method, res.get('repeat_analyze')))}", file=sys.stderr)
    return res


def render(results: list[dict[str, Any]]) -> str:
    """One row per file. Each time is "wall (CPU)" seconds; ratios are of CPU seconds, which a
    shared machine disturbs far less than wall time (other processes take turns on the cores)."""

    def cell(r: dict[str, Any] | None) -> str:
        if not r:
            return "-"
        if "skipped" in r:
            return "skip"
        if "error" in r:
            return "error"
        return f"{r['seconds']:.2f} ({r['cpu_seconds']:.2f})"

    def ratio(r: dict[str, Any] | None, base: dict[str, Any] | None, *, inverse: bool = False) -> str:
        if not r or not base or "cpu_seconds" not in r or "cpu_seconds" not in base:
            return ""
        x = base["cpu_seconds"] / r["cpu_seconds"] if inverse else r["cpu_seconds"] / base["cpu_seconds"]
        return f" {x:.1f}x" if x >= 10 else f" {x:.2f}x"

    def own_load(r: dict[str, Any] | None) -> str:
        # analyze's CPU over that of the load it ran itself: the same ratio as the column's,
        # without the ~10% a load's CPU moves between two processes on this VM.
        if not r or not r.get("load_cpu_seconds") or "cpu_seconds" not in r:
            return ""
        return f", own load {r['cpu_seconds'] / r['load_cpu_seconds']:.2f}x"

    def wall_ratio(r: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
        # analyze's detectors may run in threads: its wall time is then less than its CPU's.
        if not r or not base or "seconds" not in r or "seconds" not in base or r.get("cpu_seconds", 0) <= r["seconds"] * 1.02:
            return ""
        return f", wall {r['seconds'] / base['seconds']:.2f}x"

    lines = [
        "| file | MB | events | load s | MB/s wall (CPU) | peak RSS / JSON | .gz load s, x plain | analyze s, x load | "
        "analyze peak RSS / JSON | repeat load s, x faster | repeat analyze s, x faster | repeat analyze, other min gap s, x faster | "
        "first report s | repeat report s, x faster | HTA s, x ours | json.load + DataFrame s, x ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        mb = res["json_bytes"] / 1e6
        load = res.get("load") or {}
        ok = "seconds" in load
        an = res.get("analyze")
        lines.append("| " + " | ".join([
            res["file"], f"{mb:.0f}", f"{load.get('rows', 0):,}" if ok else "-", cell(load),
            f"{mb / load['seconds']:.0f} ({mb / load['cpu_seconds']:.0f})" if ok else "-",
            f"{load['peak_rss'] / res['json_bytes']:.2f}" if ok else "-",
            cell(res.get("gz")) + ratio(res.get("gz"), load),
            cell(an) + ratio(an, load) + own_load(an) + wall_ratio(an, load),
            f"{an['peak_rss'] / res['json_bytes']:.2f}" if an and "peak_rss" in an else "-",
            cell(res.get("repeat_load")) + ratio(res.get("repeat_load"), load, inverse=True),
            cell(res.get("repeat_analyze")) + ratio(res.get("repeat_analyze"), an, inverse=True),
            cell(res.get("repeat_other")) + ratio(res.get("repeat_other"), an, inverse=True),
            cell(res.get("first_report")),
            cell(res.get("repeat_report")) + ratio(res.get("repeat_report"), res.get("first_report"), inverse=True),
            cell(res.get("hta")) + ratio(res.get("hta"), load),
            cell(res.get("naive")) + ratio(res.get("naive"), load),
        ]) + " |")
    det = [r for r in results if (r.get("analyze") or {}).get("detectors")]
    if det:
        names = list(det[0]["analyze"]["detectors"])
        lines += ["", "Wall seconds per detector (analyze, after the load; the repeat run's, reading the results cache, in brackets):", "",
                  "| file | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for r in det:
            d = r["analyze"]["detectors"]
            rd = (r.get("repeat_analyze") or {}).get("detectors") or {}
            lines.append(f"| {r['file']} | " + " | ".join(
                f"{d.get(n, 0):.2f}" + (f" ({rd[n]:.2f})" if n in rd else "") for n in names) + " |")
    return "\n".join(lines)


def ensure_files(sizes: list[int], shapes: list[str], make: bool, gz: bool) -> list[Path]:
    out = []
    for shape in shapes:
        for size in sizes:
            path = DATA / f"{shape}_{size}.json"
            if not path.exists() and make:
                subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_large_trace.py"), "--source",
                                str(SHARED / SHAPES[shape]), "--size-mb", str(size), "--out", str(path)], check=True)
            if path.exists():
                if gz and not path.with_name(path.name + ".gz").exists():
                    with open(path.with_name(path.name + ".gz"), "wb") as fh:
                        subprocess.run(["gzip", "-6", "-c", str(path)], stdout=fh, check=True)
                out.append(path)
            else:
                print(f"missing {path} (use --make)", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", type=Path, nargs="+", help="measure these files instead of the shapes")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--sizes", nargs="+", type=int, default=[200, 1000], help="MB of JSON per shape")
    ap.add_argument("--make", action="store_true", help="generate missing shape files with make_large_trace.py")
    ap.add_argument("--gz", action="store_true", help="also gzip each file (gzip -6) for the gz column")
    ap.add_argument("--only", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--repeat", type=int, default=1, help="runs per method; the fastest is reported")
    ap.add_argument("--hta-max-mb", type=float, default=300.0, help="skip HTA and json.load above this size")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    files = [f.resolve() for f in args.file] if args.file else ensure_files(args.sizes, args.shapes, args.make, args.gz)
    results = [measure(f, args.only, repeat=args.repeat, timeout=args.timeout, hta_max_mb=args.hta_max_mb) for f in files]
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps({"cpu_count": os.cpu_count(), "python": sys.version.split()[0], "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
