"""Builds the report view (reports.model) from Analyses: summary, one section per question, appendix, reproduce.

Owns the order and the assembly; what each part says is in reports.summary and reports.sections.
A section whose results are absent says so in one line; one whose detector failed says why; one
that cannot be built from its results (a bug, or a result shape the report does not know) says
that in its place and, under TOKENTRACE_DEBUG=1, raises. The report tests render every real
trace and require no section in that last state, so a renamed result field fails a test.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokentrace.reports import format as fmt
from tokentrace.reports import summary as sm
from tokentrace.reports.model import AppendixGroup, Column, Fact, FindingView, ReportView, Section, Table, TraceView
from tokentrace.reports.sections import SECTIONS, health
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec

if TYPE_CHECKING:
    from tokentrace.analysis.compare.sweep import SweepResult
    from tokentrace.analysis.pipeline import Analysis

# Facts per appendix group: a JSON summary of a huge trace stays readable and the page small.
MAX_APPENDIX_FACTS = 300
# Scalars of a list shown in one appendix cell.
MAX_LIST_ITEMS = 12
# What an appendix value reads like when it is a table (the sections show those tables).
RECORDS = "{n} records: see the tables above or the JSON summary"


def section(spec: SectionSpec, inp: Inputs) -> Section:
    s = Section(key=spec.key, title=spec.title, template=spec.template)
    failed = [k for k in spec.results if k in inp.analysis.errors]
    absent = [k for k in spec.results if k not in inp.analysis.results]
    if failed:
        s.status = "error"
        s.message = "; ".join(f"The {k} analysis failed on this trace: {inp.analysis.errors[k]}" for k in failed)
        return s
    if absent and inp.analysis.summary_only:
        s.status, s.message = "absent", ("Built from this trace's JSON summary (analysed on Dask workers): this section needs "
                                         "the trace itself; run the report without --workers/--scheduler for it.")
        return s
    if absent:
        s.status, s.message = "absent", f"Not analysed: the {', '.join(absent)} detector did not run on this trace."
        return s
    try:
        spec.build(inp, s)
    except Lacks as why:
        s.status, s.message = "empty", str(why)
        s.figure, s.prose, s.tables, s.callout = None, [], [], ""
    except Exception as exc:  # noqa: BLE001 - one section that cannot be drawn must not lose the report
        if os.environ.get("TOKENTRACE_DEBUG"):
            raise
        s.status = "error"
        s.message = f"This section could not be built from the analysis ({type(exc).__name__}: {exc})."
        s.figure, s.prose, s.tables, s.callout = None, [], [], ""
    return s


# ---- appendix -------------------------------------------------------------------------------
def _value(key: str, v: Any) -> str | None:
    """One appendix value, or None for what is not worth a line (empty containers)."""
    if isinstance(v, list):
        if not v:
            return None
        if all(isinstance(x, dict) for x in v):
            return RECORDS.format(n=len(v))
        if all(isinstance(x, (list, tuple)) for x in v):
            return fmt.shorten(", ".join("[" + ", ".join(str(y) for y in x) + "]" for x in v), 160)
        shown = ", ".join(fmt.shorten(x, 120) if isinstance(x, str) else fmt.number(x) for x in v[:MAX_LIST_ITEMS])
        return shown + (f", ... ({len(v)} in all)" if len(v) > MAX_LIST_ITEMS else "")
    if isinstance(v, str):
        return fmt.shorten(v, 240)
    return fmt.by_key(key, v)


def flatten(doc: dict[str, Any], prefix: str = "") -> list[Fact]:
    """Every scalar of a JSON object as 'dotted.key: value' (units read from the key names)."""
    out: list[Fact] = []
    for k, v in doc.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out += flatten(v, path + ".")
            continue
        text = _value(str(k), v)
        if text is not None:
            out.append(Fact(path, text))
    return out


def appendix(inp: Inputs) -> list[AppendixGroup]:
    from tokentrace.analysis.detectors.overview import Overview

    groups = []
    ov = inp.optional("trace", Overview)
    if ov is not None and ov.capture:
        groups.append(AppendixGroup("Capture metadata (the trace's tokentrace key)", flatten(ov.capture)[:MAX_APPENDIX_FACTS]))
    for key, sec in inp.doc.items():
        if key in ("schema_version", "tool", "findings") or not isinstance(sec, dict):
            continue
        if key == "trace":
            sec = {k: v for k, v in sec.items() if k != "capture"}
        groups.append(AppendixGroup(f"JSON summary: {key}", flatten(sec, f"{key}.")[:MAX_APPENDIX_FACTS]))
    return groups


# ---- reproduce ------------------------------------------------------------------------------
def option_flags(analysis: Analysis) -> list[str]:
    """Command-line flags for the analysis options that differ from their defaults."""
    from tokentrace.analysis.pipeline import Options
    from tokentrace.cli.analyze import analyze_cmd

    flags = {p.name: p.opts[0] for p in analyze_cmd.params}
    default = Options()
    out: list[str] = []
    if analysis.options is None:
        return out
    for f in dataclasses.fields(Options):
        v = getattr(analysis.options, f.name)
        if v == getattr(default, f.name):
            continue
        if f.name == "phases":  # ((role, regex), ...) -> --phase role=regex
            out += [f"--phase {shlex.quote(f'{role}={rx}')}" for role, rx in v]
        elif f.name in flags and isinstance(v, tuple):  # a repeatable option
            out += [f"{flags[f.name]} {shlex.quote(str(x))}" for x in v]
        elif f.name in flags and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(f"{flags[f.name]} {v:g}")
        else:
            out.append(f"# Options({f.name}={v!r})")
    return out


def command(analyses: Sequence[Analysis], fmt_flag: str, output: str | None) -> str:
    """The command that makes this report again; `output` is the file it was written to, when known."""
    # The file this report went to; a report returned as a string gets the usual name.
    name = shlex.quote(output) if output else {"--html": "report.html", "--markdown": "summary.md"}[fmt_flag]
    flags = option_flags(analyses[0])
    opts = " ".join(f for f in flags if not f.startswith("#"))
    paths = " ".join(shlex.quote(a.trace.path) for a in analyses)
    if len(analyses) == 1:
        cmd = f"tokentrace analyze {paths}{' ' + opts if opts else ''} {fmt_flag} {name}"
    else:
        cmd = f"tokentrace report {paths}{' ' + opts if opts else ''} -o {name}"
    notes = [f for f in flags if f.startswith("#")]
    return "\n".join([cmd, *notes])


def capture_command(inp: Inputs) -> str | None:
    from tokentrace.analysis.detectors.overview import Overview

    ov = inp.optional("trace", Overview)
    cmd = None if ov is None else ov.capture.get("command")  # absent in traces not made by the capture module
    if isinstance(cmd, list):
        return shlex.join(str(x) for x in cmd)
    return cmd if isinstance(cmd, str) else None


# ---- assembly -------------------------------------------------------------------------------
def trace_view(analysis: Analysis) -> TraceView:
    inp = Inputs(analysis, analysis.to_json())
    # Sections about what only some traces hold (collectives, graph launches, engine steps) appear where they are.
    specs = [spec for spec in SECTIONS if spec.shown is None or spec.shown(inp.doc)]
    sections = [section(spec, inp) for spec in specs]
    findings = [sm.finding(f) for f in analysis.findings]
    claimed: dict[str, Section] = {c: s for spec, s in zip(specs, sections, strict=True) for c in spec.categories}
    other: list[FindingView] = []
    for f in findings:
        home = claimed.get(f.category)
        (home.findings if home is not None else other).append(f)
    headline, note = sm.headline(inp.doc)
    try:
        timeline, tnote = sm.timeline(inp)
    except Exception as exc:  # noqa: BLE001 - as for a section: say so in its place, raise under TOKENTRACE_DEBUG
        if os.environ.get("TOKENTRACE_DEBUG"):
            raise
        timeline, tnote = None, f"The timeline could not be built from the analysis ({type(exc).__name__}: {exc})."
    checks = health.checklist(inp)
    return TraceView(title=analysis.trace.path, facts=sm.facts(inp), latency_note=note, headline=headline,
                     warnings=sm.warnings(inp), findings=findings, timeline=timeline, timeline_note=tnote, sections=sections,
                     other_findings=other, appendix=appendix(inp), capture_command=capture_command(inp),
                     compare={label: sm.metric_text(key, inp.doc)[0] for key, label in COMPARE},
                     health_note=checks[0] if checks else "", health=checks[1] if checks else None)


# Columns of the comparison table of a report over several traces: (metric key, label).
COMPARE = (("ttft_unprofiled_us", "TTFT, no profiler"), ("ttft_us", "TTFT, profiled"), ("tpot_p50_unprofiled_us", "TPOT p50, no profiler"),
           ("tpot_p50_us", "TPOT p50, profiled"), ("gpu_utilization", "GPU utilisation"),
           ("launch_bound_share_decode", "launch-bound (decode)"), ("syncs_per_token", "syncs per token"))


def compare_table(views: list[TraceView]) -> Table:
    """One row per trace; a column no trace has (no capture timings anywhere) is left out."""
    labels = [label for _, label in COMPARE if any(v.compare[label] != fmt.MISSING for v in views)]
    cols = [Column("trace", code=True)] + [Column(label, numeric=True) for label in labels] + [Column("findings", numeric=True)]
    rows: list[list[Any]] = [[v.name, *(v.compare[label] for label in labels), fmt.number(len(v.findings))] for v in views]
    return Table("Headline of each trace", cols, rows)


def distinct_names(paths: list[str]) -> list[str]:
    """The paths without the folders they all share: a sweep's runs are all called combined.pt.trace.json.gz."""
    if len(paths) < 2:
        return [os.path.basename(p) for p in paths]
    try:
        common = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
    except ValueError:  # paths on different drives
        return paths
    return [os.path.relpath(os.path.abspath(p), common) for p in paths]


def build(analyses: Analysis | Sequence[Analysis], fmt_flag: str = "--html", output: str | os.PathLike[str] | None = None,
          sweeps: Sequence[SweepResult] = ()) -> ReportView:
    """The view of a report over one or more analyses (one block per trace, a comparison first when
    several, each capture sweep's table before them, the ranks compared when they are one job's)."""
    from tokentrace import __version__
    from tokentrace.reports.ranks import of_analyses
    from tokentrace.reports.sweep import sweep_table

    items = list(analyses) if isinstance(analyses, Sequence) else [analyses]
    if not items:
        raise ValueError("a report needs at least one analysis")
    views = [trace_view(a) for a in items]
    for v, name in zip(views, distinct_names([v.title for v in views]), strict=True):
        v.name = name
    return ReportView(version=__version__, traces=views, compare=compare_table(views) if len(views) > 1 else None,
                      command=command(items, fmt_flag, None if output is None else os.fspath(output)),
                      sweeps=[sweep_table(sw) for sw in sweeps], ranks=of_analyses(items))
