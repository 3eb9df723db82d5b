"""Serving a tuned RT-J model: the model and its database loaded once, entity rows answered with
the task's prediction.

A tuned RT-J predicts one task of one database (`relay` in its config.json names the task, the
database it trained on and how its contexts were made). A request names entity rows of the
task's entity table by primary key, and optionally the time to predict at:

    {"primary_key": "customer_3", "time": "2021-06-01T00:00:00Z", "table": "customer"}

`table` may be left out (it can only be the task's entity table); `time` defaults to the
database's latest time, so the prediction sees everything the database holds. A row's context
is sampled from the database as training and `relay local eval` sample a task row's (the entity
at that time: nothing later than the time is visible), and the answer is the probability of the
positive class (binary tasks) or the value in the label's units (regression). An entity and time
that are a row of one of the task's splits get exactly that row's context, so the prediction is
the one `relay local eval` makes for it; any other is sampled with a key of its own (the two
differ only where a visited row has more children than the model's max_children, which are
then sampled).

`decode` checks one row and samples its context (a ConfigError naming the field, a
`RowNotFound` for a key the table does not hold); `act` answers many in ONE batched forward
pass. The seeds `act` takes (the interface pi05's ServedPolicy shares) are unused: a row's
prediction is deterministic.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from relay.dataset_names import is_relational_source
from relay_engine.errors import ConfigError
from relay_engine.families.rtj.batch import RelationalBatch, collate
from relay_engine.families.rtj.database import SPLITS, seconds
from relay_engine.families.rtj.sampling import ContextSampler, LabelScale
from relay_engine.families.rtj.transformer import RelationalTransformer
from relay_engine.serving.policy import StageTiming

ROW_FIELDS = ("table", "primary_key", "time")
# The rng key of the context of an entity and time that is no task split's row: (SERVED_CONTEXT_KEY,
# entity row, time in microseconds); a split's row i is keyed (sampler seed, split's index, i).
SERVED_CONTEXT_KEY = 7


class RowNotFound(ConfigError):
    """A table or a row key the database does not hold (the server answers 404)."""


@dataclass(frozen=True)
class DecodedRow:
    """One entity row at one time, its context sampled, and how long it took to get there."""

    primary_key: Any
    time: float  # seconds since 1970, UTC
    context: RelationalBatch
    decode_s: float  # the row checked and looked up
    preprocess_s: float  # its context sampled


@dataclass(frozen=True)
class RowPrediction:
    """One row's answer: the probability of the positive class (binary) or the value in the
    label's units (regression), and the model's raw score (a logit, or a z-scored value)."""

    primary_key: Any
    time: float
    prediction: float
    score: float
    timing: StageTiming

    def as_dict(self) -> dict[str, Any]:
        return {
            "primary_key": self.primary_key,
            "time": format_time(self.time),
            "prediction": self.prediction,
            "score": self.score,
        }


class ServedRelationalModel:
    """A tuned RT-J and the database of its task; `act` is not thread-safe (one inference thread),
    `decode` is (the sampler only reads what it encoded once)."""

    kind = "rt-j"
    answers = "predictions"  # the policy server's /predictions (ServedPolicy's: actions)
    use_instead = "this deployment serves an RT-J model: POST /predictions"

    def __init__(
        self, model: RelationalTransformer, name: str, sampler: ContextSampler, label_scale: LabelScale
    ) -> None:
        self.model = model
        self.name = name
        self.sampler = sampler
        self.label_scale = label_scale
        self.spec = sampler.spec
        entity = sampler.database.tables[self.spec.entity_table]
        assert entity.primary_key is not None  # the schema's check: a task's entity table has one
        self.entity_table = entity
        self.key_type = entity.data.schema.field(entity.primary_key).type
        self.latest_time = _latest_time(sampler)
        self.split_rows = _split_rows(sampler)

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        *,
        device: str = "auto",
        database: str | os.PathLike[str] | None = None,
        task: str | None = None,
    ) -> ServedRelationalModel:
        """A tuned RT-J (a job's output, or a work directory whose output/ holds one) and the
        database it was trained on (`database` overrides the one its config.json records)."""
        from relay_engine.acting import model_directory
        from relay_engine.families.rtj.family import build_sampler, context_settings
        from relay_engine.recipe import pick_device

        name = str(model)
        directory = model_directory(name)
        loaded = RelationalTransformer(str(directory) if directory else name, device=pick_device(device))
        saved = loaded.config.get("relay", {})
        chosen_task = task or saved.get("task")
        if not chosen_task:
            raise ConfigError(
                f"{name} names no task: serve a tuned RT-J (a job's output), or name the task",
                param="task",
            )
        chosen_database = str(database) if database is not None else saved.get("dataset")
        if not chosen_database:
            raise ConfigError(
                f"{name} does not record the database it was trained on: name it "
                "(relay serve --database DIR)",
                param="database",
            )
        # The tasks_dir it was trained with goes with the database it recorded (a snapshot of a SQL
        # database keeps its tasks inside); a database named here brings its own tasks.
        tasks_dir = saved.get("tasks_dir") if database is None else None
        if not is_relational_source(chosen_database) and not Path(chosen_database).expanduser().is_dir():
            raise ConfigError(
                f"database: no directory {chosen_database} (the database {name} was trained on); "
                "name where it is (relay serve --database DIR)",
                param="database",
            )
        sampler = build_sampler(
            chosen_database,
            chosen_task,
            context_settings(loaded.config),
            loaded.model.config.d_text,
            seed=0,  # as `relay local eval` samples
            tasks_dir=tasks_dir,
        )
        # The model's outputs are z-scored with the scale it was trained with.
        scale = sampler.label_scale
        if "label_mean" in saved and "label_std" in saved and chosen_task == saved.get("task"):
            scale = LabelScale(float(saved["label_mean"]), float(saved["label_std"]))
        return cls(loaded, name, sampler, scale)

    def metadata(self) -> dict[str, Any]:
        """The task, its target, the database's tables (GET /metadata)."""
        spec, database = self.spec, self.sampler.database
        return {
            "model": self.name,
            "kind": self.kind,
            "answers": self.answers,
            "task": spec.name,
            "problem_type": spec.problem_type,
            "prediction": "the probability of the positive class"
            if spec.problem_type == "binary"
            else f"{spec.target_column} in its own units",
            "target": {"table": spec.name, "column": spec.target_column},
            "entity": {"table": spec.entity_table, "primary_key": self.entity_table.primary_key},
            "latest_time": format_time(self.latest_time),
            "database": str(database.root),
            "tables": {
                name: {
                    "rows": table.num_rows,
                    "primary_key": table.primary_key,
                    "foreign_keys": dict(table.foreign_keys),
                    "time_column": table.time_column,
                    "columns": table.value_columns(),
                }
                for name, table in database.tables.items()
            },
            "context_length": self.sampler.context_length,
            "device": str(self.model.device),
        }

    def decode(self, row: Any, field: str = "rows[0]") -> DecodedRow:
        """One row checked, looked up and its context sampled; a ConfigError naming the field."""
        started = time.perf_counter()
        if not isinstance(row, dict):
            raise ConfigError(
                f"{field}: must be an object with primary_key (and optionally time, table)", param=field
            )
        for key in row:
            if key not in ROW_FIELDS:
                raise ConfigError(
                    f"{field}.{key}: unknown field; a row has {', '.join(ROW_FIELDS)}",
                    param=f"{field}.{key}",
                    code="unknown_field",
                )
        table = row.get("table", self.spec.entity_table)
        if table != self.spec.entity_table:
            if isinstance(table, str) and table not in self.sampler.database.tables:
                raise RowNotFound(
                    f"{field}.table: no table {table!r} in the database "
                    f"(tables: {', '.join(self.sampler.database.tables)})",
                    param=f"{field}.table",
                    code="unknown_table",
                )
            raise ConfigError(
                f"{field}.table: task {self.spec.name} predicts rows of {self.spec.entity_table}, "
                f"not {table!r}",
                param=f"{field}.table",
            )
        if "primary_key" not in row:
            raise ConfigError(
                f"{field}.primary_key: missing", param=f"{field}.primary_key", code="missing_field"
            )
        key = row["primary_key"]
        entity_row = self._entity_row(key, f"{field}.primary_key")
        at = self._time(row.get("time"), f"{field}.time")
        looked_up = time.perf_counter()
        micros = round(at * 1e6)
        rng_key = self.split_rows.get((entity_row, micros), (SERVED_CONTEXT_KEY, entity_row, micros))
        context = self.sampler.context(entity_row, at, rng_key)
        return DecodedRow(key, at, context, looked_up - started, time.perf_counter() - looked_up)

    def act(self, rows: Sequence[DecodedRow], seeds: Sequence[int | None]) -> list[RowPrediction]:
        """The predictions of every row in one forward pass (`seeds` unused: contexts are fixed)."""
        if len(rows) != len(seeds):
            raise ValueError(f"{len(rows)} rows but {len(seeds)} seeds")
        started = time.perf_counter()
        batch = collate([r.context for r in rows])
        collated = time.perf_counter()
        scores = self.model.target_scores(batch).float().cpu().numpy().astype(np.float64)
        scored = time.perf_counter()
        if self.spec.problem_type == "binary":
            predictions = 1.0 / (1.0 + np.exp(-scores))
        else:
            predictions = scores * self.label_scale.std + self.label_scale.mean
        post = (time.perf_counter() - scored) / len(rows)
        shared_pre, model = collated - started, scored - collated
        return [
            RowPrediction(
                primary_key=row.primary_key,
                time=row.time,
                prediction=float(predictions[i]),
                score=float(scores[i]),
                timing=StageTiming(
                    decode_ms=row.decode_s * 1000,
                    preprocess_ms=(row.preprocess_s + shared_pre) * 1000,
                    model_ms=model * 1000,
                    postprocess_ms=post * 1000,
                ),
            )
            for i, row in enumerate(rows)
        ]

    def _entity_row(self, key: Any, field: str) -> int:
        rows = self.sampler.pk_rows[self.spec.entity_table]
        table, column = self.spec.entity_table, self.entity_table.primary_key
        wanted = str if _key_kind(self.key_type) == "string" else int
        if isinstance(key, bool) or not isinstance(key, wanted):
            raise ConfigError(
                f"{field}: must be a {_key_kind(self.key_type)} (as {table}.{column} is), got {key!r}",
                param=field,
            )
        if key not in rows:
            raise RowNotFound(
                f"{field}: {table} has no row with {column} {key!r}", param=field, code="row_not_found"
            )
        return rows[key]

    def _time(self, value: Any, field: str) -> float:
        if value is None:
            return self.latest_time
        if isinstance(value, bool) or not isinstance(value, str):
            raise ConfigError(
                f"{field}: must be an ISO 8601 date or time (2021-06-01T00:00:00Z), got {value!r}",
                param=field,
            )
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(
                f"{field}: {value!r} is not an ISO 8601 date or time (2021-06-01T00:00:00Z)", param=field
            ) from None
        if parsed.tzinfo is None:  # naive times are UTC, as the database's naive columns are read
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()


def format_time(at: float) -> str:
    """Seconds since 1970 as ISO 8601 in UTC (2021-06-01T00:00:00Z)."""
    text = datetime.fromtimestamp(at, UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


def _key_kind(kind: Any) -> str:
    import pyarrow as pa

    return "integer" if pa.types.is_integer(kind) else "string"


def _split_rows(sampler: ContextSampler) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(entity row, time in microseconds) -> the rng key of that task row's context, as
    `ContextSampler.examples` keys it (the first split holding the pair, in train, val, test order)."""
    spec = sampler.spec
    keys: dict[tuple[int, int], tuple[int, int, int]] = {}
    for split, rows in sampler.splits.items():
        entity_rows = [
            sampler.pk_rows[spec.entity_table].get(k, -1) for k in rows.column(spec.entity_column).to_pylist()
        ]
        times = seconds(rows.column(spec.time_column))
        for i, (entity_row, at) in enumerate(zip(entity_rows, times, strict=True)):
            if entity_row >= 0 and np.isfinite(at):
                keys.setdefault((entity_row, round(float(at) * 1e6)), (sampler.seed, SPLITS.index(split), i))
    return keys


def _latest_time(sampler: ContextSampler) -> float:
    """The latest time anywhere in the database (its tables' time columns and the task's
    timestamps): a row predicted then sees every row the database holds."""
    spec, latest = sampler.spec, -math.inf
    columns = [t.data.column(t.time_column) for t in sampler.database.tables.values() if t.time_column]
    columns += [split.column(spec.time_column) for split in sampler.splits.values()]
    for column in columns:
        values = seconds(column)
        if np.isfinite(values).any():
            latest = max(latest, float(np.nanmax(values)))
    return latest if math.isfinite(latest) else time.time()
