"""What `relay datasets check` and `relay datasets stats` say about a relational database."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import SPLITS, Database, column_type, seconds


def check_database(database: Database) -> tuple[dict[str, Any], list[str]]:
    """The tables (rows, column types, keys and how many foreign keys point nowhere) and the tasks
    (rows per split, labels), with every problem that stops training."""
    problems: list[str] = []
    tables: dict[str, Any] = {}
    for name, table in database.tables.items():
        links = {}
        for column, parent in table.foreign_keys.items():
            parent_keys = database.tables[parent].data.column(str(database.tables[parent].primary_key))
            values = table.data.column(column)
            links[column] = {
                "table": parent,
                "dangling": table.num_rows - _count_found(values, parent_keys) - values.null_count,
            }
        tables[name] = {
            "rows": table.num_rows,
            "primary_key": table.primary_key,
            "time_column": table.time_column,
            "foreign_keys": links,
            "columns": {column: column_type(table, column) for column in table.value_columns()},
        }
    tasks: dict[str, Any] = {}
    for name, spec in database.tasks.items():
        splits: dict[str, Any] = {}
        for split in SPLITS:
            try:
                rows = database.task_split(name, split)
            except DatasetError as error:
                if split == "train":
                    problems.append(error.problem)
                continue
            labels = rows.column(spec.target_column)
            if labels.null_count:
                problems.append(f"task {name} {split}: {labels.null_count} rows have no {spec.target_column}")
                continue
            label_values = np.asarray(pc.cast(labels, pa.float64()).to_numpy(zero_copy_only=False))
            if spec.problem_type == "binary" and not np.isin(label_values, (0.0, 1.0)).all():
                problems.append(f"task {name} {split}: {spec.target_column} must be 0 or 1 for a binary task")
            entity_keys = database.tables[spec.entity_table].data.column(
                str(database.tables[spec.entity_table].primary_key)
            )
            unknown = rows.num_rows - _count_found(rows.column(spec.entity_column), entity_keys)
            splits[split] = {
                "rows": rows.num_rows,
                "unknown_entities": unknown,
                ("positive_rate" if spec.problem_type == "binary" else "label_mean"): (
                    float(label_values.mean()) if label_values.size else None
                ),
            }
            if spec.problem_type == "regression":
                splits[split]["label_std"] = float(label_values.std()) if label_values.size else None
        tasks[name] = {"problem_type": spec.problem_type, "entity_table": spec.entity_table, "splits": splits}
    return {"tables": tables, "tasks": tasks}, problems


def _count_found(values: pa.ChunkedArray, keys: pa.ChunkedArray) -> int:
    """How many of `values` are among `keys` (nulls are not)."""
    found = pc.cast(pc.is_in(values, value_set=pc.unique(keys)), pa.int64())
    return int(pc.sum(found).as_py() or 0)


def column_stats(database: Database) -> dict[str, dict[str, dict[str, Any]]]:
    """Per table and column: its type, how many values are missing, and per type: mean, std, min
    and max (numbers), the first and last time (datetimes), the share that is true (booleans), the
    number of distinct values (text), over every row. Training z-scores with the same statistics
    taken over the rows before its task's cutoff only (cutoff.py)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, table in database.tables.items():
        columns: dict[str, dict[str, Any]] = {}
        for column in table.value_columns():
            values = table.data.column(column)
            kind = column_type(table, column)
            row: dict[str, Any] = {"type": kind, "missing": values.null_count}
            if kind == "number":
                numbers = np.asarray(pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False))
                numbers = numbers[np.isfinite(numbers)]
                if numbers.size:
                    row.update(
                        mean=float(numbers.mean()),
                        std=float(numbers.std()),
                        min=float(numbers.min()),
                        max=float(numbers.max()),
                    )
            elif kind == "datetime":
                times = seconds(values)
                times = times[np.isfinite(times)]
                if times.size:
                    row.update(
                        first=str(np.datetime64(int(times.min()), "s")),
                        last=str(np.datetime64(int(times.max()), "s")),
                    )
            elif kind == "boolean":
                flags = np.asarray(pc.cast(pc.drop_null(values), pa.float64()).to_numpy(zero_copy_only=False))
                row["true_share"] = float(flags.mean()) if flags.size else None
            else:
                row["distinct"] = int(pc.count_distinct(values).as_py())
            columns[column] = row
        out[name] = columns
    return out
