"""The detector pipeline and the Analysis: every detector's result for one trace, plus the JSON summary.

Owns the pipeline: the ordered list of detector modules, the context they share (options and the
results of detectors that ran before them), and the Analysis object users hold. Detectors are
modules with `run(trace, ctx) -> result`, where a result has `to_json() -> dict` and a `findings`
list (and DataFrames for notebook users). A detector that fails on odd input does not take the
others down: its section records the error and a warning names it.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analysis.common import nsys_rules
from tokentrace.analysis.findings import Finding, rank
from tokentrace.analysis.loading.loader import load
from tokentrace.analysis.loading.trace import Trace
from tokentrace.analysis.segments import Segments

# Version of the JSON summary. Bump on any change that renames or removes a key; adding keys is
# compatible. Scripts and `tokentrace check` rely on these keys.
SCHEMA_VERSION = 1

# Detector modules in run order (later ones may read earlier results through the context).
DETECTORS: tuple[tuple[str, str], ...] = (
    ("trace", "tokentrace.analysis.detectors.overview"),
    ("phases", "tokentrace.analysis.detectors.phases"),
    ("gpu", "tokentrace.analysis.detectors.utilization"),
    ("gaps", "tokentrace.analysis.detectors.gaps"),
    ("launches", "tokentrace.analysis.detectors.launches"),
    ("syncs", "tokentrace.analysis.detectors.syncs"),
    ("shapes", "tokentrace.analysis.detectors.shapes"),
    ("attention", "tokentrace.analysis.detectors.attention"),
    ("roofline", "tokentrace.analysis.detectors.roofline"),
    ("memory", "tokentrace.analysis.detectors.memory"),
)


@dataclass
class Options:
    """Analysis settings a user can change; each default is explained where it is used."""

    # Smallest GPU idle interval reported as a gap. Decode steps run kernels of a few
    # microseconds, so Nsight Systems' 500 ms default would hide everything that matters.
    min_gap_us: float = 3.0
    # Nsight Systems' expert-rule thresholds (analysis.common.nsys_rules explains each default).
    nsys_gap_ms: float = nsys_rules.GAP_MS
    nsys_util_chunks: int = nsys_rules.UTIL_CHUNKS
    nsys_util_threshold: float = nsys_rules.UTIL_THRESHOLD_PCT
    # Loading a path (analysis.loading.loader.load): the most uncompressed JSON to read (bytes
    # or text such as "8G"; None: $TOKENTRACE_MAX_TRACE_SIZE, else half of memory) and whether
    # to use the cache of loaded traces (None: yes, unless $TOKENTRACE_NO_CACHE is set).
    max_trace_size: int | str | None = None
    cache: bool | None = None


@dataclass
class Context:
    options: Options
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def segments(self) -> Segments:
        """Phase segmentation when the phases detector ran, else an empty Segments."""
        ph = self.results.get("phases")
        seg = getattr(ph, "segments", None)
        return seg if isinstance(seg, Segments) else Segments()


@dataclass(eq=False)
class Analysis:
    trace: Trace
    options: Options
    results: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        # analysis.phases, analysis.gaps, ...: the detector results by section name.
        results = self.__dict__.get("results", {})
        if name in results:
            return results[name]
        raise AttributeError(name)

    @property
    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for res in self.results.values():
            out.extend(getattr(res, "findings", []) or [])
        return rank(out)

    def to_json(self) -> dict[str, Any]:
        from tokentrace import __version__

        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": {"name": "tokentrace", "version": __version__}}
        for name, _ in DETECTORS:
            if name in self.errors:
                doc[name] = {"error": self.errors[name]}
            elif name in self.results:
                doc[name] = self.results[name].to_json()
        doc["findings"] = [f.to_json() for f in self.findings]
        return doc

    def to_html(self, path: str | os.PathLike | None = None) -> str:
        from tokentrace.reports.html import render_html

        return render_html(self, path)

    def to_markdown(self, path: str | os.PathLike | None = None) -> str:
        from tokentrace.reports.markdown import render_markdown

        return render_markdown(self, path)


def run_pipeline(trace: Trace | str | os.PathLike[str], options: Options | None = None) -> Analysis:
    """Run every detector on a trace (or a path to one); `tokentrace.analyze` is the public face."""
    opts = options or Options()
    if not isinstance(trace, Trace):
        trace = load(trace, max_trace_size=opts.max_trace_size, cache=opts.cache)
    ctx = Context(options=opts)
    errors: dict[str, str] = {}
    for name, module in DETECTORS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue  # detector not part of this build
            raise
        try:
            ctx.results[name] = mod.run(trace, ctx)
        except Exception as exc:  # noqa: BLE001 - one detector's failure must not hide the others
            if os.environ.get("TOKENTRACE_DEBUG"):
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"tokentrace: warning: {trace.path}: {name} analysis failed ({errors[name]})", file=sys.stderr)
    return Analysis(trace=trace, options=opts, results=ctx.results, errors=errors)
