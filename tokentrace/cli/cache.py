"""`tokentrace cache`: where the cache folder is, what its three caches hold against their limits,
and `--clear` to empty them (analysis.cache_folder)."""

from __future__ import annotations

import click


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@click.command("cache")
@click.option("--clear", is_flag=True, help="Remove every cached trace, result and summary (nothing else in the folder).")
def cache_cmd(clear: bool) -> None:
    """Show tokentrace's cache folder ($TOKENTRACE_CACHE_DIR, else ~/.cache/tokentrace) and what it holds."""
    from tokentrace.analysis import cache_folder
    from tokentrace.analysis.loading.cache import default_root

    root = default_root()
    if clear:
        gone = cache_folder.clear(root)
        click.echo(f"tokentrace cache: {root}: removed " + ", ".join(f"{p.entries} {p.name} ({_mb(p.bytes)})" for p in gone))
        return
    click.echo(f"tokentrace cache: {root}")
    for p in cache_folder.parts(root):
        limit = f"of {_mb(p.limit_bytes)}" if p.limit_bytes is not None else "(not evicted)"
        click.echo(f"  {p.name:<10} {p.entries:>6} entries  {_mb(p.bytes):>12} {limit}")
    click.echo("  --no-cache bypasses them; TOKENTRACE_CACHE_SIZE sets the limit; tokentrace cache --clear empties them")
