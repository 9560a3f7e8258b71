"""Section "What runs inside graph replays?": CUDA/HIP graph replays, and how much of them has its ops.

Shown only for traces with graph launches. Reads the graphs result (GraphsResult): the share of
replayed kernels and GPU time attributed to the ops that recorded them, the graph maps read, each
captured graph that replays matched, the unmatched replays by reason, the ops inside graphs and
the idle inside replays at each op boundary. Without a map it boxes how much replayed GPU time
every per-op view excludes and how to get a map, and shows what the trace says on its own: the
replay duration distribution, kernels per replay, the repeated layer pattern and the top
replayed kernels. The figure ranks GPU time inside replays by op (with a map) or by kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.detectors.graphs import HOW_TO_GET_A_MAP, GraphsResult
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Column, Figure, Section, Table
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec, shown_when

# Bars in the figure (the tables hold the rest).
FIGURE_ROWS = 10
# Characters of an op or kernel name on the figure's axis, and in a sentence (a kernel name is one
# unbreakable word: a whole one would run out of the page's column).
LABEL_CHARS = 30
PROSE_NAME_CHARS = 60

OP_COLS = (tb.num("rank", "#", tb.integer), tb.code("name", "op"), tb.code("input_dims", "input shapes"), tb.word("module", "module"),
           tb.word("phase", "phase"), tb.num("calls", "calls", tb.integer), tb.num("gpu_us", "GPU time"),
           tb.num("share", "share", fmt.share), tb.code("top_kernel", "top kernel"))
KERNEL_COLS = (tb.num("rank", "#", tb.integer), tb.code("name", "kernel"), tb.num("calls", "calls", tb.integer),
               tb.num("gpu_us", "GPU time"), tb.num("share", "share", fmt.share))
GRAPH_COLS = (tb.code("graph", "captured graph"), tb.word("label", "capture"), tb.num("replays", "replays", tb.integer),
              tb.num("kernels", "kernels", tb.integer), tb.num("share", "attributed", fmt.share), tb.num("gpu_us", "GPU time"),
              tb.word("evidence", "matched by"), tb.num("equivalent", "graphs alike", tb.integer))
UNMATCHED_COLS = (tb.word("reason", "reason"), tb.num("replays", "replays", tb.integer), tb.num("kernels", "kernels", tb.integer),
                  tb.num("gpu_us", "GPU time"), tb.num("score", "best match", fmt.share))
MAP_COLS = (tb.code("path", "graph map"), tb.word("found_by", "found by"), tb.num("graphs", "graphs", tb.integer),
            tb.num("kernels_recorded", "kernels recorded", tb.integer), tb.word("batch_sizes", "batch sizes", tb.dims),
            tb.word("how", "recorded by", tb.dims))
IDLE_COLS = (tb.code("after", "after"), tb.code("before", "before"), tb.num("count", "gaps", tb.integer), tb.num("total_us", "idle"))


def _pcts(p: dict[str, Any] | None, unit: Any = fmt.duration) -> str:
    return fmt.MISSING if not p else f"p50 {unit(p['p50'])}, p90 {unit(p['p90'])}, max {unit(p['max'])}"


def _excluded(res: GraphsResult) -> str:
    """The box: how much replayed GPU time per-op views cannot see, and how to see it."""
    if res.excluded_gpu_us <= 0:
        return ""
    if not res.info.maps:
        return (f"Per-op views (top ops, shapes, attention, roofline) exclude {fmt.duration(res.excluded_gpu_us)} of GPU time "
                f"replayed from graphs: no graph map says which op recorded each kernel. To see it, {HOW_TO_GET_A_MAP}.")
    return (f"Per-op views exclude {fmt.duration(res.excluded_gpu_us)} of replayed GPU time whose replays matched no captured "
            "graph (see the unmatched replays below); nothing is attributed by guesswork.")


def _prose(res: GraphsResult, summary: dict[str, Any]) -> list[str]:
    att = summary["attributed"]
    head = (f"{words.count(res.launches, 'graph replay')} ran {words.count(res.replayed_kernels, 'kernel')} for "
            f"{fmt.duration(res.replayed_gpu_us)} of GPU time")
    if res.info.maps:
        head += (f"; {fmt.share(att['share'])} of those kernels ({fmt.share(att['gpu_share'])} of the time) are attributed to the ops "
                 f"that recorded them, from {words.count(len(res.info.maps), 'graph map')}")
    else:
        head += "; none is attributed to an op (no graph map)"
    out = [words.sentence(head)]
    stats = res.replay_stats
    if res.ops.empty:
        second = (f"a replay took {fmt.duration(stats['duration_us']['p50']) if stats['duration_us'] else fmt.MISSING} at the median "
                  f"with {fmt.number(stats['kernels_per_replay']['p50'])} kernels")
        if res.layers:
            second += (f"; the replayed sequence repeats a block of {words.count(res.layers['kernels'], 'kernel')} "
                       f"{words.count(res.layers['repeats'], 'time')} (one per layer)")
        out.append(words.sentence(second))
    else:
        top = res.ops.iloc[0]
        out.append(words.sentence(f"the op with most GPU time inside graphs is {fmt.shorten(str(top['name']), PROSE_NAME_CHARS)} ({tb.dims(top['input_dims'])}"
                                  f"{', ' + str(top['module']) if not tb.missing(top['module']) else ''}): "
                                  f"{fmt.duration(top['gpu_us'])}, {fmt.share(top['share'])} of replayed GPU time"))
    if len(res.unmatched):
        r = res.unmatched.iloc[0]
        more = f" ({words.count(len(res.unmatched) - 1, 'other reason')} below)" if len(res.unmatched) > 1 else ""
        out.append(words.sentence(f"{words.count(int(res.unmatched['replays'].sum()), 'replay')} matched no captured graph; "
                                  f"the most common reason: {r['reason']}{more}"))
    elif res.idle.get("count"):
        b = res.idle["by_boundary"][0]
        after, before = (fmt.shorten(str(x), PROSE_NAME_CHARS) for x in (b["after_op"] or b["after_kernel"],
                                                                           b["before_op"] or b["before_kernel"]))
        out.append(words.sentence(f"the GPU sat idle {fmt.duration(res.idle['total_us'])} inside replays, in "
                                  f"{words.count(res.idle['count'], 'gap')}; most at the boundary after {after} and before {before}"))
    return out


def chart(res: GraphsResult) -> tuple[figures.CauseBarsData, str]:
    """The top ops (with a map) or kernels inside replays by GPU time, and the caption."""
    attributed = not res.ops.empty
    df = (res.ops if attributed else res.top_kernels).head(FIGURE_ROWS)
    rows = [f"{i}. {name}" for i, name in enumerate(df["name"].astype(str), 1)]
    what = "op that recorded them (from the graph map)" if attributed else "kernel name (no graph map: no op)"
    data = figures.CauseBarsData(rows, ["GPU time inside replays"], df["gpu_us"].to_numpy(float).reshape(-1, 1), [figures.BUSY_COLOR],
                                 xlabel="GPU time inside graph replays", label_chars=LABEL_CHARS)
    caption = (f"GPU time of replayed kernels by the {what}, largest first (ms, under the profiler); the numbers match the "
               f"first column of the table of {'ops' if attributed else 'replayed kernels'} below.")
    return data, caption


def _ranked(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(rank=np.arange(1, len(df) + 1))


def replay_table(res: GraphsResult) -> Table:
    s = res.replay_stats
    rows: list[list[str | None]] = [["replay duration (first kernel start to last end)", _pcts(s["duration_us"])],
                                    ["kernels per replay", _pcts(s["kernels_per_replay"], fmt.number)],
                                    ["GPU time per replay", _pcts(s["gpu_us_per_replay"])],
                                    ["launch calls", ", ".join(f"{k} x{v}" for k, v in s["by_api"].items())]]
    if res.layers:
        lay = res.layers
        rows.append(["layer pattern", f"{fmt.number(lay['kernels'])} kernels x {fmt.number(lay['repeats'])} repeats, from kernel "
                                      f"{fmt.number(lay['start'])} of {fmt.number(lay['sequence_kernels'])} in one step"])
    return Table("Replays", [Column("measure"), Column("value")], rows)


# Boundaries whose idle in all is below this are the clock's rounding between back-to-back kernels, not waits.
MIN_BOUNDARY_IDLE_US = 1.0


def _idle_records(idle: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"after": b["after_op"] or b["after_kernel"], "before": b["before_op"] or b["before_kernel"], "count": b["count"],
             "total_us": b["total_us"]} for b in idle.get("by_boundary", []) if b["total_us"] >= MIN_BOUNDARY_IDLE_US]


def build(inp: Inputs, s: Section) -> None:
    res = inp.result("graphs", GraphsResult)
    if not res.launches:
        raise Lacks("No CUDA/HIP graph launches in this trace.")
    summary = inp.summary("graphs")
    s.prose = _prose(res, summary)
    s.callout = _excluded(res)
    if res.replayed_kernels:
        data, caption = chart(res)
        s.figure = Figure(figures.cause_bars, data, caption)
    else:
        s.figure_note = "The graph launches own no GPU activity in this trace: nothing to rank."
    if summary["maps"]:
        s.tables.append(tb.from_records("Graph maps read", summary["maps"], MAP_COLS))
    if len(res.per_graph):
        s.tables.append(tb.from_frame("Captured graphs the replays matched", res.per_graph, GRAPH_COLS,
                                      note="Attributed: share of the replayed kernels given the op that recorded them. Graphs "
                                           "alike: captured graphs with the same contents (replays take them in capture order)."))
    if len(res.unmatched):
        s.tables.append(tb.from_frame("Replays that matched no captured graph, by reason", res.unmatched, UNMATCHED_COLS,
                                      note="Best match: the largest share of the replay's kernels that aligned with one graph."))
    s.tables.append(replay_table(res))
    if len(res.ops):
        s.tables.append(tb.from_frame("Ops inside graphs", _ranked(res.ops), OP_COLS,
                                      note="Ops by name, input shapes, module and phase; calls count the captured ops, share is "
                                           "of all replayed GPU time."))
    else:
        s.tables.append(tb.from_frame("Top replayed kernels", _ranked(res.top_kernels), KERNEL_COLS))
        if res.layers:
            names = [{"position": i, "name": n} for i, n in enumerate(res.layers["names"])]
            more = res.layers["more_names"]
            s.tables.append(tb.from_records("The repeated layer pattern", names, (tb.num("position", "#", tb.integer), tb.code("name", "kernel")),
                                            note=f"{fmt.number(more)} more kernels in the pattern." if more else ""))
    idle = _idle_records(res.idle) if res.idle.get("count") else []
    if idle:
        s.tables.append(tb.from_records("Idle inside replays, by where the GPU waited", idle, IDLE_COLS,
                                        note=f"{fmt.duration(res.idle['total_us'])} in {words.count(res.idle['count'], 'gap')}; "
                                             "after and before: the op (or, unattributed, the kernel) on either side of the gap; "
                                             f"boundaries with less than {fmt.duration(MIN_BOUNDARY_IDLE_US)} of idle in all "
                                             "(the clock's rounding between back-to-back kernels) are left out."))


SECTION = SectionSpec(key="graphs", title="What runs inside graph replays?", results=("graphs",), categories=("graphs",),
                      build=build, shown=shown_when("graphs", lambda g: bool(g.get("launches"))))
