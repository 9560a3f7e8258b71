"""Capture folders as inputs: what `tokentrace capture` writes, recognised by its run.json.

Owns the mapping from a folder a user points at to the traces a command should read:

- a run folder (run.json with a `traces` table, beside combined/prefill/decode or generate traces)
  is one run of one model at one shape: commands analyse its combined trace (prefill and decode
  are the same generation profiled in two sessions, not more ranks or steps);
- a sweep folder (run.json with a `runs` list, one run folder per prompt length x batch x
  compile mode) is many runs: `analyze` and `report` tabulate them, `diff` pairs them, `check`
  checks each, `scaling` fits across them, and `ranks` refuses it (its runs are not ranks);
- a folder without run.json whose subfolders are run folders counts as a sweep of those runs.

Anything else (a trace file, a folder of rank traces) is not a capture folder: `resolve` returns
None and the caller reads it as before. Reads JSON only; never imports the capture code's torch side.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentrace.errors import TokentraceError
from tokentrace.profiling.conventions import (
    KIND_COMBINED,
    KIND_DECODE,
    KIND_GENERATE,
    KIND_PREFILL,
    KIND_USER,
    RUN_JSON,
    TRACE_SUFFIX,
)

# Which trace of a run stands for the run, best first: the combined trace holds the whole
# generation (prefill and every decode step in one session); a generate-mode run has only its
# generate trace; prefill and decode alone are the last resort (each holds half of the run).
ANALYSIS_KINDS = (KIND_COMBINED, KIND_GENERATE, KIND_USER, KIND_PREFILL, KIND_DECODE)


@dataclass(frozen=True)
class CaptureRun:
    """One run of a capture: a model at one prompt length, batch size, compile mode and attention backend."""

    name: str
    folder: Path
    traces: dict[str, Path]  # kind -> trace file
    prompt_len: int | None = None
    batch: int | None = None
    compile: str | None = None
    attention: str | None = None
    static_cache: bool | None = None
    meta: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the run within a sweep (and pairs runs of two sweeps): its shape and settings."""
        return (self.prompt_len, self.batch, self.compile, self.attention)

    def analysis_trace(self) -> tuple[str, Path]:
        """(kind, path) of the trace that stands for this run (see ANALYSIS_KINDS)."""
        for kind in ANALYSIS_KINDS:
            if kind in self.traces:
                return kind, self.traces[kind]
        if self.traces:
            kind = sorted(self.traces)[0]
            return kind, self.traces[kind]
        raise TokentraceError(f"{self.folder}: capture run folder holds no trace files")

    def pick_note(self) -> str:
        """The line that says which file a command read for this run."""
        kind, path = self.analysis_trace()
        others = sorted(k for k in self.traces if k != kind)
        rest = f" (also here: {', '.join(others)}, the same generation in separate sessions)" if others else ""
        return f"{self.folder}: capture run folder; analysing its {kind} trace {path.name}{rest}"


@dataclass(frozen=True)
class CaptureSweep:
    """A capture of several runs (written by one `tokentrace capture` or gathered into one folder)."""

    folder: Path
    runs: list[CaptureRun]
    meta: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TokentraceError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    except ValueError as exc:
        raise TokentraceError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise TokentraceError(f"{path}: not a capture run.json (expected a JSON object)")
    return doc


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return str(v) if isinstance(v, str) else None


def _kind_of(name: str) -> str:
    return name[: -len(TRACE_SUFFIX)] if name.endswith(TRACE_SUFFIX) else name.split(".", 1)[0]


def _traces(folder: Path, listed: Any, base: Path) -> dict[str, Path]:
    """Trace files of a run: as run.json lists them (paths relative to `base`), else found by name."""
    out: dict[str, Path] = {}
    if isinstance(listed, dict) and listed:
        for kind, rel in listed.items():
            if not isinstance(rel, str):
                continue
            path = base / rel
            if not path.is_file():
                raise TokentraceError(f"{folder / RUN_JSON}: lists the {kind} trace {rel}, which does not exist")
            out[str(kind)] = path
        return out
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name.endswith((".json", ".json.gz")) and f.name != RUN_JSON and not f.name.startswith("."):
            out[_kind_of(f.name)] = f
    return out


def _run(folder: Path, doc: dict[str, Any], shared: dict[str, Any] | None = None, base: Path | None = None,
         name: str | None = None) -> CaptureRun:
    meta = {**(shared or {}), **doc}
    return CaptureRun(
        name=name or _str(doc.get("name")) or folder.name,
        folder=folder,
        traces=_traces(folder, doc.get("traces"), base or folder),
        prompt_len=_int(meta.get("prompt_len")),
        batch=_int(meta.get("batch")),
        compile=_str(meta.get("compile")),
        attention=_str(meta.get("attn_implementation")),
        static_cache=meta.get("static_cache") if isinstance(meta.get("static_cache"), bool) else None,
        meta=meta,
    )


def _sweep_of_runs(folder: Path, doc: dict[str, Any]) -> CaptureSweep:
    shared = doc.get("shared") if isinstance(doc.get("shared"), dict) else {}
    runs = []
    for entry in doc["runs"]:
        if not isinstance(entry, dict):
            raise TokentraceError(f"{folder / RUN_JSON}: a `runs` entry is not an object")
        rel = entry.get("dir") or entry.get("name")
        run_dir = folder / str(rel) if isinstance(rel, str) else folder
        runs.append(_run(run_dir, entry, shared, base=folder, name=_str(entry.get("name"))))
    if not runs:
        raise TokentraceError(f"{folder / RUN_JSON}: capture sweep lists no runs")
    return CaptureSweep(folder, runs, doc)


def resolve(path: str | os.PathLike[str]) -> CaptureRun | CaptureSweep | None:
    """The capture run or sweep a folder holds; None for anything else (a file, a folder of traces)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    run_json = folder / RUN_JSON
    if run_json.is_file():
        doc = _read_json(run_json)
        if isinstance(doc.get("runs"), list):
            return _sweep_of_runs(folder, doc)
        run = _run(folder, doc)
        if not run.traces:
            raise TokentraceError(f"{folder}: capture run folder holds no trace files")
        return run
    subs = sorted(d for d in folder.iterdir() if d.is_dir() and (d / RUN_JSON).is_file())
    if not subs:
        return None
    runs = []
    for d in subs:
        found = resolve(d)
        if isinstance(found, CaptureRun):
            runs.append(found)
    return CaptureSweep(folder, runs) if runs else None


def run_or_path(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """The trace a single-trace command reads for `path`, and the note saying which (None when `path`
    is not a capture folder). A sweep of one run stands for that run; a sweep of several is refused."""
    found = resolve(path)
    if found is None:
        return Path(path), None
    if isinstance(found, CaptureSweep):
        if len(found.runs) != 1:
            raise TokentraceError(f"{path}: a capture sweep folder of {len(found.runs)} runs; give one run folder "
                                  f"(e.g. {found.runs[0].folder}), or the whole sweep to `tokentrace analyze`/`report` "
                                  "(tokentrace.sweep in Python)")
        found = found.runs[0]
    return found.analysis_trace()[1], found.pick_note()


def rank_paths(paths: list[str | os.PathLike[str]]) -> list[str | os.PathLike[str]]:
    """Paths for `ranks`: a capture run folder is one rank (its combined trace), not its three traces;
    a sweep folder is refused, since its runs are shapes of one model, not ranks of one job."""
    out: list[str | os.PathLike[str]] = []
    for p in paths:
        found = resolve(p)
        if isinstance(found, CaptureSweep):
            raise TokentraceError(f"{p}: a capture sweep folder ({len(found.runs)} runs at different shapes), not "
                                  "the ranks of one job; use `tokentrace analyze` or `report` on it")
        out.append(found.analysis_trace()[1] if isinstance(found, CaptureRun) else p)
    return out
