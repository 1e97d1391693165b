"""`rift-ada status DIR`: progress of a trace directory (per shard), live writers, leftovers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


def _progress(row: dict[str, Any]) -> str:
    return f"{row['committed']}/{row['expected']}" if row["expected"] is not None else str(row["committed"])


def _writer(row: dict[str, Any]) -> str:
    holder = row["writer"]
    if holder is None:
        return "-"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}" if holder else "starting"


def status(
    trace_dir: Annotated[Path, typer.Argument(help="Trace directory (rift-ada collect --out).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
    upgrade: Annotated[
        bool, typer.Option(help="Move a version-1 directory (parts/) into the current layout, in place.")
    ] = False,
) -> None:
    """Per-shard progress of a collection: committed vs expected requests, live writers, leftovers."""
    from rift_ada.collectors.trace_io import TraceError, trace_status, upgrade_layout

    try:
        if upgrade:
            moved = upgrade_layout(trace_dir)
            console.print(f"upgraded {escape(str(trace_dir))}: {moved} parts moved into the current layout")
        info = trace_status(trace_dir)
    except (TraceError, OSError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=1) from None
    if as_json:
        typer.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    expected = info["n_requests_expected"]
    console.print(
        f"{escape(str(trace_dir))}: {info['mode']} traces (layout v{info['layout_version']}), "
        f"{info['n_requests_committed']} of {expected if expected is not None else '?'} requests committed "
        f"in {info['n_parts']} parts"
    )
    table = Table(title="Shards")
    for column in ("shard", "committed / expected", "parts", "writer"):
        table.add_column(column, no_wrap=True)
    for row in info["shards"]:
        table.add_row(row["shard"], _progress(row), str(row["parts"]), escape(_writer(row)))
    console.print(table)
    if info["missing_request_ids"]:
        missing = info["missing_request_ids"]
        console.print(f"missing: {len(missing)} requests, e.g. {escape(str(missing[:5]))}")
    if info["uncommitted_files"]:
        console.print(
            f"{len(info['uncommitted_files'])} uncommitted files of killed writers (ignored by readers; "
            "removed when their shard resumes)"
        )
    if info["stray_files"]:
        console.print(f"{len(info['stray_files'])} stray files (ignored): {escape(str(info['stray_files'][:5]))}")


def register(app: typer.Typer) -> None:
    """Add the `status` command to the CLI."""
    app.command("status")(status)


__all__ = ["register", "status"]
