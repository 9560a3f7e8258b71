"""Section "Which syncs block the host?": every host-device sync point, when, how long, and in which op.

Reads SyncsResult (the sync-point table, counts by kind, per-token rates) and the phase steps for
the shading of the figure.
"""

from __future__ import annotations

from typing import Any

from tokentrace.analysis.detectors.syncs import SyncsResult
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Figure, Section
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec, where, with_where

# How a sync kind (analysis.detectors.syncs) reads; an unknown kind shows as its name.
KIND_LABELS = {
    "device_sync": "device synchronize",
    "stream_sync": "stream synchronize",
    "event_sync": "event synchronize",
    "memcpy_sync": "synchronous copy",
    "memcpy_pageable": "copy with pageable memory",
    "memset_sync": "synchronous memset",
    "op": "op reading a value to the host",
}
TOP_SYNCS = 15


def kind_label(kind: Any) -> str:
    k = str(kind)
    return KIND_LABELS.get(k, k.replace("_", " "))


SYNC_COLS = (tb.word("where", "where"), tb.word("kind", "kind", kind_label), tb.code("api", "API"), tb.code("op", "op"),
             tb.num("blocked_us", "blocked"), tb.num("idle_caused_us", "GPU idle after"), tb.code("waited_for", "waited for"),
             tb.Col("stack", "stack", tb.stack))


def build(inp: Inputs, s: Section) -> None:
    sy = inp.result("syncs", SyncsResult)
    if sy.count == 0:
        raise Lacks("No host-device sync points in this trace.")
    summary = inp.summary("syncs")
    items = sy.items
    idle = summary["idle_caused_us"]
    them = "it" if sy.count == 1 else "them"
    # Durations under 0.05 us print as "0 us": say what the zero means instead of printing it.
    if sy.blocked_us < 0.05:  # e.g. a trace whose runtime calls all sit at timestamp 0 with no duration
        s.prose.append(words.sentence(f"the trace records {words.count(sy.count, 'sync point')} but no time for {them}, so "
                                      f"how long {'it' if sy.count == 1 else 'they'} blocked the host is unknown"))
    else:
        after = (f"left the GPU idle for {fmt.duration(idle)} right after {them}" if idle >= 0.05 else
                 f"the GPU had queued work through {them} (no idle right after)")
        s.prose.append(words.sentence(f"{words.count(sy.count, 'sync point')} blocked the host for {fmt.duration(sy.blocked_us)} "
                                      f"in all and {after}"))
    pt = sy.per_token
    if pt["decode_steps"]:
        s.prose.append(words.sentence(f"in decode that is {fmt.number(pt['syncs_per_token'])} per generated token, blocking the host "
                                      f"{fmt.duration(pt['blocked_us_per_token'])} per token"))
        if pt.get("blocked_before_window_us"):
            s.prose.append(words.sentence(f"the per-token figure leaves out {fmt.duration(pt['blocked_before_window_us'])} the host "
                                          "waited before the steps' work started (work queued before the trace began), "
                                          "as the step times do"))
    longest = items.sort_values("blocked_us", ascending=False, kind="stable")
    r = longest.iloc[0]
    if sy.blocked_us >= 0.05:  # "the longest, 0 us" says nothing
        at = where(r["phase"], r["step"])
        at = at if at == "outside any step" else f"in {at}"
        in_op = f" in {r['op']}" if not tb.missing(r["op"]) else ""
        s.prose.append(words.sentence(f"the longest, {fmt.duration(r['blocked_us'])}, was a {kind_label(r['kind'])} ({r['api']}{in_op}) {at}"))
    labels = [kind_label(k) for k in items["kind"]]
    known = list(KIND_LABELS.values())
    order = known + [k for k in dict.fromkeys(labels) if k not in known]
    colors = {k: figures.CAUSE_PALETTE[i % len(figures.CAUSE_PALETTE)] for i, k in enumerate(order)}
    s.figure = Figure(figures.sync_points,
                      figures.SyncPointsData(items["start_us"].to_numpy(float) / 1e3, items["blocked_us"].to_numpy(float), labels, colors,
                                             inp.bands()),
                      "Each sync point at the time it began (ms from the trace start) and how long it blocked the host (us); "
                      "shading shows the phase steps.")
    by_kind = [{"kind": k, **v} for k, v in sorted(sy.by_kind.items(), key=lambda kv: -kv[1]["blocked_us"])]
    s.tables.append(tb.from_records("Sync points by kind", by_kind,
                                    (tb.word("kind", "kind", kind_label), tb.num("count", "sync points", fmt.number),
                                     tb.num("blocked_us", "host blocked"), tb.num("idle_caused_us", "GPU idle after"))))
    head = longest.head(TOP_SYNCS)
    head = with_where(head)
    s.tables.append(tb.from_frame("Sync points, longest first", head, SYNC_COLS, total=len(longest)))

SECTION = SectionSpec(key="syncs", title="Which syncs block the host?", results=("syncs",), categories=("syncs",), build=build)
