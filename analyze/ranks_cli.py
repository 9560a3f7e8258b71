"""`tokentrace ranks DIR...`: analyse rank traces in parallel; per-rank table, slowest rank per step, skew."""

from __future__ import annotations

import json

import click


def _step_label(row) -> str:  # noqa: ANN001 - a per_step row
    # Training segments have phase "step": "step 3", not "step step 3".
    return f"step {int(row['index'])}" if row["phase"] == "step" else f"{row['phase']} step {int(row['index'])}"


def _table(result) -> str:  # noqa: ANN001 - RanksResult, imported lazily
    from tokentrace.reports import format as fmt

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
    return "\n".join(lines)


@click.command("ranks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the per-rank and per-step tables as JSON.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: one per CPU).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval counted as a gap (default 3 us).")
def ranks_cmd(paths: tuple[str, ...], json_out: str | None, workers: int | None, min_gap_us: float | None) -> None:
    """Analyse the rank traces in PATHS (files or directories) in parallel and compare the ranks."""
    from tokentrace.analyze.ranks import analyze_ranks
    from tokentrace.io import write_output

    options = {} if min_gap_us is None else {"min_gap_us": min_gap_us}
    result = analyze_ranks(paths, workers=workers, options=options)
    if json_out != "-":
        click.echo(_table(result))
    if json_out:
        write_output(json_out, json.dumps(result.to_json(), indent=2))
