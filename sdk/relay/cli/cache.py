"""`relay cache`: the frame indexes this machine keeps of the datasets it trained on, and pruning.

An index holds a second copy of a dataset's frames laid out for random access (about the size of
its parquet files). A dataset's new content replaces its old index; the least recently used go
when the cache passes RELAY_FRAME_CACHE_MAX_BYTES (64 GiB unless set; 0: no limit).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relay.cli._common import console, fail, show_table
from relay.cli._extras import require
from relay.formatting import size_text

app = typer.Typer(
    help="The frame indexes of datasets in the cache: show them (the default) or prune them.",
    invoke_without_command=True,
)
_out = console()

CacheDirOption = Annotated[
    Path | None, typer.Option(help="The cache [default: RELAY_CACHE_DIR or ~/.cache/relay].")
]


@app.callback()
def show(ctx: typer.Context, cache_dir: CacheDirOption = None) -> None:
    """Each index: its dataset, its size and when it was last used; the total and the limit."""
    if ctx.invoked_subcommand is not None:
        return
    frame_cache = require("relay_engine.datasets.frame_cache")
    paths = require("relay_engine.paths")
    cache = paths.cache_dir_or_default(cache_dir)
    try:
        limit = frame_cache.limit_bytes()
    except ValueError as error:
        fail(str(error))
    found = frame_cache.entries(cache)
    table = Table("dataset", "size", "last used", "index")
    for entry in reversed(found):
        used = dt.datetime.fromtimestamp(entry.last_used).isoformat(sep=" ", timespec="seconds")
        table.add_row(entry.dataset, size_text(entry.bytes), used, entry.path.name)
    show_table(table, _out)
    total = sum(entry.bytes for entry in found)
    shown_limit = size_text(limit) if limit else "none"
    _out.print(f"{len(found)} indexes, {size_text(total)} in {cache / 'frames'}; limit {shown_limit}")


@app.command()
def prune(
    max_gb: Annotated[
        float | None,
        typer.Option(
            help="Keep at most this many GB (10^9 bytes) (default: the limit, RELAY_FRAME_CACHE_MAX_BYTES)."
        ),
    ] = None,
    cache_dir: CacheDirOption = None,
) -> None:
    """Remove the least recently used indexes until the cache fits; indexes in use stay."""
    frame_cache = require("relay_engine.datasets.frame_cache")
    paths = require("relay_engine.paths")
    cache = paths.cache_dir_or_default(cache_dir)
    if max_gb is not None and max_gb < 0:
        fail(f"bad --max-gb: {max_gb} (must be 0 or more)")
    try:
        limit = int(max_gb * 1e9) if max_gb is not None else frame_cache.limit_bytes()
    except ValueError as error:
        fail(str(error))
    if max_gb == 0:
        removed = [entry for entry in frame_cache.entries(cache) if frame_cache.remove(entry)]
    else:
        removed = frame_cache.prune(cache, limit)
    for entry in removed:
        _out.print(f"removed the index of {entry.dataset} ({size_text(entry.bytes)})")
    left = frame_cache.entries(cache)
    _out.print(f"{len(removed)} removed; {len(left)} left, {size_text(sum(e.bytes for e in left))}")
