"""Terminal text of the comparison commands: check, ranks, scaling and the HTA cross-check.

The analysis side returns data (CheckResult, RanksResult, Sweep, the HTA comparison); this module
owns how a person reads them in a terminal, so all terminal text lives in reports/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokentrace.reports import format as fmt

if TYPE_CHECKING:
    from tokentrace.analysis.compare.check import CheckResult
    from tokentrace.analysis.compare.ranks import RanksResult
    from tokentrace.analysis.compare.scaling import Sweep

def _text(lines: list[str]) -> str:
    """The lines as terminal text: a file name or trace string cannot add a line or send an escape."""
    return "\n".join(fmt.visible(line, one_line=True) for line in lines)


def check_text(result: CheckResult) -> str:
    """`tokentrace check`: one line per threshold, notes, and the verdict."""
    lines = [f"tokentrace check: {result.trace}" + (f" (baseline {result.baseline})" if result.baseline else "")]
    for i in result.items:
        tag = "ok  " if i.status == "pass" else "FAIL"
        lines.append(f"  {tag}  {i.message}")
    for n in result.notes:
        lines.append(f"  note  {n}")
    n_fail = len(result.failures)
    lines.append(f"{n_fail} of {len(result.items)} checks failed" if n_fail else f"all {len(result.items)} checks passed")
    return _text(lines)


def _step_label(row: Any) -> str:
    # Training segments have phase "step": "step 3", not "step step 3".
    return f"step {int(row['index'])}" if row["phase"] == "step" else f"{row['phase']} step {int(row['index'])}"


def ranks_text(result: RanksResult) -> str:
    """`tokentrace ranks`: the per-rank table, then the slowest rank and the skew per step."""
    lines = ["rank  steps  step total   step max     GPU busy    util    file"]
    for r in result.ranks.to_dict("records"):
        if r["error"]:
            lines.append(f"  -   error: {r['error']}")
            continue
        lines.append(f"{r['rank']:>4}  {r['steps']:>5}  {fmt.duration(r['step_total_us']):>10}  {fmt.duration(r['step_max_us']):>10}"
                     f"  {fmt.duration(r['gpu_busy_us']):>10}  {fmt.share(r['gpu_utilization']):>6}  {r['path']}")
    ps = result.per_step
    if len(ps):
        worst = ps.loc[ps["skew_us"].idxmax()]
        counts = ps["slowest_rank"].value_counts()
        lines.append("")
        lines.append(f"slowest rank overall: {result.slowest_rank}; slowest in most steps: rank {int(counts.index[0])} "
                     f"({int(counts.iloc[0])} of {len(ps)} steps)")
        lines.append(f"skew per step: mean {fmt.duration(float(ps['skew_us'].mean()))}, max {fmt.duration(float(worst['skew_us']))} "
                     f"({_step_label(worst)}, rank {int(worst['slowest_rank'])} vs {int(worst['fastest_rank'])})")
    for n in result.notes:
        lines.append(f"note: {n}")
    return _text(lines)


def scaling_text(sweep: Sweep) -> tuple[str, list[str]]:
    """`tokentrace scaling`: the points table and the fits (stdout), and the notes (stderr)."""
    lines: list[str] = []
    t = sweep.traces
    if t.empty:
        lines.append("no prefill attention calls found in the given traces")
    else:
        lines.append(f"{'prompt_len':>10} {'batch':>6} {'calls':>6} {'median us':>10} {'time':>4}  op (backend)  trace")
        for r in t.sort_values(["op", "backend", "prompt_len"]).itertuples():
            batch = "-" if r.batch is None or r.batch != r.batch else int(r.batch)
            plen = "?" if r.prompt_len is None or r.prompt_len != r.prompt_len else f"{r.prompt_len:g}"
            lines.append(f"{plen:>10} {batch!s:>6} {r.calls:>6} {r.median_us:>10.1f} {r.time:>4}  {r.op} ({r.backend})  {r.path}")
    for f in sweep.fits:
        err = "" if f["exponent_stderr"] is None else f" +/- {f['exponent_stderr']:.2f}"
        lines.append(f"fit: {f['op']} ({f['backend']}, batch {f['batch']}): time ~ S^{f['exponent']:.2f}{err} "
                     f"over {len(f['points'])} prompt lengths (r2 {f['r2'] if f['r2'] is not None else '-'})")
    return _text(lines), [fmt.visible(f"note: {n}", one_line=True) for n in sweep.notes]


def hta_text(comparison: dict[str, Any]) -> str:
    """`tokentrace analyze --hta`: our GPU span/busy/idle beside HTA's, with the caveats."""
    if "error" in comparison:
        return fmt.visible(f"HTA comparison: {comparison['error']}", one_line=True)
    span = max(max(a, b) for name, a, b in comparison["rows"] if name == "span")
    span = max(span, 1e-9)
    out = ["GPU time (us)       tokentrace            HTA     diff (% of span)"]
    for name, a, b in comparison["rows"]:
        out.append(f"{name:<12}{a:>18,.1f}{b:>15,.1f}{100.0 * abs(a - b) / span:>14.3f}")

    def pct(u: float | None) -> str:
        return "n/a" if u is None else f"{100.0 * u:.2f}%"

    ours, theirs = comparison["utilization"]
    out.append(f"{'utilization':<12}{pct(ours):>18}{pct(theirs):>15}")
    out.extend(f"note: {c}" for c in comparison["caveats"])
    return _text(out)
