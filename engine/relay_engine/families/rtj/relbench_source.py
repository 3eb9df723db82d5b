"""RelBench datasets and tasks as RT-J databases.

`relbench_database` reads a RelBench dataset through the `relbench` package (installed separately:
`pip install relbench`) and writes it in Relay's layout (schema.json, tables/, tasks/), returning the
directory, which `open_database` then reads like any other. It takes

- a name: `relbench:rel-f1` (the dataset and all its binary and regression entity tasks) or
  `relbench:rel-f1/driver-dnf` (one task); a local RelBench directory (one with manifest.yaml) may
  stand in for the dataset name: `relbench:/data/rel-f1` or `relbench:/data/rel-f1/driver-dnf`;
- or RelBench's own objects: a `relbench.base.Dataset`, with tasks as `EntityTask` objects (or names
  the dataset can load).

Each RelBench table becomes a table with its primary key, foreign keys and time column; each entity
task with a binary or regression target becomes a task whose splits are RelBench's
`get_table(split)` (entity, time and target columns), with the dataset's val and test timestamps as
its `cutoffs`. The database is RelBench's view for the tasks: rows up to the test timestamp, without
the columns a task must not see.

A name is downloaded by RelBench into the Hugging Face cache; without network access and not cached
there, a DatasetError says so. Converted names are kept under the Relay cache
(RELAY_CACHE_DIR/relbench/) and reused.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from relay.dataset_names import RELBENCH_PREFIX as PREFIX
from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import MAX_FOREIGN_KEYS, RELBENCH_MARKER_FILE, SCHEMA_FILE, SPLITS
from relay_engine.paths import default_cache_dir

MARKER_FILE = RELBENCH_MARKER_FILE  # what a converted directory was made from, to reuse it
PROBLEM_TYPES = {"binary_classification": "binary", "regression": "regression"}
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def parse_relbench_name(name: str) -> tuple[str, str | None]:
    """`relbench:<dataset>[/<task>]` as (dataset, task or None). The dataset is a RelBench name
    (rel-f1) or a local RelBench directory; a task is the part after the last "/" when what is
    before it is such a directory, else after the first "/"."""
    if not name.startswith(PREFIX):
        raise DatasetError(name, f"a RelBench name starts with {PREFIX!r}, e.g. relbench:rel-f1/driver-dnf")
    rest = name[len(PREFIX) :].strip().rstrip("/")
    if not rest:
        raise DatasetError(
            name, "name a dataset after relbench:, e.g. relbench:rel-f1 or relbench:rel-f1/driver-dnf"
        )
    if _is_relbench_directory(Path(rest).expanduser()):
        return rest, None
    head, _, tail = rest.rpartition("/")
    if head and _is_relbench_directory(Path(head).expanduser()):
        return head, tail
    dataset, _, task = rest.partition("/")
    if "/" in task:
        raise DatasetError(name, "a RelBench name is relbench:<dataset> or relbench:<dataset>/<task>")
    return dataset, task or None


def relbench_database(
    name_or_dataset: str | Any,
    task: str | Any | Sequence[str | Any] | None = None,
    directory: str | Path | None = None,
) -> Path:
    """Write a RelBench dataset (a `relbench:` name or a `relbench.base.Dataset`) and its tasks in
    Relay's layout under `directory` (default: the Relay cache) and return that directory.

    `task` is one task or several: names the dataset loads, or EntityTask objects. Without it a
    name's own task (relbench:rel-f1/driver-dnf) is used, else every binary and regression entity
    task the dataset lists; a Dataset object without tasks gives the tables alone."""
    relbench = _import_relbench()
    tasks_given = _as_list(task)
    if isinstance(name_or_dataset, str):
        dataset_name, named_task = parse_relbench_name(name_or_dataset)
        if named_task is not None and tasks_given:
            raise DatasetError(name_or_dataset, "name the task once: in the name or as task=, not both")
        tasks_given = [named_task] if named_task else tasks_given
        wanted = [t if isinstance(t, str) else _task_name(t) for t in tasks_given]
        target = _target_directory(directory, dataset_name, wanted)
        marker = {"dataset": dataset_name, "tasks": wanted, "relbench": version("relbench")}
        if directory is None and _marker(target) == marker:
            return target  # converted before, from the same dataset, tasks and relbench
        dataset = _load_dataset(relbench, dataset_name)
        if not tasks_given:
            tasks_given = list(_downloading(dataset_name, dataset.get_task_names))
    else:
        dataset, dataset_name = name_or_dataset, type(name_or_dataset).__name__
        wanted = [t if isinstance(t, str) else _task_name(t) for t in tasks_given]
        target = _target_directory(directory, dataset_name, wanted)
        marker = {"dataset": dataset_name, "tasks": wanted, "relbench": version("relbench")}
    tasks = _entity_tasks(relbench, dataset, dataset_name, tasks_given, explicit=bool(wanted))
    _write(dataset, dataset_name, tasks, target, marker)
    return target


# --- reading RelBench ---------------------------------------------------------------------------


def _import_relbench() -> Any:
    try:
        return import_module("relbench")
    except ImportError:
        raise DatasetError(
            "relbench:", "RelBench datasets need the relbench package: pip install relbench"
        ) from None


def _load_dataset(relbench: Any, name: str) -> Any:
    return _downloading(name, lambda: relbench.load_dataset(name))


def _downloading(name: str, call: Any) -> Any:
    """Run a RelBench call that may download: a dataset not on this machine that cannot be fetched
    (no network), or one the Hub does not have, becomes a DatasetError saying so."""
    from huggingface_hub import constants
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        return call()
    except RepositoryNotFoundError as error:
        raise DatasetError(f"{PREFIX}{name}", f"RelBench's Hub has no such dataset: {error}") from None
    except OSError as error:  # also the Hub's own errors and offline mode (OSError subclasses)
        raise _not_downloaded(name, constants.HF_HUB_CACHE, error) from None
    except (ValueError, RuntimeError) as error:  # RelBench's refusals: no such task, bad keys
        raise DatasetError(f"{PREFIX}{name}", f"RelBench refused it: {error}") from None


def _not_downloaded(name: str, cache: str, error: Exception) -> DatasetError:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return DatasetError(
        f"{PREFIX}{name}",
        f"the RelBench dataset {name} must be downloaded first: it is not in RelBench's cache (the "
        f"Hugging Face cache, {cache}; HF_HUB_CACHE sets it) and could not be fetched ({reason}). "
        f'On a machine with network access run: python -c "import relbench; '
        f"relbench.load_dataset('{name}').get_db()\" (then copy that cache here if this one is offline)",
    )


def _entity_tasks(
    relbench: Any, dataset: Any, dataset_name: str, tasks: Iterable[str | Any], *, explicit: bool
) -> dict[str, Any]:
    """The tasks by name: loaded where named, kept if binary or regression entity tasks (a task
    asked for by name that is not one is refused; of a dataset's own list it is skipped)."""
    entity_task = relbench.base.EntityTask
    chosen: dict[str, Any] = {}
    for item in tasks:
        if isinstance(item, str):
            loaded = _downloading(dataset_name, lambda item=item: dataset.load_task(item))
        else:
            loaded = item
        name = item if isinstance(item, str) else _task_name(item)
        kind = getattr(getattr(loaded, "task_type", None), "value", None)
        if isinstance(loaded, entity_task) and kind in PROBLEM_TYPES:
            chosen[name] = loaded
        elif explicit:
            raise DatasetError(
                f"{PREFIX}{dataset_name}/{name}",
                f"RT-J takes entity tasks with a binary or regression target; {name} is "
                f"{type(loaded).__name__} ({kind})",
            )
    return chosen


def _task_name(task: Any) -> str:
    """A task object's name: its `name`, else its class's name in kebab case (DriverDNFTask:
    driver-dnf-task)."""
    name = getattr(task, "name", None)
    if isinstance(name, str) and name:
        return name
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", type(task).__name__).lower()


def _as_list(task: str | Any | Sequence[str | Any] | None) -> list[str | Any]:
    if task is None:
        return []
    if isinstance(task, str) or not isinstance(task, Sequence):
        return [task]
    return list(task)


def _is_relbench_directory(path: Path) -> bool:
    return (path / "manifest.yaml").is_file()


# --- writing Relay's layout ---------------------------------------------------------------------


def _target_directory(directory: str | Path | None, dataset: str, tasks: list[str]) -> Path:
    if directory is not None:
        return Path(directory).expanduser()
    slug = _SLUG.sub("_", Path(dataset).name if _is_relbench_directory(Path(dataset)) else dataset)
    suffix = "__" + "+".join(_SLUG.sub("_", t) for t in tasks) if tasks else ""
    return default_cache_dir() / "relbench" / f"{slug}{suffix}"


def _marker(directory: Path) -> dict[str, Any] | None:
    try:
        found = json.loads((directory / MARKER_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return found if isinstance(found, dict) else None


def _write(
    dataset: Any, dataset_name: str, tasks: dict[str, Any], target: Path, marker: dict[str, Any]
) -> None:
    """Convert into a fresh sibling directory, then move it into place, so a directory holds a whole
    conversion or none."""
    if target.exists() and any(target.iterdir()) and _marker(target) is None:
        raise DatasetError(
            str(target), "is not empty and holds no RelBench conversion: give an empty directory"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        schema = _write_tables(dataset, dataset_name, tasks, staging)
        for name, task in tasks.items():
            schema["tasks"][name] = _write_task(dataset, name, task, staging / "tasks" / name)
        (staging / SCHEMA_FILE).write_text(json.dumps(schema, indent=2) + "\n")
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_tables(dataset: Any, dataset_name: str, tasks: dict[str, Any], root: Path) -> dict[str, Any]:
    """Write every table of RelBench's database for these tasks; the schema's tables."""
    hidden = {tuple(pair) for task in tasks.values() for pair in getattr(task, "remove_columns", [])}
    database = _downloading(dataset_name, dataset.get_db)  # rows up to the test timestamp
    (root / "tables").mkdir(parents=True)
    tables: dict[str, Any] = {}
    for name, table in database.table_dict.items():
        foreign_keys = {str(c): str(t) for c, t in table.fkey_col_to_pkey_table.items()}
        if len(foreign_keys) > MAX_FOREIGN_KEYS:
            raise DatasetError(
                f"{PREFIX}{dataset_name}",
                f"table {name} has {len(foreign_keys)} foreign keys; "
                f"RT-J reads at most {MAX_FOREIGN_KEYS} per table",
            )
        frame = table.df.drop(columns=[c for t, c in hidden if t == name and c in table.df.columns])
        pq.write_table(_arrow_table(frame), root / "tables" / f"{name}.parquet")
        spec: dict[str, Any] = {}
        if table.pkey_col:
            spec["primary_key"] = str(table.pkey_col)
        if foreign_keys:
            spec["foreign_keys"] = foreign_keys
        if table.time_col:
            spec["time_column"] = str(table.time_col)
        tables[name] = spec
    return {"tables": tables, "tasks": {}}


def _write_task(dataset: Any, name: str, task: Any, directory: Path) -> dict[str, Any]:
    """Write the task's splits (entity, time and target columns); its schema entry."""
    directory.mkdir(parents=True)
    columns = [str(task.entity_col), str(task.time_col), str(task.target_col)]
    problem_type = PROBLEM_TYPES[task.task_type.value]
    for split in SPLITS:
        frame = task.get_table(split, mask_input_cols=False).df
        if split != "train" and str(task.target_col) not in frame.columns:
            continue  # labels withheld (a hidden test split): no such split here
        table = _arrow_table(frame[columns])
        target = table.column(columns[2])
        wanted = pa.int64() if problem_type == "binary" else pa.float64()
        table = table.set_column(2, columns[2], target.cast(wanted))
        pq.write_table(table, directory / f"{split}.parquet")
    return {
        "entity_table": str(task.entity_table),
        "entity_column": columns[0],
        "time_column": columns[1],
        "target_column": columns[2],
        "problem_type": problem_type,
        "cutoffs": {
            "val": _iso(dataset.val_timestamp),
            "test": _iso(dataset.test_timestamp),
        },
    }


def _arrow_table(frame: Any) -> pa.Table:
    """A pandas frame as an Arrow table: timestamps in microseconds; lists and records as JSON text;
    a column Arrow cannot type (mixed objects) as text."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name in frame.columns:
        series = frame[name]
        try:
            array = pa.array(series, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            array = pa.array([None if _missing(v) else str(v) for v in series], pa.string())
        if pa.types.is_timestamp(array.type) and array.type.unit != "us":
            array = array.cast(pa.timestamp("us", tz=array.type.tz), safe=False)
        elif pa.types.is_nested(array.type):  # lists and records: one text cell, as JSON
            texts = [None if v is None else json.dumps(v, default=str) for v in array.to_pylist()]
            array = pa.array(texts, pa.string())
        columns[str(name)] = array
    return pa.table(columns)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _iso(moment: Any) -> str:
    return str(moment.isoformat())
