"""The `phases` section: prefill passes, decode and mixed steps, TTFT and TPOT, and what bounds each step.

Owns segmentation, the Segments every other detector reads (analyze.segments). Sources, in order
of trust (the JSON's `method` says which was used, `source` what it read):

1. `annotations` (exact): the capture module's record_function ranges `tokentrace/prefill`,
   `tokentrace/decode_step[i]` (and `tokentrace/tokenize`, kept as phase "other").
2. `framework_markers` (exact): a serving engine's step annotations, parsed by
   analyze.common.engine_steps (vLLM's `execute_..._context_..._generation_...`, SGLang's
   `step[DECODE bs=32]`, graph-capture `capture_<bs>_<MODE>`): each step's kind (prefill, decode,
   mixed, idle) and its requests and tokens come from the name. vLLM's `execute_model`
   (record_function or Python frame) marks steps without saying their kind (high confidence).
3. `user_annotations` (high): the user's own record_function names matching the phase patterns
   (analyze.common.phase_patterns: defaults, or `--phase prefill=REGEX`).
4. `profiler_steps` (high): `ProfilerStep#N`, when each holds at most one forward pass.
5. `inferred` (medium; low when a forward's query length is unknown): forward passes found in the
   trace itself, each opening at a token-embedding lookup (`aten::embedding`; the embeddings of
   one forward, e.g. token + position, have no attention op between them) and running to the next
   one, bounded by the ProfilerStep (or the user's `request` annotation) that holds it. This also
   splits a ProfilerStep that holds a whole `generate()`.

Segments whose phase the source does not give (`execute_model`, sources 4-5) get it from the shapes
recorded inside them: tokens per sequence of the embedding (Input Dims[1] = (batch, tokens)) or the
attention query length; more than one token is a prefill, exactly one a decode step. A step that
runs backward or an optimizer is a training step (phase "step"), as is any step without shape
evidence: absent phases are reported absent, never guessed. Measures live in analyze.latency, the
critical path in analyze.critical_path, per-step serving numbers in analyze.common.serving.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import EMBEDDING_OPS, TRAINING_OP_MARKERS
from tokentrace.analysis.common import critical_path as cp
from tokentrace.analysis.common import fits, serving, steady_state
from tokentrace.analysis.common import latency as lat
from tokentrace.analysis.common import phase_patterns as pp
from tokentrace.analysis.common import step_markers as sm
from tokentrace.analysis.common.attention_ops import OPS_RE, attention_at, attention_op_spec, parse_shapes
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding
from tokentrace.analysis.loading.trace import OP_COLUMNS, PYTHON_COLUMNS, Trace, numpy_column
from tokentrace.analysis.segments import SEGMENT_COLUMNS, Segments, first_rows
from tokentrace.profiling.conventions import ANNOTATION_PREFIX, decode_step_name
from tokentrace.profiling.conventions import PREFILL as PREFILL_ANNOTATION
from tokentrace.profiling.conventions import TOKENIZE as TOKENIZE_ANNOTATION

NAME = "phases"
NEEDS: tuple[str, ...] = ()
OPTIONS = ("phases",)

# The capture module's annotation names come from its conventions (stdlib only: no torch). A
# decode step's name is decode_step_name(i); the text around the index is matched here.
_STEP_HEAD, _STEP_TAIL = decode_step_name(0).rsplit("0", 1)
_DECODE_STEP = re.compile("^" + re.escape(_STEP_HEAD) + r"(\d+)" + re.escape(_STEP_TAIL) + "$")
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_TOKENTRACE_NAME = re.compile("^" + re.escape(ANNOTATION_PREFIX))
# vLLM: the model runner's execute_model, as a record_function or a Python frame "...py(N): execute_model".
_VLLM_STEP = re.compile(r"(?:^|: |\.)execute_model$")
# Fewest cpu ops between two embedding lookups for them to open separate forwards, used only when
# a trace has no attention op to tell forwards apart: a decoder layer alone runs more ops than this.
MIN_OPS_PER_FORWARD = 8

_TRAINING = re.compile("^(?:" + "|".join(re.escape(m) for m in TRAINING_OP_MARKERS) + ")")
# Query/key layout of each attention op pattern (analysis.common.attention_ops owns the table; first match wins).
_ATTENTION_LAYOUTS = [(pattern, spec[1]) for pattern, spec in OPS_RE]

# Share of decode step time on neither side of the critical path (waits on device work the trace
# did not record, launch latency) above which the TPOT line says so: the verdict then covers
# only a minority of the step.
WAIT_SHARE_TO_SHOW = 0.25

CONFIDENCE = {"annotations": "exact", "framework_markers": "exact", "user_annotations": "high", "profiler_steps": "high",
              "inferred": "medium", "none": "none"}


# ---- segmentation ----------------------------------------------------------------------------------

# A segment table's columns by name, before it is framed (arrays, lists, or a frame's Series).
Columns = dict[str, Any]


def _frame(start, end, name, tid, phase, batch=None, q_len=None, step=None) -> Columns:
    """A segment table's columns (framed once, when segment() has them all: a frame built per
    step of the segmentation cost ~0.5 ms each). Texts as lists, as the frame was given them."""
    n = len(start)
    none = np.full(n, -1, np.int64)
    return {
        "start": np.asarray(start, np.int64), "end": np.asarray(end, np.int64), "name": list(name),
        "tid": np.asarray(tid, np.int64), "phase": list(phase),
        "batch": none if batch is None else np.asarray(batch, np.int64),
        "q_len": none if q_len is None else np.asarray(q_len, np.int64),
        "step": none if step is None else np.asarray(step, np.int64),
    }


def _in_start_order(table: pd.DataFrame | Columns) -> Columns:
    """The table's columns in start order (a stable sort, as sort_values("start", kind="stable")
    and reset_index give them). An engine's table (a frame) and an empty one go through pandas:
    their columns' dtypes are pandas' to keep (an empty list frames as float64)."""
    if isinstance(table, pd.DataFrame) or not len(table["start"]):
        frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
        start = numpy_column(frame, "start")
        if len(start) and frame.index.equals(pd.RangeIndex(len(start))) and bool((start[1:] >= start[:-1]).all()):
            return dict(frame.items())  # in order and numbered already (an engine's steps): no copy sorted
        return dict(frame.sort_values("start", kind="stable").reset_index(drop=True).items())
    start = table["start"]
    if bool((start[1:] >= start[:-1]).all()):  # most sources give them in order: a stable sort keeps it
        return dict(table)
    order = np.argsort(start, kind="stable")
    at = order.tolist()
    return {c: [v[i] for i in at] if isinstance(v, list) else v[order] for c, v in table.items()}


# The columns of user annotations the segmenter reads: a narrow view of them, not the wide
# `trace.annotations` (every one of the events' 40-odd columns copied).
ANNOTATION_COLUMNS = ("ts", "end", "name", "tid")


def _annotations(trace: Trace) -> pd.DataFrame:
    return trace.narrow(("user_annotation",), ANNOTATION_COLUMNS)


def _tokentrace_annotations(trace: Trace) -> Columns | None:
    ann = _annotations(trace)
    hit = lat.regex_mask(ann["name"], _TOKENTRACE_NAME)
    if not hit.any():
        return None
    mine = ann[hit]
    n = mine["name"].astype(str)
    step = n.str.extract(_DECODE_STEP)[0]
    phase = np.where(n == PREFILL_ANNOTATION, "prefill", np.where(step.notna(), "decode", "other"))
    if not np.isin(phase, ("prefill", "decode")).any():
        return None
    return _frame(mine["ts"], mine["end"], n, mine["tid"], phase, step=pd.to_numeric(step, errors="coerce").fillna(-1).astype(np.int64))


def _framework_markers(trace: Trace) -> tuple[pd.DataFrame | Columns | None, str | None]:
    """(segments, confidence): engine step annotations (exact), else vLLM's execute_model (high)."""
    ann = _annotations(trace)
    engine = sm.engine_segments(ann)
    if engine is not None:
        return engine, "exact"
    if not _any_name_matches(trace, _VLLM_STEP, "execute_model"):  # most traces: their Python frames' view is not built for this
        return None, None
    vl = _matching((ann, trace.narrow(("python_function",), PYTHON_COLUMNS)), _VLLM_STEP)
    if len(vl):
        vl = vl.outermost()
        return _frame(vl.ts, vl.end, vl.name, vl.tid, ["?"] * len(vl)), "high"
    return None, None


def _any_name_matches(trace: Trace, pattern: re.Pattern[str], needle: str = "") -> bool:
    """Whether any name of the trace's events may match (its categories searched; True when the
    names are not categorical, so that the views are searched). `needle`: text every match
    contains, tested first (a substring test is a tenth of a regex search; thousands of names)."""
    names = trace.events["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        return True
    return any(needle in c and pattern.search(c) for c in map(str, names.array.categories.tolist()))


def _matching(frames: tuple[pd.DataFrame, ...], pattern: re.Pattern[str]) -> sm.Ranges:
    """Ranges of the rows of several views whose name matches, view after view (the matches'
    columns as arrays: a frame of a large view's rows cost more than the match)."""
    return sm.Ranges.concat([sm.Ranges.of_rows(f, lat.regex_mask(f["name"], pattern)) for f in frames])


def _profiler_steps(trace: Trace) -> sm.Ranges:
    """The outermost ProfilerStep#N ranges, in start order."""
    # Current traces record ProfilerStep#N as a user_annotation, 2021-era ones as a cpu_op.
    return _matching((_annotations(trace), trace.narrow(("cpu_op",), OP_COLUMNS)), _PROFILER_STEP).outermost()


class OpMarks(NamedTuple):
    """Per row of the cpu ops' view (trace.narrow(("cpu_op",), OP_COLUMNS)): whether it is an
    attention op, and whether an embedding lookup. Marked once for every reader."""

    attention: np.ndarray
    embedding: np.ndarray


def op_marks(trace: Trace, spec: np.ndarray) -> OpMarks:
    """The cpu ops' OpMarks (`spec`: attention_op_spec(trace))."""
    cpu = trace.narrow(("cpu_op",), OP_COLUMNS)
    return OpMarks(attention_at(spec, cpu.index.to_numpy()), lat.name_mask(cpu["name"], set(EMBEDDING_OPS)))


def _forward_starts(trace: Trace, marks: OpMarks) -> tuple[np.ndarray, np.ndarray, int]:
    """(start ns, embedding row) of each forward pass, and the thread they run on."""
    cpu = trace.narrow(("cpu_op",), OP_COLUMNS)
    is_emb = marks.embedding
    if not is_emb.any():
        return np.empty(0, np.int64), np.empty(0, np.int64), -1
    # Columns as arrays, not frames of the rows (a frame filter copies every column).
    tids = numpy_column(cpu, "tid")
    # The thread with the most lookups; the lowest id among equals (Series.mode's first).
    values, counts = np.unique(tids[is_emb], return_counts=True)
    tid = int(values[np.argmax(counts)])
    on_tid = tids == tid
    all_ts = numpy_column(cpu, "ts", np.int64)
    emb = np.flatnonzero(is_emb & on_tid)
    emb = emb[np.argsort(all_ts[emb], kind="quicksort")]  # sort_values("ts")'s order
    ts = all_ts[emb]
    att = on_tid & marks.attention
    if att.any():
        count = np.searchsorted(np.sort(all_ts[att], kind="stable"), ts)
        new = np.r_[True, count[1:] > count[:-1]]
    else:
        count = np.searchsorted(np.sort(all_ts[on_tid], kind="stable"), ts)
        new = np.r_[True, (count[1:] - count[:-1]) >= MIN_OPS_PER_FORWARD]
    return ts[new], cpu.index.to_numpy(np.int64)[emb][new], tid


def _inferred(trace: Trace, starts: np.ndarray, tid: int, containers: sm.Ranges) -> Columns:
    """Forward segments from their starts: each runs to the next start (or its container's end),
    ending with the last host event of its thread before that limit."""
    limit = np.r_[starts[1:], np.iinfo(np.int64).max]
    if len(containers):
        order = np.argsort(containers.ts, kind="quicksort")  # sort_values("ts")'s order
        cs, ce = containers.ts.astype(np.int64)[order], containers.end.astype(np.int64)[order]
        k = np.searchsorted(cs, starts, side="right") - 1
        inside = (k >= 0) & (starts < ce[np.maximum(k, 0)])
        limit = np.where(inside, np.minimum(limit, ce[np.maximum(k, 0)]), limit)
    cpu = trace.narrow(("cpu_op",), OP_COLUMNS)
    rt = trace.narrow_runtime
    # The thread's top-level ops and runtime calls: two columns of them as arrays.
    top = (numpy_column(cpu, "tid") == tid) & (numpy_column(cpu, "parent") < 0)
    calls = numpy_column(rt, "tid") == tid
    hts = np.concatenate([numpy_column(cpu, "ts", np.int64)[top], numpy_column(rt, "ts", np.int64)[calls]])
    order = np.argsort(hts, kind="quicksort")  # sort_values("ts")'s order
    hts = hts[order]
    hend = np.concatenate([numpy_column(cpu, "end", np.int64)[top], numpy_column(rt, "end", np.int64)[calls]])[order]
    reach = np.maximum.accumulate(hend) if len(hend) else np.empty(0, np.int64)
    j = np.searchsorted(hts, limit, side="left") - 1
    end = np.where(j >= 0, reach[np.maximum(j, 0)] if len(reach) else starts, starts)
    end = np.minimum(np.maximum(end, starts + 1), limit)
    n = len(starts)
    return _frame(starts, end, ["forward"] * n, np.full(n, tid), ["?"] * n)


def _shape_evidence(trace: Trace, segs: Segments, marks: OpMarks) -> dict[str, np.ndarray]:
    """Per segment (arrays by id): batch and tokens per sequence of the first embedding, the first
    attention op's batch, query and key lengths, and whether it trains."""
    n = len(segs)
    col = {c: np.full(n, -1, np.int64) for c in ("emb_batch", "emb_len", "att_batch", "att_q", "att_kv")}
    training = np.zeros(n, bool)
    cpu = trace.narrow(("cpu_op",), OP_COLUMNS)
    rows = cpu.index.to_numpy(np.int64)
    ts = numpy_column(cpu, "ts", np.int64)
    dims_of = numpy_column(trace.events, "input_dims", object)
    emb = marks.embedding
    for s, row in first_rows(segs.locate_times(ts[emb]), rows[emb]):
        dims = dims_of[row]
        if isinstance(dims, list) and len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 2:
            col["emb_batch"][s], col["emb_len"][s] = int(dims[1][0]), int(dims[1][1])
    att = marks.attention
    names = trace.names
    for s, row in first_rows(segs.locate_times(ts[att]), rows[att]):
        name = str(names[row])
        layout = next((lay for pat, lay in _ATTENTION_LAYOUTS if pat.search(name)), None)
        shape = parse_shapes(dims_of[row], layout)
        # Packed (THD) layouts give tokens over the whole batch, not per sequence: no evidence.
        if shape["batch"] and shape["q_len"]:
            col["att_batch"][s], col["att_q"][s] = shape["batch"], shape["q_len"]
            col["att_kv"][s] = shape["kv_len"] or -1
    # Start times of the training markers only (a training trace's backward ops are most of its ops:
    # no frame of them is built, nor is each located).
    for f in (cpu, _annotations(trace)):
        training |= segs.holds_any(numpy_column(f, "ts", np.int64)[lat.regex_mask(f["name"], _TRAINING)])
    return {**col, "training": training}


def _cumcount(keys: np.ndarray) -> np.ndarray:
    """Per element, how many earlier elements have its key: `groupby(keys).cumcount()` as int64."""
    _, group = np.unique(keys, return_inverse=True)
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    first = np.r_[True, sorted_group[1:] != sorted_group[:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(keys)), 0))
    out = np.empty(len(keys), np.int64)
    out[order] = np.arange(len(keys)) - run_start
    return out


def segment(trace: Trace, marks: OpMarks, patterns: pp.PhasePatterns | None = None) -> Segments:
    """Split the trace into segments (see the module docstring); columns beyond the contract:
    tid, step (index within its request), request, batch, q_len, kv_len, and the step's kind,
    requests and tokens (analyze.common.step_markers.ENGINE_COLUMNS; -1 where unknown).
    `marks`: the cpu ops' attention ops and embedding lookups; `patterns`: users' phase names."""
    method, table, confidence = _source_table(trace, marks, patterns)
    if table is None or not len(table["start"]):
        table = _frame([], [], [], [], [])
        method = "none"
    cols = _in_start_order(table)
    start = np.asarray(cols["start"], np.int64)
    # Segments must not overlap: clip each at the next one's start.
    cols["end"] = np.minimum(np.asarray(cols["end"], np.int64), np.r_[start[1:], np.iinfo(np.int64).max])
    cols["seg"] = np.arange(len(start), dtype=np.int64)
    # The segments' ranges alone locate the shape evidence; the table is framed once, at the end
    # (each column written into a frame costs ~0.1 ms). The dict keeps the order the frame's
    # columns had when they were written one by one.
    segs = Segments(table=pd.DataFrame({c: cols[c] for c in ("start", "end", "seg")}), method=method,
                    confidence=confidence or CONFIDENCE[method])
    ev = _shape_evidence(trace, segs, marks)
    given_q = np.asarray(cols["q_len"], np.int64)
    q = np.where(given_q > 0, given_q, np.where(ev["emb_len"] > 0, ev["emb_len"], ev["att_q"]))
    batch = np.asarray(cols["batch"], np.int64)
    cols["batch"] = np.where(batch > 0, batch, np.where(ev["emb_batch"] > 0, ev["emb_batch"], ev["att_batch"]))
    cols["q_len"] = q
    cols["kv_len"] = ev["att_kv"]
    phase = cols["phase"]
    # A list of texts as its frame's column gives them back (an object array).
    phase = np.array(phase, dtype=object) if isinstance(phase, list) else phase.to_numpy()
    unknown = phase == "?"
    by_shape = np.where(ev["training"], "step", np.where(q > 1, "prefill", np.where(q == 1, "decode", "step")))
    cols["phase"] = phase = np.where(unknown, by_shape, phase)
    serving.fill_step_columns(cols)
    if method == "inferred" and (q[unknown] <= 0).any():
        segs.confidence = "low"
    # index within phase, request (one per prefill) and step within the request, in time order
    cols["index"] = _cumcount(phase)
    request = np.cumsum(phase == "prefill") - 1
    cols["request"] = request
    dec = phase == "decode"
    step = np.array(cols["step"], np.int64)
    step[dec] = _cumcount(request[dec])
    cols["step"] = step
    order = list(SEGMENT_COLUMNS) + [c for c in cols if c not in SEGMENT_COLUMNS]
    segs.table = pd.DataFrame({c: cols[c] for c in order}, index=pd.RangeIndex(len(start)))
    return segs


def _source_table(trace: Trace, marks: OpMarks, patterns: pp.PhasePatterns | None) -> tuple[str, pd.DataFrame | Columns | None, str | None]:
    """(method, segment table or None, confidence or None) of the first source (module docstring)
    that gives segments."""
    table = _tokentrace_annotations(trace)
    if table is not None:
        return "annotations", table, None
    engine, confidence = _framework_markers(trace)
    if engine is not None:
        return "framework_markers", engine, confidence
    user, requests = sm.user_segments((_annotations(trace), trace.narrow(("cpu_op",), OP_COLUMNS)), patterns or pp.compile_patterns())
    if user is not None:
        return "user_annotations", _frame(user["start"], user["end"], user["name"], user["tid"], user["phase"], step=user["step"]), None
    steps = _profiler_steps(trace)
    starts, _, tid = _forward_starts(trace, marks)
    per_step = np.zeros(len(steps), np.int64)
    if len(steps) and len(starts):
        k = np.searchsorted(steps.ts.astype(np.int64), starts, side="right") - 1
        ok = (k >= 0) & (starts < steps.end.astype(np.int64)[np.maximum(k, 0)])
        per_step = np.bincount(k[ok], minlength=len(steps))
    if len(steps) and per_step.max(initial=0) <= 1:
        return "profiler_steps", _frame(steps.ts, steps.end, steps.name, steps.tid, ["?"] * len(steps)), None
    if len(starts):
        bounds = steps if not len(requests) else sm.Ranges.concat([steps, requests]).outermost()
        return "inferred", _inferred(trace, starts, tid, bounds), None
    return "none", None, None


# ---- result --------------------------------------------------------------------------------------

# Engine steps listed one per line in the terminal; the JSON has them all.
SERVING_STEPS_SHOWN = 5
STEP_FIELDS = ("cpu_span_us", "gpu_span_us", "gpu_busy_us", "gpu_idle_us", "kernels", "launches", "sync_blocked_us")


@dataclass
class PhasesResult:
    segments: Segments
    steps: pd.DataFrame  # one row per segment with every measure (times in us)
    method: str
    confidence: str
    decode_summary: dict[str, Any] | None
    tokenize_us: float | None = None
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    serving: pd.DataFrame | None = None  # per step: kind, tokens, time per token (analyze.common.serving)
    serving_summary: dict[str, Any] | None = None
    steps_window: steady_state.Window | None = None  # GPU work of the steps (analyze.common.steady_state)
    source: dict[str, Any] = field(default_factory=dict)  # what the segmentation read (engine, forms, patterns)

    @property
    def prefill(self) -> pd.DataFrame:
        return self.steps[self.steps["phase"] == "prefill"]

    @property
    def decode(self) -> pd.DataFrame:
        return self.steps[self.steps["phase"] == "decode"]

    @property
    def mixed(self) -> pd.DataFrame:
        return self.steps[self.steps["phase"] == "mixed"]

    @property
    def other_steps(self) -> pd.DataFrame:
        return self.steps[self.steps["phase"] == "step"]

    @property
    def ttft_absent(self) -> str | None:
        """Why there is no TTFT, or None when there is one."""
        return serving.ttft_absent_reason(self.method, not self.prefill.empty, self._prompt_steps)

    @property
    def _prompt_steps(self) -> int:
        """Steps that process prompt tokens: prefill passes, and mixed steps with prompt requests."""
        s = self.serving
        if s is None or s.empty:
            return int(len(self.prefill))
        return int(((s["kind"] == "prefill") | ((s["kind"] == "mixed") & (s["prefill_requests"] != 0))).sum())

    @property
    def ttft_us(self) -> float | None:
        p = self.prefill
        return None if p.empty or self.ttft_absent else float(p["ttft_us"].iloc[0])

    @property
    def tpot_us(self) -> dict[str, float] | None:
        return None if self.decode_summary is None else self.decode_summary["tpot_us"]

    def to_json(self) -> dict[str, Any]:
        prefill = [_step_json(r, ("index", "name", "request", "prompt_len", "batch", "start_us", "ttft_us", "token_ready_us",
                                  "token_source") + STEP_FIELDS + ("cpu_share", "gpu_share", "bound"))
                   for r in self.prefill.itertuples(index=False)]
        decode = None
        if self.decode_summary is not None:
            decode = dict(self.decode_summary)
            decode["per_step"] = [_step_json(r, ("index", "name", "request", "step", "batch", "kv_len", "start_us", "step_us",
                                                 "tpot_us", "token_ready_us", "token_source") + STEP_FIELDS
                                             + ("cpu_share", "gpu_share", "bound"))
                                  for r in self.decode.itertuples(index=False)]
        other_json = _group_json(self.other_steps, ("index", "name", "start_us", "step_us"))
        mixed_json = _group_json(self.mixed, ("index", "name", "batch", "start_us", "step_us", "tpot_us"))
        counts = self.steps["phase"].value_counts()
        return {
            "method": self.method,
            "confidence": self.confidence,
            "source": self.source,
            "segments": {str(k): int(v) for k, v in counts.items()},
            "ttft_us": None if self.ttft_us is None else round(self.ttft_us, 3),
            "ttft_absent": self.ttft_absent,
            "tpot_us": self.tpot_us,
            "tokenize_us": self.tokenize_us,
            "prefill": prefill,
            "decode": decode,
            "mixed": mixed_json,
            "other_steps": other_json,
            "serving": self.serving_summary,
            "notes": list(self.notes),
        }

    def summary_lines(self) -> list[str]:
        """Terminal lines for TTFT and TPOT."""
        src = f"{self.method}, {self.confidence} confidence"
        p = self.prefill
        if self.ttft_absent and self._prompt_steps:
            lines = [f"TTFT  not measured: {self._prompt_steps} engine step(s) batch requests' prompt tokens, and the "
                     f"trace does not say when a request arrived ({src})"]
        elif p.empty:
            lines = [f"TTFT  no prefill pass in this trace ({src})"]
        else:
            r = p.iloc[0]
            shape = f"{_int(r['batch'], '?')}x{_int(r['prompt_len'], '?')} tokens"
            more = f", {len(p)} prefills, mean {p['ttft_us'].mean() / 1000:.2f} ms" if len(p) > 1 else ""
            lines = [f"TTFT  {r['ttft_us'] / 1000:.2f} ms  (prefill {shape}{more}; {src})"]
        d = self.decode_summary
        if d is None:
            lines.append("TPOT  no decode steps in this trace")
        else:
            t = d["tpot_us"]
            line = (f"TPOT  p50 {t['p50'] / 1000:.3f} ms  p90 {t['p90'] / 1000:.3f}  mean {t['mean'] / 1000:.3f}  "
                    f"max {t['max'] / 1000:.3f} ms over {d['steps']} decode steps")
            growth = _slope_text(d.get("tpot_slope"), d["tpot_slope_basis"])
            if growth:
                line += f"; {growth}"
            b = d.get("bound")
            if b:
                line += f"; {b['verdict']} (critical path {b['cpu_share'] * 100:.0f}% CPU, {b['gpu_share'] * 100:.0f}% GPU)"
                if b["wait_share_of_step"] >= WAIT_SHARE_TO_SHOW:
                    line += f", {b['wait_share_of_step'] * 100:.0f}% of step time is waiting the trace cannot attribute"
            lines.append(line)
        lines.extend(_serving_lines(self.serving_summary, self.source))
        return lines


def _slope_text(rec: dict[str, Any] | None, basis: str) -> str | None:
    """TPOT growth as the terminal says it: a slope only when its 95% interval excludes zero."""
    if not rec:
        return None
    if rec["status"] == fits.TOO_NARROW:
        return f"TPOT growth: {fits.TOO_NARROW} ({basis} {fits.range_text(rec['x_min'], rec['x_max'])})"
    lo, hi = rec["ci95"] or (None, None)
    if not rec["significant"] or lo is None:
        ci = f" (95% CI {lo:+.1f}..{hi:+.1f} us)" if lo is not None else ""
        return f"no significant TPOT growth per {basis}{ci}"
    return f"{rec['slope']:+.3f} us per {basis} (95% CI {lo:+.3f}..{hi:+.3f})"


def _serving_lines(s: dict[str, Any] | None, source: dict[str, Any]) -> list[str]:
    """Terminal lines for serving-engine steps: kinds, tokens, per-token cost, ITL, throughput."""
    if not s or not source.get("engine"):
        return []
    kinds = ", ".join(f"{v} {k}" for k, v in s["by_kind"].items())
    line = f"steps {s['steps']} {source['engine']} steps ({kinds}), {s['tokens']} tokens"
    if s["tokens_per_s"]:
        line += f", {s['tokens_per_s']:,.0f} tokens/s over {s['window_us'] / 1000:.2f} ms"
    if s["itl_us"]:
        line += f"; inter-token latency p50 {s['itl_us']['p50'] / 1000:.3f} ms"
    out = [line]
    for r in s["per_step"][:SERVING_STEPS_SHOWN]:
        parts = [f"  step {r['index']} {r['kind']}"]
        if r["prefill_requests"]:
            parts.append(f"{r['prefill_requests']} prefill req / {r['prefill_tokens'] if r['prefill_tokens'] is not None else '?'} tok")
        if r["decode_requests"]:
            kv = f", KV {r['decode_kv_tokens']}" if r["decode_kv_tokens"] is not None else ""
            parts.append(f"{r['decode_requests']} decode req{kv}")
        if r["wall_us"] is not None:
            parts.append(f"{r['wall_us'] / 1000:.2f} ms")
        if r["us_per_token"] is not None:
            parts.append(f"{r['us_per_token']:.2f} us/token")
        out.append(", ".join(parts))
    if len(s["per_step"]) > SERVING_STEPS_SHOWN:
        out.append(f"  ... {len(s['per_step']) - SERVING_STEPS_SHOWN} more steps (--json for all)")
    return out


def _group_json(steps: pd.DataFrame, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """Count, step time percentiles and per-step rows of a group of steps (mixed, other), None if empty."""
    if steps.empty:
        return None
    return {
        "count": int(len(steps)),
        "step_us": lat.percentiles(numpy_column(steps, "step_us")),
        "per_step": [_step_json(r, keys + STEP_FIELDS + ("cpu_share", "gpu_share", "bound")) for r in steps.itertuples(index=False)],
    }


def _int(v: Any, default: str) -> str:
    return str(int(v)) if v is not None and not pd.isna(v) and v >= 0 else default


def _step_json(r: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in keys:
        v = getattr(r, k)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            out[k] = None
        elif isinstance(v, (np.integer, int)) and not isinstance(v, bool):
            out[k] = None if k in ("prompt_len", "batch", "kv_len", "request", "step") and v < 0 else int(v)
        elif isinstance(v, (np.floating, float)):
            out[k] = round(float(v), 3)
        else:
            out[k] = v
    return out


def _steps_frame(trace: Trace, segs: Segments, window: steady_state.Window | None = None) -> pd.DataFrame:
    """Every segment with its measures in microseconds (the `steps` DataFrame). A step whose work
    sat queued until the steady state began is timed from there (`queued_us` says how long)."""
    t = segs.table
    masks = lat.call_masks(trace)
    m = lat.measure(trace, segs, masks)
    origin = trace.span_ns[0]
    host_first_op = m["first_op"]
    ready = m["token_ready"]
    first_op = host_first_op
    if window is not None and window.queued:
        first_op = np.where(ready > window.start, np.maximum(host_first_op, window.start), host_first_op)
    phase = numpy_column(t, "phase")
    # A mixed step gives its decoding requests their next token, as a decode step does.
    request, interval, has_prev = lat.token_intervals(np.where(phase == "mixed", "decode", phase), ready, first_op)
    has_gpu = m["gpu_first"] >= 0
    gspan = np.where(has_gpu, m["gpu_last"] - m["gpu_first"], 0)
    capture_prompt = trace.capture.get("prompt_len")
    q = numpy_column(t, "q_len", np.int64)
    prompt = np.where(phase == "prefill", q, -1)
    if isinstance(capture_prompt, int) and (phase == "prefill").sum() == 1:
        prompt = np.where((phase == "prefill") & (prompt <= 0), capture_prompt, prompt)
    batch = numpy_column(t, "batch", np.int64)
    capture_batch = trace.capture.get("batch")
    if isinstance(capture_batch, int) and segs.method == "annotations":
        batch = np.where(batch <= 0, capture_batch, batch)
    measured = np.concatenate([cp.sample(np.flatnonzero(phase == ph)) for ph in ("prefill", "decode", "mixed", "step")])
    host_end = numpy_column(t, "end", np.int64)
    paths = cp.analyse(trace, segs, host_end, np.maximum(host_end, ready), measured, masks)
    # The critical path's columns as arrays by segment (NaN / None where no path was analysed).
    on_path = {c: np.full(len(t), np.nan) for c in ("cp_cpu_us", "cp_gpu_us", "cp_wait_us", "cpu_share", "gpu_share")}
    bound = np.full(len(t), None, object)
    if not paths.empty:
        at = numpy_column(paths, "seg", np.int64)
        on_path["cp_cpu_us"][at] = numpy_column(paths, "cp_cpu", float) / US
        on_path["cp_gpu_us"][at] = numpy_column(paths, "cp_gpu", float) / US
        on_path["cp_wait_us"][at] = numpy_column(paths, "cp_wait", float) / US
        on_path["cpu_share"][at] = numpy_column(paths, "cpu_share", float)
        on_path["gpu_share"][at] = numpy_column(paths, "gpu_share", float)
        bound[at] = numpy_column(paths, "bound", object)
    steps = pd.DataFrame({
        "seg": numpy_column(t, "seg"), "phase": phase, "index": numpy_column(t, "index"), "name": t["name"], "request": request,
        "step": numpy_column(t, "step"), "batch": batch, "prompt_len": prompt, "q_len": q, "kv_len": numpy_column(t, "kv_len"),
        "start_us": (numpy_column(t, "start", np.int64) - origin) / US,
        "first_op_us": (first_op - origin) / US,
        "queued_us": (first_op - host_first_op) / US,
        "token_ready_us": (ready - origin) / US,
        "token_source": m["token_source"],
        "step_us": (ready - first_op) / US,
        "ttft_us": np.where(phase == "prefill", (ready - first_op) / US, np.nan),
        "tpot_us": np.where(np.isin(phase, ("decode", "mixed")), interval / US, np.nan),
        "tpot_is_interval": has_prev,
        "cpu_span_us": (host_end - numpy_column(t, "start", np.int64)) / US,
        "gpu_span_us": gspan / US,
        "gpu_busy_us": m["gpu_busy"] / US,
        "gpu_idle_us": (gspan - m["gpu_busy"]) / US,
        "kernels": m["kernels"],
        "launches": m["launches"],
        "sync_blocked_us": m["sync_blocked"] / US,
        **on_path,
        # An object column (None where no path), as writing the verdicts into a column of None made it.
        "bound": pd.Series(bound, index=t.index, dtype=object),
    })
    steps.attrs["paths"] = paths
    return steps


def _slope_basis(d: pd.DataFrame, steps: pd.DataFrame, table: pd.DataFrame, method: str) -> tuple[np.ndarray, str, str]:
    """(x, basis, source) for TPOT growth of decode steps `d`: the KV tokens each request attends,
    from the engine step annotation's KV sum over its decode requests where every step has one,
    else tokentrace's annotations (prompt length + decode step index + 1), else the attention key
    length of the shapes when it varies (graph replays keep their capture shapes: constant), else
    prompt + step from segments found otherwise, else the step number within the request."""
    t = table.set_index("seg").reindex(numpy_column(d, "seg"))
    if {"decode_kv_tokens", "decode_requests"} <= set(t.columns):
        kv_sum = pd.to_numeric(t["decode_kv_tokens"], errors="coerce").fillna(-1).to_numpy(float)
        n = pd.to_numeric(t["decode_requests"], errors="coerce").fillna(-1).to_numpy(float)
        if len(d) and ((kv_sum >= 0) & (n > 0)).all():
            return kv_sum / n, "kv_token", "engine_annotation"
    prompt_of = steps[steps["phase"] == "prefill"].set_index("request")["prompt_len"]
    p = d["request"].map(prompt_of).fillna(-1).to_numpy(np.int64)
    by_prompt = (p + numpy_column(d, "step", np.int64) + 1).astype(float)
    if method == "annotations" and (p > 0).all():
        return by_prompt, "kv_token", "capture_annotations"
    kv = numpy_column(d, "kv_len", np.int64)
    if (kv > 0).all() and np.ptp(kv) > 0:
        return kv.astype(float), "kv_token", "shapes"
    if (p > 0).all():
        return by_prompt, "kv_token", "prompt_and_step"
    return numpy_column(d, "step", float) + 1.0, "step", "step_index"  # steps counted from 1: a positive x, as fits need


def _decode_summary(steps: pd.DataFrame, table: pd.DataFrame | None = None, method: str = "none") -> dict[str, Any] | None:
    is_decode = numpy_column(steps, "phase", object) == "decode"
    if not is_decode.any():
        return None
    d = steps[is_decode]
    tpot = numpy_column(d, "tpot_us", float)
    # Growth per token of context (see _slope_basis for where the context length comes from).
    x, basis, x_source = _slope_basis(d, steps, table if table is not None else pd.DataFrame({"seg": []}), method)
    paths = steps.attrs.get("paths")
    bound = None
    if paths is not None and not paths.empty:
        bound = cp.aggregate(paths[paths["seg"].isin(d["seg"])])
    # A slope only over a range of context wide enough to show growth (analysis.common.fits); the
    # record says "range too narrow to fit" (with the mean TPOT) otherwise, and carries the interval.
    fit = fits.line_fit(x, tpot)
    return {
        "steps": int(len(d)),
        "tpot_us": lat.percentiles(tpot),
        "tpot_intervals": int(d["tpot_is_interval"].sum()),
        "tpot_slope_us_per_token": round(fit.slope, 4) if isinstance(fit, fits.LineFit) else None,
        "tpot_slope_basis": basis,
        "tpot_slope_x_source": x_source,
        "tpot_slope": None if fit is None else fit.record(x=basis),
        "gpu_busy_us": lat.percentiles(numpy_column(d, "gpu_busy_us", float)),
        "bound": bound,
    }


def run(trace: Trace, ctx: Context) -> PhasesResult:
    patterns = pp.compile_patterns(ctx.options.phases)
    spec = ctx.shared(attention_op_spec)
    marks = op_marks(trace, spec)
    segs = segment(trace, marks, patterns)
    window = steady_state.steps_window(trace, segs)
    steps = _steps_frame(trace, segs, window)
    if segs.method == "framework_markers":
        steps["ttft_us"] = np.nan  # an engine prefill step is not one request's time to first token
    step_columns = serving.step_columns(steps, segs.table, serving.attention_geometry(trace, segs, spec, marks.attention))
    per_step = pd.DataFrame(step_columns)
    source = _source(segs, patterns)
    t0 = trace.span_ns[0]
    notes: list[str] = []
    if segs.method == "none":
        notes.append("no step annotations, profiler steps or forward passes (embedding lookups) found: phases absent")
    queued = np.flatnonzero(numpy_column(steps, "queued_us", float) > 0)
    if len(queued):
        q = steps.iloc[queued[0]]
        notes.append(f"step {q['name']} waited {q['queued_us'] / 1000:.2f} ms with its work queued behind work or an event "
                     "the trace does not show (before the steady state): its times start when its work started")
    tok = numpy_column(steps, "cpu_span_us", float)[numpy_column(steps, "name", object) == TOKENIZE_ANNOTATION]
    decode = _decode_summary(steps, segs.table, segs.method)
    if decode and decode["tpot_intervals"] < decode["steps"]:
        notes.append(f"{decode['steps'] - decode['tpot_intervals']} decode step(s) have no earlier token in the trace; "
                     "their TPOT is the step's own time from first op to token")
    source_note = _token_source_note(steps)
    if source_note:
        notes.append(source_note)
    return PhasesResult(
        segments=segs,
        steps=steps,
        method=segs.method,
        confidence=segs.confidence,
        decode_summary=decode,
        tokenize_us=float(tok[0]) if len(tok) else None,
        notes=notes,
        findings=_findings(steps, decode),
        serving=per_step,
        serving_summary=serving.summary(step_columns, steps, None if window is None else
                                        ((window.start - t0) / US, (window.end - t0) / US)),
        source=source,
        steps_window=window,
    )


def _token_source_note(steps: pd.DataFrame) -> str | None:
    """How the prefill and decode steps' token-ready times were found, most frequent source first
    (ties in order of appearance, as value_counts orders them; missing ones left out), or None."""
    phase = numpy_column(steps, "phase", object)
    src = numpy_column(steps, "token_source", object)[(phase == "prefill") | (phase == "decode")].tolist()
    # Counted without a Series of a few dozen rows; v == v: not NaN.
    sources = serving.counts_by_value([v for v in src if v is not None and v == v])
    return "token ready from: " + ", ".join(f"{k} x{v}" for k, v in sources.items()) if sources else None


def _source(segs: Segments, patterns: pp.PhasePatterns) -> dict[str, Any]:
    """What the segmentation read: the engine and its annotation forms, or the user's patterns."""
    t = segs.table
    out: dict[str, Any] = {"engine": None}
    if segs.method == "framework_markers" and "engine" in t and t["engine"].notna().any():
        eng = t["engine"].dropna().astype(str)
        out["engine"] = str(eng.mode().iat[0])
        out["forms"] = {str(k): int(v) for k, v in t["form"].dropna().astype(str).value_counts().items()}
    elif segs.method == "framework_markers":
        out["markers"] = "execute_model"
    if segs.method in ("user_annotations", "inferred"):
        out["patterns"] = patterns.describe()
        out["custom_patterns"] = sorted(patterns.custom)
    return out


def _findings(steps: pd.DataFrame, decode: dict[str, Any] | None) -> list[Finding]:
    """An informational finding naming the side that bounds decode (the cost and savings of
    launch overhead are the launches/gaps detectors' to state, so none is claimed here)."""
    if not decode or not decode.get("bound") or decode["bound"]["verdict"] != "cpu-bound":
        return []
    b = decode["bound"]
    d = steps[steps["phase"] == "decode"]
    return [Finding(
        id="decode_cpu_bound",
        title=f"Decode is CPU-bound: {b['cpu_share'] * 100:.0f}% of each step's critical path is host time",
        category="phases",
        severity="info",
        phase="decode",
        explains="why TPOT is what it is: the host's time per step sets the pace, so GPU-side speed-ups will not "
                 "shorten decode until host work per token shrinks",
        recommendation="Cut host work per token: capture the decode step in a CUDA graph (torch.compile mode="
                       "\"reduce-overhead\" or a static-cache graph), fuse small ops, keep sampling on the GPU.",
        detail=(f"Over {b['steps_analysed']} decode steps the critical path held {b['critical_path_cpu_us']:.1f} us of host "
                f"time and {b['critical_path_gpu_us']:.1f} us of GPU time; mean TPOT {decode['tpot_us']['mean']:.1f} us vs "
                f"mean GPU busy {d['gpu_busy_us'].mean():.1f} us per step."),
    )]
