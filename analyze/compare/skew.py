"""Collectives across ranks: match each collective call with the same call on the other ranks, align
the ranks' clocks on the matched ends, and measure who arrived last, how long the others waited
inside the collective, per step, and which rank holds the others up.

Input: the per-rank `collectives` records of `ranks.analyze_rank` (plain columns, see
CollectivesResult.rank_records); nothing here reads a trace.

Matching. A call is the same call on every rank when it has the same process group and sequence
number (PyTorch's `Seq` arg, counted per group, send/recv apart from collectives). Without
sequence numbers, the k-th call of a group on one rank matches the k-th on the others, a group
being (process group, type, dtype, message size for types whose size is equal on every rank):
the size keeps an order match from pairing different calls when a sampled trace lost some.

Clock alignment. Ranks on different hosts have clocks that differ by an offset. A synchronising
collective (all but send/recv) cannot finish on any rank before the last rank arrives, and its
kernels end within a network hop of each other, so matched ends mark the same instant: each rank's
offset is the median, over the calls it shares with the reference rank (the lowest), of its end
minus the reference's end (chained through other ranks where it shares none with the reference).
Arrivals are then compared on one clock. A matched call whose aligned ranges do not overlap cannot
be one call (a trace that lost events): it is left out of the skew and counted in a note.

Per call: arrival skew = last arrival - first arrival; the last rank; each other rank's wait =
time from its arrival to the last arrival (at most its time in the call).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.collectives import SIZE_INVARIANT, SYNCHRONISING
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import numpy_column

US = 1000.0
# The ends of one collective's kernels on different ranks differ by the last transfer's latency
# (microseconds on NVLink, ~10 us across InfiniBand); aligned ranges that miss each other by more
# than this plus three times the alignment's median residual are not one call. The median, not a
# high percentile: wrong order matches in a trace that lost events have huge residuals.
ALIGN_SLACK_NS = 10_000
# Kernel starts of ranks that are in step still differ by launch jitter of a few microseconds:
# a rank counts as late (a straggler candidate) only when the skew is at least this.
LATE_MIN_US = 10.0
# The JSON summary lists this many calls (largest skew first); the DataFrame has all.
TOP_CALLS = 20

CALL_COLUMNS = ["key", "matched_by", "type", "pg", "seq", "phase", "step", "ranks", "first_rank", "last_rank", "skew_us",
                "wait_us", "valid"]
STEP_COLUMNS = ["phase", "index", "collectives", "skew_max_us", "skew_total_us", "wait_us", "last_rank"]


def instances_frame(results: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per collective call per rank, from the ranks' records."""
    parts = []
    for r in results:
        rec = r.get("collectives")
        if not rec or not rec.get("type"):
            continue
        df = pd.DataFrame(rec)
        df.insert(0, "rank", r["rank"])
        parts.append(df)
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True)
    df = df[df["type"].notna()].copy()
    for c in ("start_ns", "end_ns"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    for c in ("seq", "bytes", "busy_us", "step", "lead_us", "lead_busy_us", "lead_gap_us", "lead_top_kernel_us"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)


def match(df: pd.DataFrame) -> pd.DataFrame:
    """Add `key` (the same on every rank for one call) and `matched_by` (sequence | order)."""
    df = df.copy()
    p2p = df["type"].isin(("send", "recv", "send_recv"))
    pg = df["pg"].astype(object).where(df["pg"].notna(), "")
    by_seq = df["seq"].notna() & (pg != "")
    seq_key = "seq|" + pg.astype(str) + "|" + np.where(p2p, "p2p", "coll") + "|" + df["seq"].fillna(-1).astype(np.int64).astype(str)
    size = df["bytes"].where(df["type"].isin(list(SIZE_INVARIANT)))
    group = (pg.astype(str) + "|" + df["type"].astype(str) + "|" + df["dtype"].astype(object).fillna("").astype(str) + "|"
             + size.map(lambda b: "" if b != b else str(int(b))))
    ordinal = df.groupby(["rank", group], sort=False).cumcount()
    df["key"] = np.where(by_seq, seq_key, "ord|" + group + "|" + ordinal.astype(str))
    df["matched_by"] = np.where(by_seq, "sequence", "order")
    return df


@dataclass
class Alignment:
    reference: int | None
    offsets_ns: dict[int, int]
    calls: int  # matched synchronising calls the offsets rest on
    residual_p50_us: float | None = None
    residual_p90_us: float | None = None
    unaligned: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": "median offset of matched synchronising collectives' end times against the reference rank",
            "reference_rank": self.reference, "calls": self.calls,
            "offsets_us": {str(r): round(o / US, 3) for r, o in sorted(self.offsets_ns.items())},
            "residual_p50_us": self.residual_p50_us, "residual_p90_us": self.residual_p90_us,
            "unaligned_ranks": self.unaligned,
        }


def align(df: pd.DataFrame, ranks: list[int] | None = None) -> Alignment:
    """Per-rank clock offsets from the matched ends of synchronising collectives."""
    if ranks is None:
        ranks = sorted(int(r) for r in df["rank"].unique()) if len(df) else []
    timed = df[df["type"].isin(list(SYNCHRONISING)) & df["end_ns"].notna() & df["busy_us"].notna()]
    shared = timed[timed.groupby("key")["rank"].transform("nunique") >= 2]
    if shared.empty:
        return Alignment(ranks[0] if ranks else None, {r: 0 for r in ranks}, 0, unaligned=ranks[1:])
    ref_of_key = shared.groupby("key")["rank"].transform("min")
    ref_end = shared.loc[shared["rank"] == ref_of_key].drop_duplicates("key").set_index("key")["end_ns"]
    diff = numpy_column(shared, "end_ns", float) - ref_end.reindex(shared["key"]).to_numpy(float)
    pairs = pd.DataFrame({"a": ref_of_key.to_numpy(), "b": numpy_column(shared, "rank"), "d": diff})
    pairs = pairs[pairs["a"] != pairs["b"]]
    med = pairs.groupby(["a", "b"])["d"].median()
    weight = pairs.groupby(["a", "b"]).size()
    # Offsets by breadth-first search from the reference over "shares calls with", strongest links first.
    edges: dict[int, list[tuple[int, float, int]]] = {}
    for (a, b), d in med.items():
        w = int(weight[(a, b)])
        edges.setdefault(int(a), []).append((int(b), float(d), w))
        edges.setdefault(int(b), []).append((int(a), -float(d), w))
    ref = ranks[0]
    offsets: dict[int, float] = {ref: 0.0}
    queue = deque([ref])
    while queue:
        a = queue.popleft()
        for b, d, _w in sorted(edges.get(a, []), key=lambda e: -e[2]):
            if b not in offsets:
                offsets[b] = offsets[a] + d
                queue.append(b)
    unaligned = [r for r in ranks if r not in offsets]
    off = {r: int(round(offsets.get(r, 0.0))) for r in ranks}
    aligned_end = numpy_column(shared, "end_ns", float) - shared["rank"].map(off).to_numpy(float)
    resid = np.abs(aligned_end - pd.Series(aligned_end).groupby(numpy_column(shared, "key")).transform("median").to_numpy())
    return Alignment(ref, off, int(shared["key"].nunique()), round(float(np.percentile(resid, 50)) / US, 3),
                     round(float(np.percentile(resid, 90)) / US, 3), unaligned)


def skew_per_call(df: pd.DataFrame, al: Alignment) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per matched call: ranks, first and last rank, arrival skew and the others' wait; and the
    per-rank rows with their aligned arrival and wait."""
    off = df["rank"].map(al.offsets_ns).fillna(0).to_numpy(float)
    df = df.assign(arrive=numpy_column(df, "start_ns", float) - off, leave=numpy_column(df, "end_ns", float) - off)
    timed = df[df["busy_us"].notna() & df["start_ns"].notna()]
    timed = timed[timed.groupby("key")["rank"].transform("nunique") >= 2]
    if timed.empty:
        return pd.DataFrame(columns=CALL_COLUMNS), timed.assign(wait_us=pd.Series(dtype=float))
    last_arrival = timed.groupby("key", sort=False)["arrive"].transform("max")
    timed = timed.assign(wait_us=np.clip((last_arrival - timed["arrive"]) / US, 0, timed["busy_us"]))
    g = timed.groupby("key", sort=False)
    first = timed.loc[g["arrive"].idxmin()].set_index("key")
    last = timed.loc[g["arrive"].idxmax()].set_index("key")
    tol = ALIGN_SLACK_NS + 3 * US * (al.residual_p50_us or 0.0)
    calls = pd.DataFrame({
        "key": first.index,
        "ranks": g["rank"].nunique().reindex(first.index).to_numpy(),
        "first_rank": numpy_column(first, "rank"), "last_rank": numpy_column(last, "rank"),
        "skew_us": (numpy_column(last, "arrive") - numpy_column(first, "arrive")) / US,
        "wait_us": g["wait_us"].sum().reindex(first.index).to_numpy(),
        # One call's ranges overlap on the aligned clock: no rank can leave before the last arrives.
        "valid": (g["arrive"].max() <= g["leave"].min() + tol).reindex(first.index).to_numpy(),
    })
    # Labels from the lowest rank that has the call.
    lab = timed.sort_values("rank", kind="stable").drop_duplicates("key").set_index("key")
    for c in ("matched_by", "type", "pg", "seq", "phase", "step"):
        calls[c] = lab[c].reindex(calls["key"]).to_numpy()
    calls.loc[calls["skew_us"] <= 0, "last_rank"] = -1  # nobody was late
    calls["order"] = lab["arrive"].reindex(calls["key"]).to_numpy()
    calls = calls.sort_values("order", kind="stable").drop(columns="order").reset_index(drop=True)
    return calls[CALL_COLUMNS], timed


def per_step(calls: pd.DataFrame) -> pd.DataFrame:
    ok = calls[calls["valid"] & calls["phase"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    rows = []
    for (ph, idx), g in ok.groupby(["phase", "step"], sort=False):
        late = g[g["skew_us"] >= LATE_MIN_US]
        w = late.groupby("last_rank")["skew_us"].sum()
        rows.append({"phase": ph, "index": int(idx) if idx == idx else None, "collectives": len(g),
                     "skew_max_us": float(g["skew_us"].max()), "skew_total_us": float(g["skew_us"].sum()),
                     "wait_us": float(g["wait_us"].sum()), "last_rank": int(w.idxmax()) if len(w) else None})
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def _mean(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.mean()) if len(s) else 0.0


def short_name(name: str, limit: int = 80) -> str:
    """A kernel or op name without its argument list, cut to `limit` characters."""
    base = name.split("(", 1)[0] if "(" in name and not name.startswith("(") else name
    return base if len(base) <= limit else base[: limit - 3] + "..."


def straggler(calls: pd.DataFrame, rows: pd.DataFrame, span_us: float) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The rank whose late arrivals cost the others the most, and what it was doing instead."""
    late = calls[calls["valid"] & (calls["skew_us"] >= LATE_MIN_US)]
    if late.empty:
        return None, []
    cost = late.groupby("last_rank")["skew_us"].sum().sort_values(ascending=False, kind="stable")
    s = int(cost.index[0])
    mine = late[late["last_rank"] == s]
    keys = set(mine["key"])
    theirs = rows[rows["key"].isin(keys)]
    own, others = theirs[theirs["rank"] == s], theirs[theirs["rank"] != s]
    gap_s, gap_o = _mean(own["lead_gap_us"]), _mean(others["lead_gap_us"])
    busy_s, busy_o = _mean(own["lead_busy_us"]), _mean(others["lead_busy_us"])
    mean_skew = float(mine["skew_us"].mean())
    causes = Counter(c for c in own["lead_gap_cause"].dropna())
    ops = Counter(o for o in own["lead_gap_op"].dropna())
    kernels = Counter(k for k in own["lead_top_kernel"].dropna())
    cause = causes.most_common(1)[0][0] if causes else None
    op = ops.most_common(1)[0][0] if ops else None
    kernel = kernels.most_common(1)[0][0] if kernels else None
    if gap_s - gap_o >= mean_skew / 2:
        doing = (f"its GPU sat idle longer before them: largest idle gap {gap_s:.0f} us on average against {gap_o:.0f} us "
                 f"on the other ranks" + (f" (cause {cause}" + (f", host in {short_name(op)}" if op else "") + ")" if cause else ""))
    elif busy_s - busy_o >= mean_skew / 2:
        k_s = _mean(own.loc[own["lead_top_kernel"] == kernel, "lead_top_kernel_us"]) if kernel else 0.0
        theirs_k = others.loc[others["lead_top_kernel"] == kernel, "lead_top_kernel_us"] if kernel else others["lead_top_kernel_us"][:0]
        doing = f"its GPU computed longer: {busy_s:.0f} us busy on average against {busy_o:.0f} us"
        if kernel:
            doing += (f"; its top kernel there, {short_name(kernel)}, took {k_s:.0f} us against {_mean(theirs_k):.0f} us"
                      if len(theirs_k) else f"; its top kernel there, {short_name(kernel)} ({k_s:.0f} us), is not the others' top kernel")
    else:
        doing = (f"its GPU timeline looks like the others' ({busy_s:.0f} us busy, largest gap {gap_s:.0f} us, "
                 f"against {busy_o:.0f} and {gap_o:.0f} us): the delay is on its host or in its launch path")
    steps = mine[["phase", "step"]].drop_duplicates()
    phases = mine["phase"].dropna()
    phase = str(phases.mode().iat[0]) if len(phases) else None
    total = float(cost.iloc[0])
    info = {
        "rank": s, "late_calls": len(mine), "skewed_calls": len(late), "calls": int(calls["valid"].sum()),
        "mean_skew_us": round(mean_skew, 3), "cost_us": round(total, 3), "others_waited_us": round(float(mine["wait_us"].sum()), 3),
        "steps": len(steps), "phase": phase, "lead_gap_us": round(gap_s, 3), "others_lead_gap_us": round(gap_o, 3),
        "lead_busy_us": round(busy_s, 3), "others_lead_busy_us": round(busy_o, 3), "lead_gap_cause": cause,
        "lead_gap_op": op, "lead_top_kernel": kernel, "doing": doing,
    }
    ev = mine.sort_values("skew_us", ascending=False, kind="stable").head(5)
    f = Finding(
        id="straggler_rank", title=f"Rank {s} arrives last at collectives", category="communication",
        recommendation=("Find what rank "
                        f"{s} does before its collectives that the others do not (its own trace's gaps and top ops in "
                        "those windows): uneven work per rank (sequence lengths, expert loads), host-side delays "
                        "(Python, data loading, logging on one rank), or a slower GPU or link."),
        cost_total_us=total, cost_per_step_us=total / len(steps) if len(steps) else None, est_savings_us=total,
        severity=severity_for(total, span_us), phase=phase,
        evidence=[{"phase": r.phase, "step": None if r.step != r.step else int(r.step), "type": r.type,
                   "skew_us": round(float(r.skew_us), 3), "others_waited_us": round(float(r.wait_us), 3)}
                  for r in ev.itertuples()],
        detail=(f"Rank {s} arrived last at {len(mine)} of {len(late)} collectives where the ranks were at least "
                f"{LATE_MIN_US:.0f} us apart ({len(steps)} steps), on average {mean_skew:.0f} us after the first rank; "
                f"the other ranks waited {float(mine['wait_us'].sum()):.0f} us in total inside those collectives. "
                f"Before them, {doing}."),
    )
    return info, [f]


@dataclass
class CollectiveSkew:
    calls: pd.DataFrame  # one row per matched call (CALL_COLUMNS)
    steps: pd.DataFrame  # per step (STEP_COLUMNS)
    alignment: Alignment
    straggler: dict[str, Any] | None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unmatched: int = 0

    def to_json(self) -> dict[str, Any]:
        ok = self.calls[self.calls["valid"]] if len(self.calls) else self.calls
        by = Counter(ok["matched_by"]) if len(ok) else Counter()
        top = ok.sort_values("skew_us", ascending=False, kind="stable").head(TOP_CALLS) if len(ok) else ok
        return {
            "matched": len(ok), "unmatched": self.unmatched, "matched_by": dict(sorted(by.items())),
            "clock_alignment": self.alignment.to_json(),
            "skew_us": None if ok.empty else {"mean": round(float(ok["skew_us"].mean()), 3),
                                              "p50": round(float(ok["skew_us"].median()), 3),
                                              "max": round(float(ok["skew_us"].max()), 3)},
            "wait_us": None if ok.empty else round(float(ok["wait_us"].sum()), 3),
            "last_rank_counts": {str(int(k)): int(v) for k, v in
                                 ok.loc[ok["skew_us"] >= LATE_MIN_US, "last_rank"].value_counts().sort_index().items()} if len(ok) else {},
            "straggler": self.straggler,
            "steps": [_plain_row(r) for r in self.steps.to_dict("records")],
            "top": [_plain_row(r) for r in top.drop(columns=["key", "valid"]).to_dict("records")],
            "notes": self.notes,
        }

    def summary_lines(self) -> list[str]:
        ok = self.calls[self.calls["valid"]] if len(self.calls) else self.calls
        if ok.empty:
            return ["collectives: none matched across ranks"] if not self.notes else [f"note: {n}" for n in self.notes]
        a = self.alignment
        offs = ", ".join(f"rank {r} {o / US:+.1f} us" for r, o in sorted(a.offsets_ns.items()) if r != a.reference)
        out = [f"collectives matched across ranks: {len(ok)} ({', '.join(f'{v} by {k}' for k, v in sorted(Counter(ok['matched_by']).items()))});"
               f" arrival skew mean {ok['skew_us'].mean():.1f} us, max {ok['skew_us'].max():.1f} us;"
               f" others waited {ok['wait_us'].sum():.1f} us in total",
               f"clocks aligned on {a.calls} matched collective ends (reference rank {a.reference}"
               + (f"; {offs}" if offs else "") + (f"; residual p90 {a.residual_p90_us:.1f} us" if a.residual_p90_us is not None else "") + ")"]
        if self.straggler:
            s = self.straggler
            out.append(f"straggler: rank {s['rank']}, last at {s['late_calls']} of {s['skewed_calls']} skewed collectives, "
                       f"{s['mean_skew_us']:.0f} us late on average; before them {s['doing']}")
        out.extend(f"note: {n}" for n in self.notes)
        return out


def _plain_row(r: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in r.items():
        if isinstance(v, (np.integer,)):
            v = int(v)
        elif isinstance(v, (float, np.floating)):
            v = None if v != v else round(float(v), 3)
        elif isinstance(v, np.bool_):
            v = bool(v)
        out[k] = v
    if out.get("last_rank") == -1:
        out["last_rank"] = None
    return out


def collective_skew(results: list[dict[str, Any]], span_us: float) -> CollectiveSkew | None:
    """Match, align and measure the collectives of analysed ranks (None when no rank has any)."""
    df = instances_frame(results)
    if df.empty:
        return None
    df = match(df)
    ranks = sorted(int(r) for r in df["rank"].unique())
    al = align(df, ranks)
    calls, rows = skew_per_call(df, al)
    good = set(calls.loc[calls["valid"].astype(bool), "key"])
    if len(good) < len(calls):
        # Some order matches are not one call: align again on the ones that hold.
        al = align(df[df["key"].isin(good)], ranks)
        calls, rows = skew_per_call(df, al)
    notes = []
    per_key = df.groupby("key")["rank"].nunique()
    unmatched = int((per_key < 2).sum())
    if unmatched:
        notes.append(f"{unmatched} collective calls appear on one rank only (other ranks' traces lack them)")
    bad = calls[~calls["valid"]] if len(calls) else calls
    if len(bad):
        notes.append(f"{len(bad)} calls matched by order do not overlap in time once clocks are aligned (events missing "
                     "from some ranks' traces?): left out of the skew")
    if al.unaligned:
        notes.append(f"ranks {', '.join(map(str, al.unaligned))} share no timed collective with the others: their clocks "
                     "are not aligned")
    info, findings = straggler(calls, rows, span_us) if len(calls) else (None, [])
    return CollectiveSkew(calls, per_step(calls), al, info, findings, notes, unmatched)
