"""`tokentrace check TRACE`: exit 0 when every threshold holds, 1 with the list when any fails, 2 on bad input."""

from __future__ import annotations

import click

from tokentrace.cli.loading import load_options
from tokentrace.cli.options import phase_option, phases_of

EXIT_CHECK_FAILED = 1


@click.command("check")
@click.argument("trace", type=click.Path(exists=False, dir_okay=True))
@click.option("--config", "config", metavar="FILE.toml", help="Thresholds from a TOML file (top level, [check] or [tool.tokentrace.check]).")
@click.option("--max-idle-share-decode", type=float, default=None, help="Largest GPU idle share in decode (0..1).")
@click.option("--max-syncs-per-token", type=float, default=None, help="Most host-device syncs per decode token.")
@click.option("--max-tpot-us", type=float, default=None, help="Largest median time per output token (us).")
@click.option("--max-ttft-us", type=float, default=None, help="Largest time to first token (us).")
@click.option("--baseline", metavar="TRACE_OR_JSON", default=None, help="Baseline trace or saved JSON summary for --max-regression.")
@click.option("--max-regression", type=float, default=None, metavar="PCT", help="Largest allowed slowdown of TTFT/TPOT vs the baseline, in percent.")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the results as JSON to FILE ('-' for stdout).")
@phase_option
@load_options
def check_cmd(trace: str, config: str | None, max_idle_share_decode: float | None, max_syncs_per_token: float | None,
              max_tpot_us: float | None, max_ttft_us: float | None, baseline: str | None, max_regression: float | None,
              json_out: str | None, phase: tuple[str, ...]) -> None:
    """Check TRACE (a trace, a capture run or sweep folder, or a saved JSON summary) against thresholds; for CI jobs.

    Exit 0 when all hold (on every run of a sweep), 1 when any fails (or its metric is absent), 2 on bad input.
    """
    import tokentrace
    from tokentrace.io import plan, uses_stdout, write_all
    from tokentrace.jsonout import dumps
    from tokentrace.reports.text import check_text

    outs = plan({"--json": json_out}, [p for p in (trace, baseline, config) if p])
    result = tokentrace.check(trace, config=config, baseline=baseline, max_regression=max_regression, phases=phases_of(phase),
                              max_idle_share_decode=max_idle_share_decode, max_syncs_per_token=max_syncs_per_token,
                              max_tpot_us=max_tpot_us, max_ttft_us=max_ttft_us)
    if not uses_stdout(outs):
        from tokentrace.analysis.compare.sweep import SweepCheck
        from tokentrace.reports.sweep import sweep_check_text

        click.echo(sweep_check_text(result) if isinstance(result, SweepCheck) else check_text(result))
    write_all([(dest, lambda: dumps(result.to_json())) for dest in outs.values()])
    if not result.passed:
        click.get_current_context().exit(EXIT_CHECK_FAILED)
