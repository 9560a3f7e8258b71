"""Cross-check of tokentrace's GPU busy/idle numbers against Holistic Trace Analysis (HTA).

Owns the one call into HTA (the optional `hta` extra, pip package HolisticTraceAnalysis, imported
lazily so tokentrace never needs it) and the lines `tokentrace analyze --hta` prints. HTA's
temporal breakdown merges every GPU row that has a stream (kernels, memcpy, memset, and also
Kineto's cuda_sync rows) from the first one's start to the last one's end; tokentrace leaves
cuda_sync rows out because they are waits, not work, so the two can differ by the length of a
trailing sync row. The test suite holds the difference to 1% of the span on the shared traces.
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


def _import_hta() -> Any:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        raise TokentraceError(f"{HINT} ({exc})") from None
    return TraceAnalysis


def hta_temporal_breakdown(path: str | os.PathLike) -> dict[str, Any]:
    """HTA's idle/busy numbers (us) for one trace file: span_us, busy_us, idle_us, compute_us,
    non_compute_us, and `notes` on how they were obtained. Raises TokentraceError when HTA is
    missing or cannot read the file.

    HTA joins a relative trace file name to its trace_dir and then refuses it ("Trace files
    validation failed"), so the file goes in as an absolute path. Its temporal breakdown asserts
    that compute plus idle time fit in the span, which fails on some traces after it rounds
    nanosecond timestamps; span and idle then come from the function that breakdown uses for them
    (BreakdownAnalysis._get_idle_time_for_kernels) on the trace HTA loaded, and the compute split
    is left out.
    """
    TraceAnalysis = _import_hta()
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis

    path = os.path.abspath(os.fspath(path))
    quiet = io.StringIO()
    hta_log = logging.getLogger("hta")
    level = hta_log.level
    notes: list[str] = []
    try:
        hta_log.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            warnings.simplefilter("ignore")
            # The whole trace: HTA drops the last ProfilerStep unless told otherwise.
            ta = TraceAnalysis(trace_files={0: path}, trace_dir=os.path.dirname(path), include_last_profiler_step=True)
            try:
                compute: float | None
                non_compute: float | None
                r = ta.get_temporal_breakdown(visualize=False).iloc[0]
                span, idle = float(r["kernel_time(us)"]), float(r["idle_time(us)"])
                compute, non_compute = float(r["compute_time(us)"]), float(r["non_compute_time(us)"])
            except AssertionError:
                df = ta.t.traces[0]
                idle_f, span_f = BreakdownAnalysis._get_idle_time_for_kernels(df[df["stream"].ne(-1)])
                span, idle = float(span_f), float(idle_f)
                compute = non_compute = None
                notes.append("HTA's temporal breakdown fails its own check on this trace (compute and idle time exceed the span "
                             "after it rounds nanosecond timestamps); its span and idle come from the function that breakdown uses")
    except TokentraceError:
        raise
    except BaseException as exc:  # noqa: BLE001 - HTA asserts and indexes freely on traces it does not expect
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TokentraceError(f"{path}: HTA could not analyse it ({type(exc).__name__}: {str(exc)[:120]})") from None
    finally:
        hta_log.setLevel(level)
    return {"span_us": span, "busy_us": span - idle, "idle_us": idle, "compute_us": compute, "non_compute_us": non_compute,
            "notes": notes}


def hta_caveats(trace: Any) -> list[str]:
    """Reasons HTA's numbers will differ from ours on this trace: HTA takes rows with a `stream`
    arg for GPU work, and Triton's launcher cpu_ops carry one (seen on the shared A100 trace)."""
    ev = trace.events
    host_with_stream = ev[(ev["stream"] >= 0) & (ev["kind"] == "cpu_op")]
    if host_with_stream.empty:
        return []
    names = sorted({str(n) for n in host_with_stream["name"].astype(object)})[:3]
    return [f"HTA counts {len(host_with_stream)} cpu op(s) that carry a stream arg as GPU work ({', '.join(names)})"]


def hta_rounding(trace: Any) -> list[str]:
    """HTA reads ns-resolution traces by rounding every time down to whole microseconds (its log says
    so), so each GPU activity can lose up to a microsecond of busy time in its numbers."""
    gpu = trace.gpu
    if gpu.empty:
        return []
    fractional = int((((gpu["ts"] % 1000) != 0) | ((gpu["end"] % 1000) != 0)).sum())
    if not fractional:
        return []
    return [f"HTA rounds times down to whole microseconds: over {fractional} GPU activities with sub-microsecond times its "
            f"busy time can be up to {fractional} us lower than ours"]


def hta_comparison(analysis: Any) -> dict[str, Any]:
    """Our GPU span/busy/idle beside HTA's temporal breakdown.

    Returns {"rows": [(name, ours_us, hta_us)], "utilization": (ours, hta), "caveats": [...]} or
    {"error": why} when HTA cannot read the trace (a missing HTA install raises TokentraceError).
    """
    ours = analysis.results.get("gpu")
    if ours is None:
        return {"error": "tokentrace's gpu section is missing (see the warnings above)"}
    if ours.devices.empty:
        # HTA's breakdown indexes the first and last GPU row and fails on a trace without one.
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
    return {"rows": rows, "utilization": (ours.utilization, util_b), "caveats": hta_caveats(analysis.trace) + hta_rounding(analysis.trace) + theirs["notes"]}
