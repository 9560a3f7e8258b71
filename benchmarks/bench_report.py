"""Time the HTML and Markdown reports on the largest real trace: what a report adds to `analyze`.

A measurement, not a test (tests never assert a time): it prints the time of rendering both
reports (the fastest of --repeat runs, after one warm-up render that pays matplotlib's import, as
a CLI run does too) next to the target of issue 7: at most TARGET_S seconds on the largest shared
trace. The exit code is 0 either way.

    python3 benchmarks/bench_report.py                         # largest trace of ../shared/traces
    python3 benchmarks/bench_report.py --file some.json.gz --repeat 5
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
# Report generation may add at most this much to analyze on the largest shared trace (issue 7).
TARGET_S = 2.0


def _size(path: Path) -> int:
    data = path.read_bytes()
    return len(gzip.decompress(data)) if path.name.endswith(".gz") else len(data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, help="trace to report on (default: the largest of ../shared/traces)")
    ap.add_argument("--repeat", type=int, default=2, help="timed renders; the fastest counts")
    args = ap.parse_args()
    path = args.file
    if path is None:
        found = sorted(p for p in SHARED.glob("*.json*")) if SHARED.is_dir() else []
        if not found:
            print(f"no trace given and {SHARED} holds none")
            return 2
        path = max(found, key=_size)

    import tokentrace
    from tokentrace.reports.html import render_html
    from tokentrace.reports.markdown import render_markdown

    t0 = time.perf_counter()
    analysis = tokentrace.analyze(path)
    analyze_s = time.perf_counter() - t0
    render_html(analysis)  # warm-up: matplotlib's import
    best = float("inf")
    for _ in range(max(args.repeat, 1)):
        t0 = time.perf_counter()
        html = render_html(analysis)
        render_markdown(analysis)
        best = min(best, time.perf_counter() - t0)
    verdict = "within" if best <= TARGET_S else "over"
    print(f"{path.name}: {_size(path) / 1e6:.1f} MB of JSON, analyze {analyze_s:.2f} s, "
          f"HTML + Markdown reports {best:.2f} s ({verdict} the {TARGET_S:g} s target), HTML {len(html) / 1e3:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
