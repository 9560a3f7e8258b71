"""What a report shows, read from an Analysis: headline, findings and sections as plain data.

Owns every key the renderers read, so HTML, Markdown and terminal output agree and one file says
which parts of the JSON summary (and which result DataFrames) the reports depend on. The view
reads; it never recomputes a measured number. The only arithmetic here prepares drawings: unit
scaling, and binning raw busy intervals into pixels for the timeline.

Keys read (a missing key or section is tolerated and said so in one line):
- `trace`: path, rank, device, duration_us, kinds, counts, warnings, capture (model, dtype, command...)
- `phases`: method, confidence, ttft_us, prefill[] (ttft_us ...), decode{steps, tpot_us{p50,p90,mean,max}, bound{cpu_share,gpu_share}}
- `gpu`: busy_us, idle_us, utilization;  `gaps`: count, total_us, by_cause, top[];  `launches`: any scalars
- `syncs`: count, blocked_us, syncs_per_token | per_token, items[] (kind, api, blocked_us, phase, step, op, stack)
- `shapes` (ops[], kernels[] with phase), `memory`: scalars and lists of records (shown as tables)
- `attention`: fits[] (phase, op, exponent, exponent_stderr, points, backend, coefficient | intercept)
- `roofline`: phases{phase: intensity, tflops, peak_tflops, peak_gbs, verdict}, ops[] (intensity, tflops, phase)
- `findings[]`: Finding.to_json()
DataFrames (optional, for figures): phases.steps, phases.segments.table, gpu busy intervals
(start/end ns), gaps table (dur or start/end ns), syncs table (ts ns), memory timeline
(ts, allocated, reserved); else the raw trace rows they are drawn from.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.compare.metrics import BY_KEY, dig
from tokentrace.reports import format as fmt

# Order and titles of the report's sections (the JSON summary's section keys).
SECTION_TITLES: dict[str, str] = {
    "phases": "Phases: prefill and decode",
    "gpu": "GPU utilisation",
    "gaps": "GPU idle gaps",
    "launches": "Kernel launches",
    "syncs": "Host-device syncs",
    "shapes": "Top ops and kernels by phase and shape",
    "attention": "Attention scaling",
    "roofline": "Roofline",
    "memory": "Memory",
}

# How many rows a table shows before saying how many more there are; a ticket attachment must
# stay small (a few hundred KB) even for traces with thousands of syncs or gaps.
MAX_ROWS = 25
MAX_STACK_FRAMES = 30
# Pixels of the timeline figure: busy intervals are binned to this many columns.
TIMELINE_BINS = 1200
# Most sync markers and memory samples drawn; more only thicken lines and grow the SVG.
MAX_POINTS = 2000

# Column order preferences when a list of records becomes a table.
PREFERRED_COLUMNS = (
    "severity", "phase", "step", "index", "name", "kind", "api", "op", "kernel", "backend", "cause",
    "input_dims", "shape", "shapes", "count", "calls", "start_us", "dur_us", "blocked_us", "gpu_us",
    "cpu_us", "total_us", "mean_us", "ttft_us", "prompt_len",
)
MAX_COLUMNS = 10
STACK_KEYS = ("stack", "python_stack")


@dataclass
class Table:
    columns: list[str]  # labels shown
    keys: list[str]  # JSON keys behind them
    rows: list[list[Any]]  # formatted cells: str, or list[str] for a stack
    more: int = 0  # rows not shown


@dataclass
class Metric:
    label: str
    text: str
    source: str | None  # the JSON key it came from (None: not in this analysis)
    value: float | None = None


@dataclass
class Section:
    key: str
    title: str
    status: str = "ok"  # ok | empty (the trace lacks the data) | absent (not analysed) | error
    message: str = ""  # one line when the section has nothing to draw
    facts: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str, Table]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # figure name -> data for reports.figures
    figure_notes: dict[str, str] = field(default_factory=dict)  # figure name -> why it is not drawn
    summary_lines: list[str] = field(default_factory=list)


@dataclass
class TraceView:
    doc: dict[str, Any]
    title: str
    header: list[tuple[str, str]]
    capture: list[tuple[str, str]]  # capture metadata beyond the header's
    headline: list[Metric]
    findings: list[dict[str, Any]]
    sections: list[Section]
    timeline: dict[str, Any] | None
    timeline_note: str
    reproduce: list[str]
    warnings: list[str]


# ---- key lookup ---------------------------------------------------------------------------
def pick(doc: Any, *paths: str) -> tuple[Any, str | None]:
    """First present value among the paths, with the path it came from."""
    for p in paths:
        v = dig(doc, p)
        if v is not None and not (isinstance(v, dict) and "error" in v):
            return v, p
    return None, None


def section_state(doc: dict[str, Any], key: str) -> tuple[str, str]:
    """(status, one-line message) of a JSON section."""
    sec = doc.get(key)
    if sec is None:
        return "absent", f"Not analysed: the {key} detector is not part of this build."
    if isinstance(sec, dict) and "error" in sec:
        return "error", f"The {key} analysis failed on this trace: {sec['error']}"
    if isinstance(sec, dict):
        if sec.get("available") is False or sec.get("status") == "absent":
            return "absent", str(sec.get("reason") or sec.get("message") or f"This trace has no data for {key}.")
    return "ok", ""


GPU_ACTIVITY_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")


def lacks(key: str, doc: dict[str, Any]) -> str | None:
    """One line saying why a section has nothing to show for this trace, or None when it has."""
    sec = doc.get(key) if isinstance(doc.get(key), dict) else {}
    kinds = dig(doc, "trace.kinds") or {}
    if key in ("gpu", "gaps", "roofline") and not any(kinds.get(k) for k in GPU_ACTIVITY_KINDS):
        return "This trace has no GPU activity (no kernels, copies or memsets were recorded): nothing to show."
    if key == "phases" and sec.get("method") == "none":
        return "No prefill, decode or profiler steps found (no tokentrace annotations, ProfilerStep# ranges or forward passes)."
    if key == "gaps" and sec.get("count") == 0:
        return f"No GPU idle gaps of at least {fmt.number(sec.get('min_gap_us'))} us in this trace."
    if key == "launches" and sec.get("count") == 0:
        return "No kernel launch calls in this trace."
    if key == "syncs" and sec.get("count") == 0:
        return "No host-device sync points in this trace."
    if key == "attention" and sec.get("calls") == 0:
        return "No attention ops in this trace (none of the known attention ops or kernels ran)."
    if key == "roofline" and "ops" in sec and not sec.get("ops") and not sec.get("phases"):
        return "No matmul or attention ops with recorded shapes and dtypes (record_shapes=True) to place on a roofline."
    if key == "memory" and sec.get("events") == 0:
        return "The trace has no memory events (profile with profile_memory=True)."
    if key == "shapes" and sec.get("op_groups") == 0:
        return "No ops in this trace."
    return None


# ---- generic description of a section ----------------------------------------------------
def describe(sec: dict[str, Any], skip: Iterable[str] = ()) -> tuple[list[tuple[str, str]], list[tuple[str, Table]]]:
    """Scalars (and small nested dicts of scalars) become facts; lists of records become tables."""
    facts: list[tuple[str, str]] = []
    tables: list[tuple[str, Table]] = []
    skip = set(skip) | {"error", "available", "status"}
    for key, val in sec.items():
        if key in skip:
            continue
        if isinstance(val, list) and val and all(isinstance(r, dict) for r in val):
            tables.append((fmt.label(key), records_table(val)))
        elif isinstance(val, dict) and val and all(isinstance(v, dict) for v in val.values()):
            rows = [{"name": k, **v} for k, v in val.items()]
            tables.append((fmt.label(key), records_table(rows)))
        elif isinstance(val, dict):
            for k2, v2 in val.items():
                if isinstance(v2, (dict, list)) and v2 and not _flat_list(v2):
                    continue
                unit_key = k2 if k2.endswith(("_us", "_bytes")) or not key.endswith(("_us", "_bytes")) else k2 + key[key.rfind("_"):]
                facts.append((f"{fmt.label(key)} {fmt.label(str(k2))}", fmt.by_key(unit_key, v2)))
        elif isinstance(val, list) and val and not _flat_list(val):
            continue
        else:
            facts.append((fmt.label(key), fmt.by_key(key, val)))
    return facts, tables


def _flat_list(v: Any) -> bool:
    return isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)


def records_table(records: list[dict[str, Any]], *, max_rows: int = MAX_ROWS, columns: list[str] | None = None) -> Table:
    keys: list[str] = []
    if columns:
        keys = [c for c in columns if any(c in r for r in records)]
    else:
        seen: dict[str, None] = {}
        for r in records[: max_rows * 4]:
            for k, v in r.items():
                if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, dict) for x in v)):
                    continue
                seen.setdefault(k, None)
        pref = [c for c in PREFERRED_COLUMNS if c in seen]
        keys = pref + [k for k in seen if k not in pref]
        stack_keys = [k for k in keys if k in STACK_KEYS]
        keys = [k for k in keys if k not in STACK_KEYS][: MAX_COLUMNS - len(stack_keys)] + stack_keys
    rows = [[cell(k, r.get(k)) for k in keys] for r in records[:max_rows]]
    return Table(columns=[fmt.label(k) for k in keys], keys=keys, rows=rows, more=max(0, len(records) - max_rows))


def cell(key: str, v: Any) -> Any:
    if key in STACK_KEYS and isinstance(v, list):
        return [str(x) for x in v[:MAX_STACK_FRAMES]]
    if key in STACK_KEYS and isinstance(v, str):
        return v.splitlines()[:MAX_STACK_FRAMES]
    if isinstance(v, str):
        return fmt.shorten(v, 160)
    return fmt.by_key(key, v)


# ---- DataFrames on results (optional; the JSON summary is the contract) ----------------------
def frame(result: Any, names: Iterable[str], needs: Iterable[str] = ()) -> pd.DataFrame | None:
    """The first DataFrame attribute of a result among `names` that has the `needs` columns."""
    if result is None:
        return None
    for n in names:
        df = getattr(result, n, None)
        if isinstance(df, pd.DataFrame) and all(c in df.columns for c in needs):
            return df
    return None


def first_col(df: pd.DataFrame, *names: str) -> str | None:
    return next((n for n in names if n in df.columns), None)


def us_column(df: pd.DataFrame, *bases: str) -> np.ndarray | None:
    """A duration column in microseconds: `<base>_us` as is, `<base>_ns` or bare `<base>` (ns) / 1000."""
    for b in bases:
        if f"{b}_us" in df.columns:
            return pd.to_numeric(df[f"{b}_us"], errors="coerce").to_numpy(float)
        for c in (f"{b}_ns", b):
            if c in df.columns and pd.api.types.is_numeric_dtype(df[c]):
                return df[c].to_numpy(float) / 1000.0
    return None


# ---- the view ----------------------------------------------------------------------------
def build(analysis: Any) -> TraceView:
    doc = analysis.to_json()
    results = getattr(analysis, "results", {}) or {}
    trace = getattr(analysis, "trace", None)
    t = doc.get("trace") if isinstance(doc.get("trace"), dict) else {}
    t0_ns = trace.span_ns[0] if trace is not None else 0
    sections = []
    for key, title in SECTION_TITLES.items():
        status, message = section_state(doc, key)
        s = Section(key=key, title=title, status=status, message=message)
        res = results.get(key)
        if hasattr(res, "summary_lines") and status == "ok":
            try:
                s.summary_lines = [str(x) for x in res.summary_lines()]
            except Exception:  # noqa: BLE001 - a summary helper must not take the report down
                s.summary_lines = []
        if status == "ok":
            lacking = lacks(key, doc)
            if lacking:
                s.status, s.message = "empty", lacking
            else:
                BUILDERS.get(key, _generic)(s, doc, res, trace, t0_ns)
        sections.append(s)
    timeline, note = _timeline(doc, results, trace, t0_ns)
    header, capture = _header(doc)
    return TraceView(
        doc=doc,
        title=str(t.get("path") or getattr(trace, "path", "trace")),
        header=header,
        capture=capture,
        headline=headline(doc),
        findings=[finding(f) for f in doc.get("findings") or [] if isinstance(f, dict)],
        sections=sections,
        timeline=timeline,
        timeline_note=note,
        reproduce=_reproduce(doc, analysis),
        # Health warnings first in every output (the Analysis' warnings include the loader's).
        warnings=[str(w) for w in (doc.get("warnings") if isinstance(doc.get("warnings"), list) else t.get("warnings")) or []],
    )


FINDING_KEYS = ("id", "title", "category", "severity", "phase", "step", "cost_total_us", "cost_per_step_us",
                "est_savings_us", "time_range_us", "op", "stack", "detail", "recommendation", "evidence")


def finding(f: dict[str, Any]) -> dict[str, Any]:
    """A finding from the summary with every key present (None when absent) and its evidence as a table."""
    out = {k: f.get(k) for k in FINDING_KEYS}
    out.update({k: v for k, v in f.items() if k not in out})
    out["severity"] = str(out["severity"] or "info")
    out["title"] = str(out["title"] or out["id"] or "finding")
    stack = out["stack"]
    out["stack"] = stack.splitlines() if isinstance(stack, str) else ([str(x) for x in stack] if isinstance(stack, list) else None)
    if out["stack"]:
        out["stack"] = out["stack"][:MAX_STACK_FRAMES]
    ev = out["evidence"]
    out["evidence"] = [r for r in ev if isinstance(r, dict)] if isinstance(ev, list) else []
    out["evidence_table"] = records_table(out["evidence"], max_rows=10) if out["evidence"] else None
    return out


# The headline: (metric key in analyze.metrics, label). The CPU share of the decode steps'
# critical path is the measured form of "decode is launch-bound" (analyze.critical_path).
HEADLINE = (("ttft_us", "TTFT"), ("tpot_p50_us", "TPOT p50"), ("gpu_utilization", "GPU utilisation"),
            ("launch_bound_share_decode", "Launch-bound share (decode)"), ("syncs_per_token", "Syncs per token"))


def headline(doc: dict[str, Any]) -> list[Metric]:
    """The five numbers a reader looks at first, read through analyze.metrics (the registry diff and check use)."""
    out = []
    for key, label in HEADLINE:
        m = BY_KEY[key]
        v = m.read(doc)
        text = fmt.duration(v) if m.unit == "us" else fmt.share(v) if m.unit == "share" else fmt.number(v)
        out.append(Metric(label, text, f"{key}: {m.label}" if v is not None else None, _num(v)))
    return out


def _num(v: Any) -> float | None:
    return float(v) if fmt.is_number(v) else None


# Capture metadata shown in the header; the rest of it goes under "capture metadata".
CAPTURE_HEADLINE_KEYS = ("model", "preset", "dtype", "prompt_len", "batch", "max_new_tokens", "compile",
                         "attn_implementation", "static_cache")


def _header(doc: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(header facts, every other capture-metadata fact) for the top of a trace's report."""
    t = doc.get("trace") if isinstance(doc.get("trace"), dict) else {}
    cap = t.get("capture") if isinstance(t.get("capture"), dict) else {}
    out = [  # the trace's path is the section title
        ("GPU", str(t.get("device") or "none (CPU only)")),
        ("rank", fmt.number(t.get("rank"))),
        ("duration", fmt.duration(t.get("duration_us"))),
    ]
    kinds = t.get("kinds") if isinstance(t.get("kinds"), dict) else {}
    if kinds:
        out.append(("events", ", ".join(f"{k} {fmt.number(v)}" for k, v in kinds.items() if k != "metadata")))
    method, _ = pick(doc, "phases.method")
    if method and method != "none":
        conf, _ = pick(doc, "phases.confidence")
        out.append(("phases from", f"{method}" + (f" ({conf} confidence)" if conf else "")))
    out += [(fmt.label(k), fmt.by_key(k, cap[k])) for k in CAPTURE_HEADLINE_KEYS if cap.get(k) is not None]
    versions = cap.get("versions")
    if isinstance(versions, dict) and versions:
        out.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if not isinstance(v, (dict, list)))))
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    out.append(("tokentrace", f"{tool.get('version', '?')} (JSON schema {doc.get('schema_version', '?')})"))
    rest: list[tuple[str, str]] = []
    for key, val in cap.items():
        if key in CAPTURE_HEADLINE_KEYS or key in ("command", "versions"):
            continue
        if isinstance(val, dict):  # config summary, timings, profiler options: one level of nesting
            rest += [(f"{fmt.label(key)} {fmt.label(str(k2))}", fmt.by_key(str(k2), v2)) for k2, v2 in val.items()
                     if not isinstance(v2, (dict, list)) or _flat_list(v2)]
        elif not isinstance(val, list) or _flat_list(val):
            rest.append((fmt.label(key), fmt.by_key(key, val)))
    return out, rest


def _reproduce(doc: dict[str, Any], analysis: Any) -> list[str]:
    cmds: list[str] = []
    cap, _ = pick(doc, "trace.capture.command")
    if isinstance(cap, list):
        cmds.append(shlex.join(str(x) for x in cap))
    elif isinstance(cap, str):
        cmds.append(cap)
    path = str(dig(doc, "trace.path") or "TRACE")
    opts = getattr(analysis, "options", None)
    flag = ""
    if opts is not None and getattr(opts, "min_gap_us", 3.0) != 3.0:
        flag = f" --min-gap-us {opts.min_gap_us:g}"
    cmds.append(f"tokentrace analyze {shlex.quote(path)}{flag} --json summary.json --html report.html")
    return cmds


# ---- section builders --------------------------------------------------------------------
def _generic(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    sec = doc.get(s.key)
    if isinstance(sec, dict):
        s.facts, s.tables = describe(sec)


def _phases(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    sec = doc["phases"]
    # tpot_us at the top level repeats decode.tpot_us; decode's block shows it.
    s.facts, s.tables = describe(sec, skip=("decode", "prefill", "other_steps", "notes", "tpot_us"))
    pre = sec.get("prefill")
    if isinstance(pre, list) and pre and isinstance(pre[0], dict):
        s.tables.insert(0, ("prefill passes", records_table(pre)))
    for key, label in (("decode", "decode"), ("other_steps", "steps")):
        part = sec.get(key)
        if isinstance(part, dict):
            # Per-step rows are drawn in the step chart; the JSON summary has them all.
            f2, t2 = describe(part, skip=("per_step",))
            s.facts += [(f"{label} {k}", v) for k, v in f2]
            s.tables += [(f"{label} {k}", v) for k, v in t2]
    s.facts += [("note", str(n)) for n in sec.get("notes") or []]
    for phase, title in (("decode", "decode steps"), ("step", "steps (training or unlabelled forward passes)")):
        steps = step_chart(sec, res, phase)
        if steps is not None:
            steps["title"] = title
            s.figures["decode_steps"] = steps
            break
    else:
        s.figure_notes["decode_steps"] = "No decode or profiler steps in this trace: no step chart."


# Names of the stacked parts of the step chart (the critical path of each step, analyze.critical_path).
PART_CPU = "CPU work on the critical path"
PART_GPU = "GPU work, host not waiting"
PART_SYNC = "host blocked in a sync"


def step_chart(sec: dict[str, Any], res: Any, phase: str) -> dict[str, Any] | None:
    """Per step of a phase: step time, split into CPU / GPU / sync parts of its critical path when measured.

    The critical path counts a blocking call's wait as GPU time (the host resumes when the GPU
    work it waits for ends), so the sync part is carved out of the GPU part, not added to it.
    """
    df = frame(res, ("steps",), needs=("phase",))
    if df is None:
        json_key = "decode" if phase == "decode" else "other_steps"
        rec = dig(sec, f"{json_key}.per_step")
        if not (isinstance(rec, list) and rec and isinstance(rec[0], dict)):
            return None
        df = pd.DataFrame(rec).assign(phase=phase)
    df = df[df["phase"].astype(str) == phase]
    if df.empty:
        return None
    total = us_column(df, "step", "tpot")
    if total is None:
        return None
    idx_col = first_col(df, "index", "step")
    x = df[idx_col].to_numpy(float) if idx_col else np.arange(len(df), dtype=float)
    cpu = us_column(df, "cp_cpu")
    gpu = us_column(df, "cp_gpu")
    if (cpu is None or gpu is None) and {"cpu_share", "gpu_share"} <= set(df.columns):
        cpu = total * pd.to_numeric(df["cpu_share"], errors="coerce").to_numpy(float)
        gpu = total * pd.to_numeric(df["gpu_share"], errors="coerce").to_numpy(float)
    parts: dict[str, np.ndarray] = {}
    if cpu is not None and gpu is not None and np.isfinite(cpu).any():
        cpu, gpu = np.nan_to_num(cpu), np.nan_to_num(gpu)
        sync = us_column(df, "sync_blocked")
        sync = np.zeros(len(df)) if sync is None else np.minimum(np.nan_to_num(sync), gpu)
        parts = {PART_CPU: cpu, PART_GPU: gpu - sync, PART_SYNC: sync}
    return {"x": x, "total": np.nan_to_num(total), "parts": parts}


def _gaps(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    sec = doc["gaps"]
    s.facts, s.tables = describe(sec)
    df = frame(res, ("gaps", "table", "items", "intervals"))
    durs = None
    if df is not None:
        durs = us_column(df, "dur", "duration", "length")
        if durs is None and {"start", "end"} <= set(df.columns):
            durs = (df["end"].to_numpy(float) - df["start"].to_numpy(float)) / 1000.0
    source = "all gaps"
    if durs is None:
        top, _ = pick(sec, "top", "items", "gaps")
        if isinstance(top, list):
            durs = np.array([r.get("dur_us", r.get("duration_us", np.nan)) for r in top if isinstance(r, dict)], float)
            source = f"the {len(durs)} largest gaps listed in the summary"
    if durs is not None and np.isfinite(durs).any():
        s.figures["gap_histogram"] = {"durations_us": durs[np.isfinite(durs)], "source": source}
    else:
        s.figure_notes["gap_histogram"] = "No GPU idle gaps above the minimum length in this trace."


def _syncs(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    sec = doc["syncs"]
    s.facts, _ = describe(sec, skip=("items",))
    items = sec.get("items")
    if isinstance(items, list) and items:
        ordered = sorted((r for r in items if isinstance(r, dict)), key=lambda r: -(r.get("blocked_us") or 0))
        s.tables = [("sync points, longest blocked first", records_table(ordered))]
    _, rest = describe(sec, skip=("items",))
    s.tables += rest


def _attention(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    sec = doc["attention"]
    s.facts, s.tables = describe(sec)
    fits = [f for f in sec.get("fits") or [] if isinstance(f, dict)]
    series = []
    for f in fits:
        pts = _points(f.get("points"))
        if pts is not None and len(pts[0]):
            series.append({"label": f"{f.get('phase', '?')} {f.get('op', '')}".strip(), "x": pts[0], "y": pts[1],
                           "exponent": f.get("exponent"), "stderr": f.get("exponent_stderr"),
                           "coefficient": f.get("coefficient", f.get("prefactor")), "intercept": f.get("intercept")})
    if series:
        s.figures["attention"] = series
    else:
        s.figure_notes["attention"] = "No attention calls with enough distinct sequence lengths to fit a scaling law."


def _points(p: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Fit points as given by the attention section: [[x, y], ...], [{x, y}], or {x: [...], y: [...]}."""
    if isinstance(p, dict):
        xs, ys = p.get("x", p.get("seq_len")), p.get("y", p.get("gpu_us"))
        if isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys):
            return np.asarray(xs, float), np.asarray(ys, float)
        return None
    if not isinstance(p, list) or not p:
        return None
    if all(isinstance(q, (list, tuple)) and len(q) >= 2 for q in p):
        return np.array([q[0] for q in p], float), np.array([q[1] for q in p], float)
    if all(isinstance(q, dict) for q in p):
        xk = next((k for k in ("x", "seq_len", "kv_len", "q_len", "length") if k in p[0]), None)
        yk = next((k for k in ("y", "gpu_us", "mean_us", "time_us", "dur_us") if k in p[0]), None)
        if xk and yk:
            return np.array([q.get(xk, np.nan) for q in p], float), np.array([q.get(yk, np.nan) for q in p], float)
    return None


def _roofline(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    """Per-phase totals and per-op groups as points; the roofs from the phase that states its peaks."""
    sec = doc["roofline"]
    s.facts, s.tables = describe(sec, skip=("peaks",))
    phases = sec.get("phases") if isinstance(sec.get("phases"), dict) else {}
    s.facts += [("verdict", str(p["verdict"])) for p in phases.values() if isinstance(p, dict) and p.get("verdict")]
    peak_tf = peak_bw = None
    pts = []
    for group, recs in (("phase", [dict(r, name=f"{k} (all ops)", phase=k) for k, r in phases.items() if isinstance(r, dict)]),
                        ("op", [r for r in sec.get("ops") or [] if isinstance(r, dict)])):
        for r in recs:
            ai, tf = r.get("intensity"), r.get("tflops")
            if fmt.is_number(r.get("peak_tflops")) and fmt.is_number(r.get("peak_gbs")) and peak_tf is None:
                peak_tf, peak_bw = float(r["peak_tflops"]), float(r["peak_gbs"])
            if fmt.is_number(ai) and fmt.is_number(tf) and ai > 0 and tf > 0:
                pts.append({"label": str(r.get("name") or r.get("kind") or group), "phase": r.get("phase"),
                            "intensity": float(ai), "tflops": float(tf), "group": group})
    if pts:
        s.figures["roofline"] = {"points": pts[:MAX_POINTS], "peak_tflops": peak_tf, "peak_gbps": peak_bw}
    else:
        s.figure_notes["roofline"] = "No matmul or attention calls with shapes and dtypes to place on a roofline."


def _memory(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    sec = doc["memory"]
    s.facts, s.tables = describe(sec)
    df = frame(res, ("timeline", "series", "usage", "table"), needs=("ts",))
    if df is not None:
        ts = df["ts"].to_numpy(float)
        alloc = df[first_col(df, "allocated", "total_allocated", "allocated_bytes") or "ts"].to_numpy(float)
        resv_col = first_col(df, "reserved", "total_reserved", "reserved_bytes")
        resv = df[resv_col].to_numpy(float) if resv_col else None
    elif trace is not None and not trace.memory.empty:
        m = trace.memory
        ts = m["ts"].to_numpy(float)
        alloc = m["total_allocated"].to_numpy(float)
        resv = m["total_reserved"].to_numpy(float)
    else:
        s.figure_notes["memory"] = "The trace has no memory events (profile with profile_memory=True)."
        return
    keep = _thin(len(ts))
    s.figures["memory"] = {"t_ms": (ts[keep] - t0_ns) / 1e6, "allocated": alloc[keep],
                           "reserved": None if resv is None else resv[keep]}


def _thin(n: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indices keeping at most `limit` samples, evenly spread (always the first and last)."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).astype(np.int64))


# Rows per phase in the top ops / kernels tables.
TOP_PER_PHASE = 12


def _shapes(s: Section, doc: dict[str, Any], res: Any, trace: Any, t0_ns: int) -> None:
    """Top ops and kernels, one table per phase (rows keep the section's order: most GPU time first)."""
    sec = doc["shapes"]
    s.facts, _ = describe(sec, skip=("ops", "kernels"))
    for key in ("ops", "kernels"):
        rows = [r for r in sec.get(key) or [] if isinstance(r, dict)]
        by_phase: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_phase.setdefault(str(r.get("phase") or "all"), []).append(r)
        for phase, recs in by_phase.items():
            t = records_table([{k: v for k, v in r.items() if k != "phase"} for r in recs], max_rows=TOP_PER_PHASE)
            s.tables.append((f"top {key} in {phase}", t))
    if not any(sec.get(k) for k in ("ops", "kernels")):
        s.message = "No ops or kernels with GPU time in this trace."


BUILDERS = {"phases": _phases, "shapes": _shapes, "gaps": _gaps, "syncs": _syncs, "attention": _attention, "roofline": _roofline,
            "memory": _memory}


# ---- timeline ----------------------------------------------------------------------------
def _timeline(doc: dict[str, Any], results: dict[str, Any], trace: Any, t0_ns: int) -> tuple[dict[str, Any] | None, str]:
    """GPU busy share per time bin, phase bands and sync points, times in ms from trace start."""
    if trace is None:
        return None, "No trace attached to this analysis: no timeline."
    busy = getattr(results.get("gpu"), "busy", None)  # analyze.utilization.BusyTimeline
    if busy is not None and getattr(busy, "starts", None):
        starts = np.concatenate([busy.starts[d] for d in busy.devices])
        ends = np.concatenate([busy.ends[d] for d in busy.devices])
    else:
        g = trace.gpu
        if g.empty:
            return None, "This trace has no GPU kernels, copies or memsets: no GPU timeline."
        starts, ends = g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64)
    span = trace.span_ns
    edges = np.linspace(span[0], max(span[1], span[0] + 1), TIMELINE_BINS + 1)
    busy = busy_per_bin(starts, ends, edges)
    out: dict[str, Any] = {"edges_ms": (edges - t0_ns) / 1e6, "busy": busy, "bands": [], "syncs_ms": np.empty(0)}
    ph = results.get("phases")
    seg = getattr(ph, "segments", None)
    table = getattr(seg, "table", None)
    if isinstance(table, pd.DataFrame) and not table.empty:
        out["bands"] = [(str(p), (a - t0_ns) / 1e6, (b - t0_ns) / 1e6)
                        for p, a, b in zip(table["phase"], table["start"].to_numpy(float), table["end"].to_numpy(float))]
    sy = frame(results.get("syncs"), ("items",), needs=("start_us",))
    if sy is not None:
        out["syncs_ms"] = sy["start_us"].to_numpy(float) / 1e3
    else:
        items = dig(doc, "syncs.items") or []
        out["syncs_ms"] = np.array([r["start_us"] / 1e3 for r in items if isinstance(r, dict) and fmt.is_number(r.get("start_us"))])
    out["syncs_ms"] = out["syncs_ms"][_thin(len(out["syncs_ms"]))]
    return out, ""


def busy_per_bin(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of each bin covered by at least one interval (intervals may overlap: streams run in parallel).

    Drawing preparation, vectorised: overlapping intervals are merged (running maximum of ends),
    then the covered time up to each bin edge is read off the cumulative coverage.
    """
    if len(starts) == 0:
        return np.zeros(len(edges) - 1)
    order = np.argsort(starts, kind="stable")
    s = starts[order].astype(np.float64)
    e = np.maximum.accumulate(ends[order].astype(np.float64))
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    gid = np.cumsum(new) - 1
    ms = s[new]
    me = np.zeros(len(ms))
    np.maximum.at(me, gid, e)
    cum = np.concatenate([[0.0], np.cumsum(me - ms)])  # covered time before each merged interval

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ms, t, side="right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        inside = np.where(i > 0, np.clip(t - ms[j], 0, me[j] - ms[j]), 0.0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + inside

    c = covered(edges)
    width = np.diff(edges)
    return np.clip(np.diff(c) / np.where(width > 0, width, 1), 0.0, 1.0)

