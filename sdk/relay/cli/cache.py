"""`relay cache`: what this machine keeps in the engine's cache, and pruning.

Frame indexes (a second copy of a LeRobot dataset's frames laid out for random access, about the
size of its parquet files), RT-J's memory-mapped context arrays and RelBench datasets converted to
Relay's layout are made again when missing: they share the limit RELAY_FRAME_CACHE_MAX_BYTES (64 GiB
unless set; 0: no limit) and go least recently used first (frame indexes also when a new one is
built). Snapshots of SQL databases cannot be made again, and a model trained on one serves from it:
they go only when `relay cache prune --databases-older-than DAYS` asks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from relay.cli._common import console, fail, show_table
from relay.cli._extras import require
from relay.formatting import size_text

app = typer.Typer(
    help="What the engine's cache holds (frame indexes, RT-J context arrays, RelBench conversions, "
    "database snapshots): show it (the default) or prune it.",
    invoke_without_command=True,
)
_out = console()

CacheDirOption = Annotated[
    Path | None, typer.Option(help="The cache [default: RELAY_CACHE_DIR or ~/.cache/relay].")
]


@app.callback()
def show(ctx: typer.Context, cache_dir: CacheDirOption = None) -> None:
    """Each entry: its kind, what it holds, its size and when it was last used; the totals and the limit."""
    if ctx.invoked_subcommand is not None:
        return
    frame_cache = require("relay_engine.datasets.frame_cache")
    contents = require("relay_engine.cache_contents")
    paths = require("relay_engine.paths")
    cache = paths.cache_dir_or_default(cache_dir)
    try:
        limit = frame_cache.limit_bytes()
    except ValueError as error:
        fail(str(error))
    found = contents.everything(cache)
    table = Table("kind", "what", "size", "last used", "where (in the cache)")
    for entry in reversed(found):
        table.add_row(
            entry.kind,
            entry.description,
            size_text(entry.bytes),
            _when(entry.last_used),
            _under(entry.path, cache),
        )
    show_table(table, _out)
    indexes = [entry for entry in found if entry.kind == contents.FRAME_INDEX]
    remade = [
        entry for entry in found if entry.kind in (contents.CONTEXTS, contents.TABLE_COPY, contents.RELBENCH)
    ]
    snapshots = [entry for entry in found if entry.kind == contents.SNAPSHOT]
    shown_limit = size_text(limit) if limit else "none"
    _out.print(
        f"{len(indexes)} indexes, {size_text(_total(indexes))} in {cache / 'frames'}; limit {shown_limit}"
    )
    _out.print(
        f"{len(remade)} context arrays, table copies and RelBench conversions, {size_text(_total(remade))} "
        "(made again when missing; under the same limit)"
    )
    _out.print(
        f"{len(snapshots)} database snapshots, {size_text(_total(snapshots))} in {cache / 'databases'} "
        "(kept until prune --databases-older-than)"
    )


@app.command()
def prune(
    max_gb: Annotated[
        float | None,
        typer.Option(
            help="Keep at most this many GB (10^9 bytes) of frame indexes, context arrays and RelBench "
            "conversions (default: the limit, RELAY_FRAME_CACHE_MAX_BYTES)."
        ),
    ] = None,
    databases_older_than: Annotated[
        float | None,
        typer.Option(
            metavar="DAYS",
            help="Also remove the database snapshots not used (opened or taken) for this many days. "
            "A model trained on a snapshot needs it to serve (default: keep every snapshot).",
        ),
    ] = None,
    cache_dir: CacheDirOption = None,
) -> None:
    """Remove the least recently used entries that are made again when missing until they fit, and
    old database snapshots when asked; entries in use stay."""
    frame_cache = require("relay_engine.datasets.frame_cache")
    contents = require("relay_engine.cache_contents")
    paths = require("relay_engine.paths")
    cache = paths.cache_dir_or_default(cache_dir)
    if max_gb is not None and max_gb < 0:
        fail(f"bad --max-gb: {max_gb} (must be 0 or more)")
    if databases_older_than is not None and databases_older_than < 0:
        fail(f"bad --databases-older-than: {databases_older_than} (must be 0 or more days)")
    try:
        limit = int(max_gb * 1e9) if max_gb is not None else frame_cache.limit_bytes()
    except ValueError as error:
        fail(str(error))
    # Without --max-gb, a limit of 0 means no limit; --max-gb 0 means keep nothing not in use.
    removed = contents.prune_to_size(cache, limit) if limit or max_gb == 0 else []
    if databases_older_than is not None:
        removed += contents.prune_snapshots(cache, databases_older_than)
    for entry in removed:
        _out.print(f"removed the {entry.kind} {entry.description} ({size_text(entry.bytes)})")
    left = contents.everything(cache)
    _out.print(f"{len(removed)} removed; {len(left)} left, {size_text(_total(left))}")


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp).isoformat(sep=" ", timespec="seconds")


def _under(path: Path, cache: Path) -> str:
    """Where an entry is, from the cache's directory."""
    return str(path.relative_to(cache)) if path.is_relative_to(cache) else str(path)


def _total(entries: Sequence[Any]) -> int:
    return sum(entry.bytes for entry in entries)
