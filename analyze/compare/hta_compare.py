"""Cross-check of tokentrace's GPU busy/idle numbers against Holistic Trace Analysis (HTA).

Owns the one call into HTA (the optional `hta` extra, pip package HolisticTraceAnalysis, imported
lazily so tokentrace never needs it) and the lines `tokentrace analyze --hta` prints. HTA's
temporal breakdown merges every GPU row that has a stream (kernels, memcpy, memset, and also
Kineto's cuda_sync rows) from the first one's start to the last one's end; tokentrace leaves
cuda_sync rows out because they are waits, not work, so the two can differ by the length of a
trailing sync row. The test suite holds the difference to 1% of the span on the shared traces.

HTA by default rounds every event of a trace with sub-microsecond timestamps inward to whole
microseconds (start up, end down: its fix for events that overlap by a few nanoseconds). That
shortens each kernel by up to 2 us and turns nanosecond gaps into microsecond ones: on SGLang's
capture trace (two kernels, 1 ns apart by the file's own timestamps, an 11.016 us span) it
reports 1 us idle in a 10 us span. The cross-check compares like with like, so HTA runs here with
its own switch for that rounding off (HTA_DISABLE_NS_ROUNDING).

HTA also joins a relative trace file name to its trace_dir and then refuses the file ("Trace files
validation failed"), so the file goes in as an absolute path; and its breakdown indexes the first
GPU row, so a trace without GPU activity is answered here in one line instead.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from typing import Any

from tokentrace.errors import TokentraceError

HINT = "HolisticTraceAnalysis is not installed; pip install 'tokentrace[hta]' (or pip install HolisticTraceAnalysis)"
# HTA's environment switch that keeps timestamps at the trace's own resolution (see above).
HTA_NO_ROUNDING_ENV = "HTA_DISABLE_NS_ROUNDING"


def _import_hta() -> Any:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        raise TokentraceError(f"{HINT} ({exc})") from None
    return TraceAnalysis


def hta_temporal_breakdown(path: str | os.PathLike) -> dict[str, float]:
    """HTA's idle/busy numbers (us) for one trace file: span_us, busy_us, idle_us, compute_us,
    non_compute_us. Raises TokentraceError when HTA is missing or cannot read the file."""
    TraceAnalysis = _import_hta()
    path = os.path.abspath(os.fspath(path))
    quiet = io.StringIO()
    hta_log = logging.getLogger("hta")
    level = hta_log.level
    rounding = os.environ.get(HTA_NO_ROUNDING_ENV)
    try:
        os.environ[HTA_NO_ROUNDING_ENV] = "1"
        hta_log.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            warnings.simplefilter("ignore")
            # The whole trace: HTA drops the last ProfilerStep unless told otherwise.
            ta = TraceAnalysis(trace_files={0: path}, trace_dir=os.path.dirname(os.path.abspath(path)),
                               include_last_profiler_step=True)
            df = ta.get_temporal_breakdown(visualize=False)
    except TokentraceError:
        raise
    except BaseException as exc:  # HTA asserts and indexes freely on traces it does not expect
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TokentraceError(f"{path}: HTA could not analyse it ({type(exc).__name__}: {str(exc)[:120]})") from None
    finally:
        hta_log.setLevel(level)
        if rounding is None:
            os.environ.pop(HTA_NO_ROUNDING_ENV, None)
        else:
            os.environ[HTA_NO_ROUNDING_ENV] = rounding
    r = df.iloc[0]
    span = float(r["kernel_time(us)"])
    idle = float(r["idle_time(us)"])
    return {"span_us": span, "busy_us": span - idle, "idle_us": idle,
            "compute_us": float(r["compute_time(us)"]), "non_compute_us": float(r["non_compute_time(us)"])}


def hta_caveats(trace: Any) -> list[str]:
    """Reasons HTA's numbers will differ from ours on this trace: HTA takes rows with a `stream`
    arg for GPU work, and Triton's launcher cpu_ops carry one (seen on the shared A100 trace)."""
    ev = trace.events
    host_with_stream = ev[(ev["stream"] >= 0) & (ev["kind"] == "cpu_op")]
    if host_with_stream.empty:
        return []
    names = sorted({str(n) for n in host_with_stream["name"].astype(object)})[:3]
    return [f"HTA counts {len(host_with_stream)} cpu op(s) that carry a stream arg as GPU work ({', '.join(names)})"]


def hta_comparison(analysis: Any) -> dict[str, Any]:
    """Our GPU span/busy/idle beside HTA's temporal breakdown.

    Returns {"rows": [(name, ours_us, hta_us)], "utilization": (ours, hta), "caveats": [...]} or
    {"error": why} when HTA cannot read the trace (a missing HTA install raises TokentraceError).
    """
    ours = analysis.results.get("gpu")
    if ours is None:
        return {"error": "tokentrace's gpu section is missing (see the warnings above)"}
    if ours.devices.empty:
        return {"error": "HTA's temporal breakdown measures GPU kernels, and this trace has no GPU activity: nothing to compare"}
    try:
        theirs = hta_temporal_breakdown(analysis.trace.path)
    except TokentraceError as exc:
        if HINT in str(exc):
            raise
        return {"error": str(exc)}
    rows = [("span", ours.span_us, theirs["span_us"]), ("busy", ours.busy_us, theirs["busy_us"]),
            ("idle", ours.idle_us, theirs["idle_us"])]
    util_b = theirs["busy_us"] / theirs["span_us"] if theirs["span_us"] else None
    return {"rows": rows, "utilization": (ours.utilization, util_b), "caveats": hta_caveats(analysis.trace)}
