"""What the CLI's command groups share: error output, tables and argument parsing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from relay.checkpoints import is_fine_tune_id
from relay.dataset_names import is_database_url
from relay.errors import APIError, ConfigError
from relay.formatting import number_text

# Off a terminal (piped, redirected) rich would squeeze everything into 80 columns and cut values
# short; there output is as wide as its content instead (COLUMNS, when set, still rules).
PIPED_WIDTH = 100_000


def console(stderr: bool = False) -> Console:
    """The CLI's console: a terminal's width on a terminal, the content's width anywhere else."""
    made = Console(stderr=stderr)
    if made.is_terminal or os.environ.get("COLUMNS"):
        return made
    return Console(stderr=stderr, width=PIPED_WIDTH)


err = console(stderr=True)
out = console()
JSON_HINT = "(--json prints this as JSON, one object a line, for scripts)"


def show_table(table: Table, on: Console | None = None, json_hint: bool = False) -> None:
    """Print a table whose values are never cut: a column too narrow wraps (folds) its values.
    Off a terminal, a table of a command that has --json says so on stderr."""
    shown = on or out
    for column in table.columns:
        column.no_wrap, column.overflow = False, "fold"
    shown.print(table)
    if json_hint and not shown.is_terminal:
        err.print(JSON_HINT, style="dim", highlight=False)


_STATUS_STYLE = {
    "completed": "green",
    "ready": "green",
    "error": "red",
    "cancelled": "yellow",
    "cancel_requested": "yellow",
    "closed": "yellow",
    "stopped": "yellow",
    "running": "cyan",
    "starting": "cyan",
    "queued": "blue",
    # A webhook's delivery.
    "delivered": "green",
    "failed": "red",
    "pending": "blue",
}


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit 1."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def clear_errors() -> Iterator[None]:
    """A refused request or a broken rule is a message and exit status, not a traceback."""
    try:
        yield
    except ConfigError as error:  # a broken rule is a usage error: exit 2, as typer's own are
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except typer.Exit:  # click's Exit is a RuntimeError: an exit already chosen stays as chosen
        raise
    except (APIError, RuntimeError, TimeoutError) as error:
        fail(str(error))


def dataset_name(dataset: str) -> str:
    """A directory that exists here is meant as one, even when given relative (`my_data`, `data/x`);
    a SQLite file given relative (sqlite:///shop.db) is named by its absolute path, so a job or
    an evaluation run from elsewhere reads the same file."""
    if is_database_url(dataset):
        return _absolute_sqlite_url(dataset)
    path = Path(dataset).expanduser()
    if not dataset.startswith("file://") and path.is_dir():
        return str(path.resolve())
    return dataset


MIX_OPTION_HELP = (
    "A dataset of a mixture, NAME[@REVISION][:WEIGHT] (team/pick-fork@v2.1:3, ./my_data:1), "
    "repeatable, in place of --dataset: each dataset's share of the samples is its weight (default 1) "
    "over the sum; the first is the robot the output describes. Per-dataset cameras: --config."
)


def mixture_of_options(mix: list[str] | None) -> list[dict[str, Any]] | None:
    """The recipe's ``datasets`` from repeated --mix NAME[@REVISION][:WEIGHT] options (None for none):
    a trailing :NUMBER is the weight; an @ splits a Hub name from its revision (a directory that
    exists here is a local dataset, named by its absolute path, whatever it holds)."""
    if not mix:
        return None
    entries: list[dict[str, Any]] = []
    for text in mix:
        entry: dict[str, Any] = {}
        name, colon, weight = text.rpartition(":")
        if colon and name and _is_number(weight):
            entry["weight"] = float(weight)
            text = name
        if "@" in text and not Path(text).expanduser().is_dir():
            text, _, entry["revision"] = text.rpartition("@")
        entries.append({"name": dataset_name(text), **entry})
    return entries


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def checkpoint_name(value: str) -> str:
    """A from_checkpoint value as the job will read it: a directory that exists here is meant as one,
    named by its absolute path, even when given relative (`models/pick`); a fine-tune's id or a Hub
    repo id is kept as it is."""
    path = Path(value).expanduser()
    if not is_fine_tune_id(value) and path.is_dir():
        return str(path.resolve())
    return value


def _absolute_sqlite_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return url
    path = Path(name).expanduser()
    if path.is_absolute() or not path.is_file():
        return url
    return parsed.set(database=str(path.absolute())).render_as_string(hide_password=False)


def parse_pairs(values: list[str], option: str) -> dict[str, str]:
    """['a=b', 'c=d'] -> {'a': 'b', 'c': 'd'}, or a usage error naming --option."""
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key or not item:
            raise typer.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint=f"--{option}")
        pairs[key] = item
    return pairs


def split_targets(values: list[str] | None) -> list[str] | None:
    """`--target a --target b` and `--targets a,b` (or a mix) -> ['a', 'b']; None when none given."""
    targets = [name.strip() for value in values or [] for name in value.split(",") if name.strip()]
    return targets or None


def status_text(status: str) -> str:
    """A job's or session's status, coloured the same way in every table."""
    style = _STATUS_STYLE.get(status)
    return f"[{style}]{status}[/{style}]" if style else status


def _field_text(key: str, value: Any) -> str:
    if key == "status":
        return status_text(value)
    if isinstance(value, list | dict):
        return json.dumps(value)
    if isinstance(value, float):  # a loss or a rate: 4 significant digits, as everywhere (JSON keeps all)
        return number_text(value)
    return escape(str(value))


def show_record(record: dict[str, Any], as_json: bool) -> None:
    """One job or session: a JSON line, or a two-column table of its set fields."""
    if as_json:
        print(json.dumps(record))
        return
    table = Table(show_header=False, box=None)
    for key, value in record.items():
        if key == "object" or value is None:
            continue
        table.add_row(f"[bold]{key}[/bold]", _field_text(key, value))
    show_table(table, json_hint=True)
