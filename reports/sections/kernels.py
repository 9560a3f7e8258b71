"""Section "What runs on the GPU?": the ops and kernels with the most GPU time, and how close they run to the roofs.

Reads the shapes result (Shapes: op groups by name, input shapes and phase, and kernel groups)
and, when present, the roofline (Roofline: per-phase totals and per-op FLOPs, bytes and rates).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from tokentrace.analysis.detectors.roofline import Roofline
from tokentrace.analysis.detectors.shapes import Shapes
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Figure, Section
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec

TOP_PER_PHASE = 10
# Op groups named in the roofline plot besides the phase totals (more labels only crowd it).
NAMED_OPS = 2
OP_COLS = (tb.code("name", "op"), tb.code("input_dims", "input shapes", tb.dims), tb.num("calls", "calls", tb.integer),
           tb.num("gpu_total_us", "GPU total"), tb.num("gpu_mean_us", "GPU per call"), tb.num("cpu_total_us", "host total"),
           tb.code("top_kernel", "main kernel"))
HOST_OP_COLS = (tb.code("name", "op"), tb.code("input_dims", "input shapes", tb.dims), tb.num("calls", "calls", tb.integer),
                tb.num("cpu_total_us", "host total"))
KERNEL_COLS = (tb.code("name", "kernel"), tb.code("op", "op"), tb.num("calls", "calls", tb.integer), tb.num("gpu_total_us", "GPU total"),
               tb.num("gpu_mean_us", "per call"), tb.num("gpu_max_us", "max"))
ROOF_COLS = (tb.word("phase", "phase"), tb.num("gpu_us", "GPU time"), tb.num("intensity", "FLOP per byte", fmt.number),
             tb.num("tflops", "TFLOP/s", fmt.number), tb.num("gbs", "GB/s", fmt.number), tb.num("compute_share", "of peak FLOP/s", fmt.share),
             tb.num("bandwidth_share", "of peak bandwidth", fmt.share), tb.word("bound", "bound by"))


def _phase_of(phase: Any) -> str:
    return "all" if tb.missing(phase) else str(phase)


def roof_sentence(phase: str, rec: dict[str, Any]) -> str:
    if rec["bound"] is None:
        return words.sentence(f"{phase} matmuls and attention run at {fmt.number(rec['tflops'])} TFLOP/s and "
                              f"{fmt.number(rec['gbs'])} GB/s ({fmt.number(rec['intensity'])} FLOP per byte); the GPU's peaks "
                              "are not known, so no roof is drawn")
    return words.sentence(
        f"{phase} is {rec['bound']}-bound: its matmuls and attention do {fmt.number(rec['intensity'])} FLOP per byte against a "
        f"ridge of {fmt.number(rec['ridge_intensity'])}, reaching {fmt.number(rec['tflops'])} TFLOP/s "
        f"({fmt.share(rec['compute_share'])} of peak) and {fmt.number(rec['gbs'])} GB/s ({fmt.share(rec['bandwidth_share'])} of peak)")


def roofline_data(roof: Roofline) -> figures.RooflineData | None:
    pts: list[figures.RoofPoint] = []
    peak_tf = peak_bw = None
    for phase, rec in roof.phases.items():
        if fmt.is_number(rec["intensity"]) and rec["tflops"] > 0:
            pts.append(figures.RoofPoint(f"{phase} (all ops)", phase, float(rec["intensity"]), float(rec["tflops"]), total=True, name=True))
        if rec["bound"] is not None and peak_tf is None:
            peak_tf, peak_bw = float(rec["peak_tflops"]), float(rec["peak_gbs"])
    ops = roof.ops[(roof.ops["intensity"] > 0) & (roof.ops["tflops"] > 0)]
    named = set(ops.sort_values("gpu_us", ascending=False).index[:NAMED_OPS])
    for i, r in ops.iterrows():
        label = f"{r['name']} {tb.dims(r['input_dims'])}"
        pts.append(figures.RoofPoint(label, _phase_of(r["phase"]), float(r["intensity"]), float(r["tflops"]), total=False, name=i in named))
    if not pts:
        return None
    return figures.RooflineData(pts, peak_tf, peak_bw)


def _tables_per_phase(s: Section, title: str, df: pd.DataFrame, cols: tuple[tb.Col, ...]) -> None:
    phases = df["phase"].map(_phase_of)
    for phase in dict.fromkeys(phases):
        part = df[(phases == phase).to_numpy()]
        s.tables.append(tb.from_frame(f"{title} in {phase}" if phase != "all" else title, part, cols, max_rows=TOP_PER_PHASE))


def build(inp: Inputs, s: Section) -> None:
    sh = inp.result("shapes", Shapes)
    roof = inp.optional("roofline", Roofline)
    if sh.ops.empty and sh.kernels.empty:
        raise Lacks("No ops or kernels in this trace.")
    if sh.gpu_total_us > 0:
        first = f"the GPU ran {fmt.duration(sh.gpu_total_us)} of kernels, copies and memsets"
        if sh.unattributed_gpu_count:
            first += (f"; {fmt.duration(sh.unattributed_gpu_us)} of it ({words.count(sh.unattributed_gpu_count, 'activity', 'activities')}) "
                      "has no op to attribute it to")
        busiest = sh.ops.sort_values("gpu_total_us", ascending=False, kind="stable")
        key = "gpu_total_us"
    else:  # a CPU run: what runs is host work, ranked by host time
        s.title = "What runs on the host?"
        untimed = inp.untimed_gpu_activities()
        first = (f"the trace gives its {words.count(untimed, 'GPU activity', 'GPU activities')} no time, so what runs is ranked "
                 "by host time" if untimed else "this trace has no GPU work")
        busiest = sh.ops.sort_values("cpu_total_us", ascending=False, kind="stable")
        key = "cpu_total_us"
    if len(busiest) and busiest[key].iloc[0] > 0:
        r = busiest.iloc[0]
        first += (f"; the op group with the most {'GPU' if key == 'gpu_total_us' else 'host'} time is {r['name']} with inputs "
                  f"{tb.dims(r['input_dims'])} in {_phase_of(r['phase'])}: {fmt.duration(r[key])} over {words.count(r['calls'], 'call')}")
    s.prose.append(words.sentence(first))
    data = roofline_data(roof) if roof is not None else None
    if roof is not None and roof.phases:
        s.prose += [roof_sentence(p, rec) for p, rec in list(roof.phases.items())[:2]]
    if data is not None:
        s.figure = Figure(figures.roofline, data,
                          "Achieved TFLOP/s against arithmetic intensity (FLOP per byte moved), both logarithmic, for matmul and "
                          "attention op groups (dots) and each phase's total (diamonds); under the sloped roof an op is bound by "
                          "memory bandwidth, under the flat one by peak FLOP/s.")
    else:
        s.figure_note = "No matmul or attention ops with recorded shapes and dtypes (record_shapes=True) to place on a roofline."
    if not sh.ops.empty:
        cols = OP_COLS if key == "gpu_total_us" else HOST_OP_COLS
        _tables_per_phase(s, "Top ops", busiest, cols)
    if not sh.kernels.empty and sh.gpu_total_us > 0:
        _tables_per_phase(s, "Top kernels", sh.kernels, KERNEL_COLS)
    if roof is not None and roof.phases:
        # A phase of a GPU with unknown peaks has no shares of peak (bound None): blank cells.
        recs = pd.DataFrame([{"phase": p, "compute_share": None, "bandwidth_share": None, **rec} for p, rec in roof.phases.items()])
        s.tables.append(tb.from_frame("Matmul and attention against the roofs, by phase", recs, ROOF_COLS,
                                      note="Shares of peak are blank when the GPU's peaks are not known."))


SECTION = SectionSpec(key="kernels", title="What runs on the GPU?", results=("shapes",), categories=("shapes", "roofline"), build=build)

