"""From a database and a task to labelled contexts, as RT samples them.

For each row of a task split (an entity, a timestamp, a label) the context is built from the seed:
  1. the seed's own row: its timestamp and its label, the label hidden as the target cell;
  2. every parent through foreign keys, depth first (the entity row, then what it points to);
  3. children breadth first (rows that point to a visited row), at most `max_children` per row,
     sampled without replacement;
  4. labelled task rows of the same task as in-context examples: from the train split only, and
     only those strictly earlier than the seed;
  5. cells of the visited rows in visiting order until `context_length`.
No row later than the seed's timestamp is visited, so nothing from the future reaches a context,
and the seed's own label appears only as the hidden target.

Values are encoded per type: numbers z-scored per column, datetimes as seconds z-scored together
(every datetime cell and the train timestamps), booleans as 0/1, text through the text embedder;
each cell also carries the embedding of "<column> of <table>". Nulls make no cell. Every mean and
standard deviation is taken over the rows known before the task's split cutoff only (cutoff.py),
so no later row moves the encoding of an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from relay_engine.errors import DatasetError
from relay_engine.families.rtj.batch import (
    MAX_PARENTS,
    SEM_BOOLEAN,
    SEM_DATETIME,
    SEM_NUMBER,
    SEM_TEXT,
    RelationalBatch,
)
from relay_engine.families.rtj.cutoff import StatisticsCutoff, statistics_cutoff
from relay_engine.families.rtj.database import SPLITS, Database, Table, TaskSpec, column_type, seconds
from relay_engine.families.rtj.encoding import TextEmbedder
from relay_engine.families.rtj.trainer import RelationalExample

SEM_CODES = {"number": SEM_NUMBER, "text": SEM_TEXT, "datetime": SEM_DATETIME, "boolean": SEM_BOOLEAN}
DEFAULT_CONTEXT_LENGTH = 1024
DEFAULT_MAX_CHILDREN = 256


@dataclass
class _EncodedTable:
    """A table as arrays: per row and value column, whether there is a cell and its encoded value."""

    name: str
    index: int
    num_rows: int
    column_ids: np.ndarray  # [C] global column ids
    sem: np.ndarray  # [C] semantic codes
    present: np.ndarray  # [R, C] bool
    scalars: np.ndarray  # [R, C] float32 (number, datetime, boolean channels)
    text_ids: np.ndarray  # [R, C] int32 into the text vectors, -1 if not text
    time: np.ndarray | None  # [R] seconds, NaN where unknown
    # (parent table index, parent row per row, -1 where null or dangling), one per foreign key
    parents: list[tuple[int, np.ndarray]] = field(default_factory=list)
    # (child table index, CSR offsets [R+1], child rows), one per foreign key pointing here
    children: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)


@dataclass(frozen=True)
class LabelScale:
    """Regression labels are trained z-scored with the train split's mean and std."""

    mean: float
    std: float


class ContextSampler:
    """Encodes a database once for one task, then builds the contexts of any split.

    `examples(split)` returns RelationalExamples whose labels are 0/1 (binary) or z-scored
    (regression; `label_scale` turns predictions back). Contexts are deterministic in
    (`seed`, split, row): the same call gives the same contexts. Encoding statistics come from
    the rows before `statistics_cutoff` only (the regression label scale from the train split).
    """

    def __init__(
        self,
        database: Database,
        task: str,
        embedder: TextEmbedder,
        *,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        max_children: int = DEFAULT_MAX_CHILDREN,
        seed: int = 0,
    ) -> None:
        if context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {context_length}")
        self.database = database
        self.spec: TaskSpec = database.task(task)
        self.embedder = embedder
        self.context_length = context_length
        self.max_children = max_children
        self.seed = seed
        self.splits = {
            split: database.task_split(task, split) for split in SPLITS if _has_split(database, task, split)
        }
        if "train" not in self.splits:
            raise DatasetError(str(database.root), f"task {task} needs a train split")
        self.statistics_cutoff: StatisticsCutoff = statistics_cutoff(self.splits, self.spec)
        train_labels = _labels(self.splits["train"], self.spec)
        self.label_scale = LabelScale(float(np.mean(train_labels)), float(np.std(train_labels)) or 1.0)
        self._build()

    # --- encoding, once ---------------------------------------------------------------------

    def _build(self) -> None:
        db, spec = self.database, self.spec
        names = [*db.tables, spec.name]
        self.table_index = {name: i for i, name in enumerate(names)}
        cutoff = self.statistics_cutoff
        known_times = [
            seconds(t.data.column(c))[cutoff.counts(_row_times(t), t.num_rows)]
            for t in db.tables.values()
            for c in _datetime_columns(t)
        ]
        train_times = seconds(self.splits["train"].column(spec.time_column))
        known_times.append(train_times[cutoff.counts(train_times, len(train_times))])
        stacked = np.concatenate([t[np.isfinite(t)] for t in known_times])
        self.time_mean = float(stacked.mean()) if stacked.size else 0.0
        self.time_std = float(stacked.std()) if stacked.size and stacked.std() > 0 else 1.0

        self.column_names: list[str] = []
        self.texts: dict[str, int] = {}
        self.tables: list[_EncodedTable] = [self._encode_table(db.tables[name]) for name in db.tables]
        self.tables.append(self._encode_task_rows(self.splits["train"]))
        self.pk_rows = {
            name: _key_index(table.data.column(table.primary_key))
            for name, table in db.tables.items()
            if table.primary_key
        }
        for name, table in db.tables.items():
            encoded = self.tables[self.table_index[name]]
            for column, parent in table.foreign_keys.items():
                rows = _lookup(self.pk_rows[parent], table.data.column(column))
                encoded.parents.append((self.table_index[parent], rows))
        task_rows = self.tables[-1]
        entity_rows = _lookup(
            self.pk_rows[spec.entity_table], self.splits["train"].column(spec.entity_column)
        )
        task_rows.parents.append((self.table_index[spec.entity_table], entity_rows))
        for child in self.tables:
            for parent_index, rows in child.parents:
                self.tables[parent_index].children.append(
                    (child.index, *_csr(rows, self.tables[parent_index].num_rows))
                )
        text_list = list(self.texts)
        self.text_vectors = (
            self.embedder.embed(text_list) if text_list else np.zeros((0, self.embedder.dim), np.float32)
        )
        self.column_vectors = self.embedder.embed(self.column_names)

    def _text_id(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts))

    def _column_id(self, table: str, column: str) -> int:
        self.column_names.append(f"{column} of {table}")
        return len(self.column_names) - 1

    def _encode_columns(
        self, name: str, data: pa.Table, kinds: dict[str, str], counted: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """Each column's cells; a number column is z-scored with the mean and std of its `counted`
        rows (those known before the statistics cutoff)."""
        rows, cols = data.num_rows, len(kinds)
        present = np.zeros((rows, cols), dtype=bool)
        scalars = np.zeros((rows, cols), dtype=np.float32)
        text_ids = np.full((rows, cols), -1, dtype=np.int32)
        column_ids, sem = np.zeros(cols, np.int64), np.zeros(cols, np.int64)
        for j, (column, kind) in enumerate(kinds.items()):
            values = data.column(column)
            column_ids[j], sem[j] = self._column_id(name, column), SEM_CODES[kind]
            valid = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
            if kind == "text":
                strings = [None if v is None else str(v) for v in values.to_pylist()]
                ids = [self._text_id(s) if s is not None else -1 for s in strings]
                text_ids[:, j] = ids
            elif kind == "datetime":
                scalars[:, j] = np.nan_to_num((seconds(values) - self.time_mean) / self.time_std)
            elif kind == "boolean":
                scalars[:, j] = np.asarray(
                    # A missing boolean reads as 0 (nulls come out of to_numpy as NaN).
                    np.nan_to_num(values.cast(pa.float64()).to_numpy(), nan=0.0),
                    np.float32,
                )
            else:
                numbers = np.asarray(pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False), np.float64)
                valid &= np.isfinite(numbers)
                known = numbers[valid & counted]
                mean = float(known.mean()) if known.size else 0.0
                std = float(known.std()) if known.size else 1.0
                scalars[:, j] = np.where(valid, (numbers - mean) / (std or 1.0), 0.0)
            present[:, j] = valid
        return column_ids, sem, present, scalars, text_ids

    def _encode_table(self, table: Table) -> _EncodedTable:
        columns = {column: column_type(table, column) for column in table.value_columns()}
        time = _row_times(table)
        counted = self.statistics_cutoff.counts(time, table.num_rows)
        column_ids, sem, present, scalars, text_ids = self._encode_columns(
            table.name, table.data, columns, counted
        )
        return _EncodedTable(
            table.name,
            self.table_index[table.name],
            table.num_rows,
            column_ids,
            sem,
            present,
            scalars,
            text_ids,
            time,
        )

    def _task_label_kind(self) -> str:
        return "boolean" if self.spec.problem_type == "binary" else "number"

    def _encode_task_rows(self, rows: pa.Table) -> _EncodedTable:
        """Task rows as a table: the timestamp and the label, visible (train rows, as in-context examples)."""
        spec = self.spec
        kinds = {spec.time_column: "datetime", spec.target_column: self._task_label_kind()}
        data = rows.select([spec.time_column, spec.target_column])
        times = seconds(rows.column(spec.time_column))
        counted = self.statistics_cutoff.counts(times, rows.num_rows)
        column_ids, sem, present, scalars, text_ids = self._encode_columns(spec.name, data, kinds, counted)
        if spec.problem_type == "regression":  # the train stats, as for the targets
            labels = _labels(rows, spec)
            scalars[:, 1] = (labels - self.label_scale.mean) / self.label_scale.std
        return _EncodedTable(
            spec.name,
            self.table_index[spec.name],
            rows.num_rows,
            column_ids,
            sem,
            present,
            scalars,
            text_ids,
            times,
        )

    # --- sampling ---------------------------------------------------------------------------

    def examples(self, split: str, limit: int | None = None) -> list[RelationalExample]:
        if split not in self.splits:
            raise DatasetError(str(self.database.root), f"task {self.spec.name} has no {split} split")
        rows = self.splits[split]
        count = rows.num_rows if limit is None else min(limit, rows.num_rows)
        labels = _labels(rows, self.spec)
        if self.spec.problem_type == "regression":
            labels = (labels - self.label_scale.mean) / self.label_scale.std
        entities = _lookup(self.pk_rows[self.spec.entity_table], rows.column(self.spec.entity_column))
        times = seconds(rows.column(self.spec.time_column))
        split_code = SPLITS.index(split)
        return [
            RelationalExample(
                self.context(int(entities[i]), float(times[i]), (self.seed, split_code, i)), float(labels[i])
            )
            for i in range(count)
        ]

    def context(self, entity_row: int, seed_time: float, rng_key: tuple[int, ...]) -> RelationalBatch:
        """The context of one seed: an entity row (-1 if unknown) at a time (seconds)."""
        rng = np.random.default_rng(list(rng_key))
        walk = _ContextWalk(self.tables, seed_time, budget=self.context_length - 2)
        if entity_row >= 0:
            entity = (self.table_index[self.spec.entity_table], entity_row)
            walk.row_parents[0] = [entity]
            walk.visit(*entity)
        walk.spread(rng, self.max_children)
        return self._emit(walk.order, walk.node_of, walk.row_parents, seed_time)

    def _emit(
        self,
        order: list[tuple[int, int]],
        node_of: dict[tuple[int, int], int],
        row_parents: list[list[tuple[int, int]]],
        seed_time: float,
    ) -> RelationalBatch:
        """The batch of one context: every present cell of the rows reached, in the walk's order,
        cut to the context length."""
        nodes, cols, tables, sems, scalars, text_ids, parents = [], [], [], [], [], [], []
        for node, (t, r) in enumerate(order):
            parent_nodes = [node_of[p] for p in row_parents[node] if p in node_of][:MAX_PARENTS]
            parent_row = parent_nodes + [-1] * (MAX_PARENTS - len(parent_nodes))
            for col, sem, value, text in self._row_cells(t, r, seed_time):
                nodes.append(node)
                cols.append(col)
                tables.append(t)
                sems.append(sem)
                scalars.append(value)
                text_ids.append(text)
                parents.append(parent_row)
        length = min(len(nodes), self.context_length)
        return self._as_batch(
            np.asarray(nodes[:length]),
            np.asarray(cols[:length]),
            np.asarray(tables[:length]),
            np.asarray(sems[:length], np.int64),
            np.asarray(scalars[:length], np.float32),
            np.asarray(text_ids[:length], np.int64),
            np.asarray(parents[:length], np.int64),
        )

    def _row_cells(self, t: int, r: int, seed_time: float) -> list[tuple[int, int, float, int]]:
        """One row's cells as (column id, semantic code, scalar value, text id); row -1 is the seed."""
        if r < 0:  # the seed: its timestamp, and its label as the hidden target
            task = self.tables[-1]
            seed_time_value = (seed_time - self.time_mean) / self.time_std
            return [
                (int(task.column_ids[0]), SEM_DATETIME, seed_time_value, -1),
                (int(task.column_ids[1]), int(task.sem[1]), 0.0, -1),
            ]
        table = self.tables[t]
        where = np.flatnonzero(table.present[r])
        return [
            (
                int(table.column_ids[j]),
                int(table.sem[j]),
                float(table.scalars[r, j]),
                int(table.text_ids[r, j]),
            )
            for j in where
        ]

    def _as_batch(
        self,
        nodes: np.ndarray,
        cols: np.ndarray,
        tables: np.ndarray,
        sem_array: np.ndarray,
        value_array: np.ndarray,
        text_array: np.ndarray,
        parents: np.ndarray,
    ) -> RelationalBatch:
        """A batch of one context from its cells' arrays: the text and column-name embeddings looked
        up, each scalar in its semantic type's channel, the seed's label cell (the second) the target."""
        length = len(nodes)
        d_text = self.embedder.dim
        text_values = np.zeros((length, d_text), np.float32)
        has_text = text_array >= 0
        text_values[has_text] = self.text_vectors[text_array[has_text]]
        targets = np.zeros(length, bool)
        targets[1] = True
        channel = {
            code: np.where(sem_array == code, value_array, 0.0)[None, :, None] for code in SEM_CODES.values()
        }
        return RelationalBatch(
            node_idxs=torch.as_tensor(nodes[None]),
            f2p_nbr_idxs=torch.as_tensor(parents[None]),
            col_name_idxs=torch.as_tensor(cols[None]),
            table_name_idxs=torch.as_tensor(tables[None]),
            is_padding=torch.zeros((1, length), dtype=torch.bool),
            sem_types=torch.as_tensor(sem_array[None]),
            is_targets=torch.as_tensor(targets[None]),
            number_values=torch.as_tensor(channel[SEM_NUMBER]),
            datetime_values=torch.as_tensor(channel[SEM_DATETIME]),
            boolean_values=torch.as_tensor(channel[SEM_BOOLEAN]),
            text_values=torch.as_tensor(text_values[None]),
            col_name_values=torch.as_tensor(self.column_vectors[cols][None]),
        )


class _ContextWalk:
    """One seed's walk over the rows it may see, within a budget of cells: up each row's parents
    depth-first, then down to a sample of children breadth-first. It records the rows reached in
    order (the seed first, as row -1 of the task table), each row's node, and its parent links."""

    def __init__(self, tables: list[_EncodedTable], seed_time: float, budget: int) -> None:
        self.tables = tables
        self.task_index = len(tables) - 1
        self.seed_time = seed_time
        self.budget = budget  # cells left; the seed's timestamp and label cells are not in it
        self.order: list[tuple[int, int]] = [(self.task_index, -1)]  # the seed row itself
        self.node_of: dict[tuple[int, int], int] = {(self.task_index, -1): 0}
        self.row_parents: list[list[tuple[int, int]]] = [[]]

    def visible(self, table: _EncodedTable, row: int) -> bool:
        """Whether the seed may see the row: not from its future (no leak of the label)."""
        if table.index == self.task_index:  # train rows strictly before the seed
            return bool(table.time is not None and table.time[row] < self.seed_time)
        return table.time is None or not table.time[row] > self.seed_time

    def visit(self, table_index: int, row: int) -> None:
        """Add the row and, depth-first, its parents, until the budget is spent."""
        stack = [(table_index, row)]
        while stack and self.budget > 0:
            t, r = stack.pop()
            if (t, r) in self.node_of or not self.visible(self.tables[t], r):
                continue
            self.node_of[(t, r)] = len(self.order)
            self.order.append((t, r))
            self.budget -= int(self.tables[t].present[r].sum())
            links = [(p, int(rows[r])) for p, rows in self.tables[t].parents if rows[r] >= 0]
            self.row_parents.append(links)
            stack.extend(reversed(links))

    def spread(self, rng: np.random.Generator, max_children: int) -> None:
        """From the rows reached so far, visit their children level by level until the budget is spent."""
        frontier = list(self.order)
        while frontier and self.budget > 0:
            frontier = self._visit_children(frontier, rng, max_children)

    def _visit_children(
        self, frontier: list[tuple[int, int]], rng: np.random.Generator, max_children: int
    ) -> list[tuple[int, int]]:
        """Visit a sample of each frontier row's children; the rows this reached (the next frontier)."""
        reached: list[tuple[int, int]] = []
        for t, r in frontier:
            if r < 0:
                continue
            for child, c in self._sampled_children(t, r, rng, max_children):
                before = len(self.order)
                self.visit(child, c)
                reached.extend(self.order[before:])
                if self.budget <= 0:
                    return reached
        return reached

    def _sampled_children(
        self, t: int, r: int, rng: np.random.Generator, max_children: int
    ) -> list[tuple[int, int]]:
        """The row's children not yet reached that the seed may see, at most `max_children` of them
        (a random sample, in their order)."""
        candidates = [
            (child, int(c))
            for child, offsets, rows in self.tables[t].children
            for c in rows[offsets[r] : offsets[r + 1]]
            if (child, int(c)) not in self.node_of and self.visible(self.tables[child], int(c))
        ]
        if len(candidates) > max_children:
            picked = rng.choice(len(candidates), max_children, replace=False)
            candidates = [candidates[i] for i in sorted(picked)]
        return candidates


def _has_split(database: Database, task: str, split: str) -> bool:
    directory = database.root / "tasks" / task
    return any((directory / (split + suffix)).is_file() for suffix in (".parquet", ".csv"))


def _labels(rows: pa.Table, spec: TaskSpec) -> np.ndarray:
    values = rows.column(spec.target_column)
    if values.null_count:
        raise DatasetError(spec.name, f"the task's {spec.target_column} column has empty labels")
    return np.asarray(pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False), np.float64)


def _row_times(table: Table) -> np.ndarray | None:
    """Each row's time in seconds, or None for a table without a time column."""
    return seconds(table.data.column(table.time_column)) if table.time_column else None


def _datetime_columns(table: Table) -> list[str]:
    return [c for c in table.data.column_names if column_type(table, c) == "datetime"]


def _key_index(keys: pa.ChunkedArray) -> dict[object, int]:
    return {key: row for row, key in enumerate(keys.to_pylist())}


def _lookup(index: dict[object, int], values: pa.ChunkedArray) -> np.ndarray:
    return np.asarray([index.get(v, -1) if v is not None else -1 for v in values.to_pylist()], np.int64)


def _csr(parent_of_child: np.ndarray, num_parents: int) -> tuple[np.ndarray, np.ndarray]:
    """For each parent row, its child rows: offsets [P+1] and the child rows sorted by parent."""
    linked = np.flatnonzero(parent_of_child >= 0)
    by_parent = linked[np.argsort(parent_of_child[linked], kind="stable")]
    counts = np.bincount(parent_of_child[linked], minlength=num_parents)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return offsets, by_parent
