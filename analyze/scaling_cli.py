"""`tokentrace scaling`: fit prefill attention cost against prompt length across a sweep of traces.

A thin skin over `analyze.scaling.fit_sweep`: DIR_OR_TRACES are trace files or directories (a
`tokentrace capture --prompt-lens 128,256,512,...` output folder is searched recursively), one
point per trace. Prints a table of points and fits; `--json` writes the result.
"""

from __future__ import annotations

import json

import click


@click.command("scaling")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the sweep's points and fits as JSON to FILE ('-' for stdout).")
def scaling_cmd(paths: tuple[str, ...], json_out: str | None) -> None:
    """Fit attention GPU time per call against prompt length over DIR_OR_TRACES (one point per trace)."""
    from tokentrace.analyze.scaling import fit_sweep
    from tokentrace.io import write_output

    sweep = fit_sweep(list(paths))
    if json_out:
        write_output(json_out, json.dumps(sweep.to_json(), indent=2))
    if json_out == "-":
        return
    t = sweep.traces
    if t.empty:
        click.echo("no prefill attention calls found in the given traces")
    else:
        click.echo(f"{'prompt_len':>10} {'batch':>6} {'calls':>6} {'median us':>10} {'time':>4}  op (backend)  trace")
        for r in t.sort_values(["op", "backend", "prompt_len"]).itertuples():
            batch = "-" if r.batch is None or r.batch != r.batch else int(r.batch)
            plen = "?" if r.prompt_len is None or r.prompt_len != r.prompt_len else f"{r.prompt_len:g}"
            click.echo(f"{plen:>10} {batch!s:>6} {r.calls:>6} {r.median_us:>10.1f} {r.time:>4}  {r.op} ({r.backend})  {r.path}")
    for f in sweep.fits:
        err = "" if f["exponent_stderr"] is None else f" +/- {f['exponent_stderr']:.2f}"
        click.echo(f"fit: {f['op']} ({f['backend']}, batch {f['batch']}): time ~ S^{f['exponent']:.2f}{err} "
                   f"over {len(f['points'])} prompt lengths (r2 {f['r2'] if f['r2'] is not None else '-'})")
    for n in sweep.notes:
        click.echo(f"note: {n}", err=True)
