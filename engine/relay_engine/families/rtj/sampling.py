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
            split: database.task_split(task, split) for split in SPLITS if database.has_split(task, split)
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
        self._text_rows = np.concatenate(
            [self.text_vectors, np.zeros((1, self.embedder.dim), np.float32)]
        ).astype(np.float32)
        self._index = _RowIndex(self.tables)

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
        walk = self._walk(entity_row, seed_time, rng_key)
        return self._emit(walk, seed_time)

    def visited_rows(
        self, entity_row: int, seed_time: float, rng_key: tuple[int, ...]
    ) -> list[tuple[str, int]]:
        """The rows the context of a seed visits after the seed, in order, as (table, row): rows of
        the database's tables, and train rows of the task (named by the task) as in-context examples."""
        walk = self._walk(entity_row, seed_time, rng_key)
        index, visited = self._index, walk.order[1:]
        return [
            (self.tables[table].name, int(row))
            for table, row in zip(
                index.table_of[visited].tolist(), index.row_of[visited].tolist(), strict=True
            )
        ]

    def _walk(self, entity_row: int, seed_time: float, rng_key: tuple[int, ...]) -> _ContextWalk:
        rng = np.random.default_rng(list(rng_key))
        walk = _ContextWalk(self._index, seed_time, budget=self.context_length - 2)
        try:
            if entity_row >= 0:
                entity = self._index.global_row(self.table_index[self.spec.entity_table], entity_row)
                walk.row_parents[0] = [entity]
                walk.visit(entity)
            walk.spread(rng, self.max_children)
        finally:
            walk.release()
        return walk

    def _emit(self, walk: _ContextWalk, seed_time: float) -> RelationalBatch:
        """The batch of one context: the seed's two cells, then every present cell of the rows
        reached, in the walk's order, cut to the context length."""
        index, task = self._index, self.tables[-1]
        rows = np.asarray(walk.order[1:], np.int64)
        counts = index.cell_count[rows]
        starts = index.cell_start[rows]
        ends = np.cumsum(counts)
        cells = np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]) if len(ends) else 0)
        length = min(2 + len(cells), self.context_length)
        cells = cells[: length - 2]
        nodes = np.repeat(np.arange(1, len(rows) + 1), counts)[: length - 2]
        # Each node's parents as nodes of this context (those reached), at most MAX_PARENTS of them.
        node_of = walk.node_of
        parents = np.full((len(rows) + 1, MAX_PARENTS), -1, np.int64)
        for node, links in enumerate(walk.row_parents):
            reached = [node_of[p] for p in links if p in node_of][:MAX_PARENTS]
            parents[node, : len(reached)] = reached
        seed_time_value = (seed_time - self.time_mean) / self.time_std
        return self._as_batch(
            np.concatenate([[0, 0], nodes]),
            np.concatenate([task.column_ids[:2], index.cell_column[cells]]),
            np.concatenate([[task.index, task.index], index.table_of[rows][nodes - 1]]),
            np.concatenate([[SEM_DATETIME, task.sem[1]], index.cell_sem[cells]]).astype(np.int64),
            np.concatenate([[seed_time_value, 0.0], index.cell_value[cells]]).astype(np.float32),
            np.concatenate([[-1, -1], index.cell_text[cells]]).astype(np.int64),
            parents[np.concatenate([[0, 0], nodes])],
        )

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
        # One gather: a cell without text (-1) takes the zero row that ends the table.
        text_values = self._text_rows[text_array]
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


class _RowIndex:
    """Every row of every table (the task's train rows last) under one global id, as flat arrays:
    the cells of a row in column order, its time, its parents and its children. A context's walk
    and its cells are then a few array lookups per row rather than per cell.

    Global id = the table's first id + the row. `cell_start[g]`, `cell_count[g]`: the row's
    present cells in `cell_column`/`cell_sem`/`cell_value`/`cell_text`; `parents[g]`: its parents'
    ids in foreign-key order (-1 where null or dangling); `child_start[g]..child_start[g + 1]`: its
    children's ids in `children`, by foreign key and then by row, as `_EncodedTable.children`
    lists them."""

    def __init__(self, tables: list[_EncodedTable]) -> None:
        sizes = np.asarray([t.num_rows for t in tables], np.int64)
        self.first = np.concatenate([[0], np.cumsum(sizes)])
        self.task_table = len(tables) - 1
        self.table_of = np.repeat(np.arange(len(tables)), sizes)
        self.row_of = np.concatenate([np.arange(n) for n in sizes]) if len(sizes) else np.zeros(0, np.int64)
        self.is_task = self.table_of == self.task_table
        self.time = np.concatenate(
            [t.time if t.time is not None else np.full(t.num_rows, np.nan) for t in tables]
        )
        self.cell_count = np.concatenate([t.present.sum(axis=1) for t in tables]).astype(np.int64)
        self.cell_start = np.concatenate([[0], np.cumsum(self.cell_count)[:-1]]).astype(np.int64)
        where = [np.nonzero(t.present) for t in tables]  # row-major: a row's cells in column order
        self.cell_column = np.concatenate([t.column_ids[j] for t, (_, j) in zip(tables, where, strict=True)])
        self.cell_sem = np.concatenate([t.sem[j] for t, (_, j) in zip(tables, where, strict=True)])
        self.cell_value = np.concatenate([t.scalars[r, j] for t, (r, j) in zip(tables, where, strict=True)])
        self.cell_text = np.concatenate([t.text_ids[r, j] for t, (r, j) in zip(tables, where, strict=True)])
        self.parents = np.full((int(self.first[-1]), MAX_PARENTS), -1, np.int64)
        for t, table in enumerate(tables):
            for k, (parent, rows) in enumerate(table.parents):
                linked = rows >= 0
                ids = np.where(linked, self.first[parent] + rows, -1)
                self.parents[self.first[t] : self.first[t + 1], k] = ids
        self._index_children(tables)
        self.seen = np.zeros(int(self.first[-1]), bool)  # the rows a walk reached (cleared after it)

    def _index_children(self, tables: list[_EncodedTable]) -> None:
        owners, keys, ids = [], [], []
        for t, table in enumerate(tables):
            for k, (child, offsets, rows) in enumerate(table.children):
                counts = np.diff(offsets)
                owners.append(self.first[t] + np.repeat(np.arange(table.num_rows), counts))
                keys.append(np.full(len(rows), k))
                ids.append(self.first[child] + rows)
        if owners:
            owner, key, child_ids = np.concatenate(owners), np.concatenate(keys), np.concatenate(ids)
            order = np.lexsort((key, owner))  # stable: within a key, rows stay in their order
            self.children = child_ids[order]
            counts = np.bincount(owner, minlength=int(self.first[-1]))
        else:
            self.children = np.zeros(0, np.int64)
            counts = np.zeros(int(self.first[-1]), np.int64)
        self.child_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def global_row(self, table: int, row: int) -> int:
        return int(self.first[table] + row)

    def visible(self, rows: np.ndarray, seed_time: float) -> np.ndarray:
        """Which rows the seed may see: not from its future (train task rows: strictly earlier)."""
        time = self.time[rows]
        with np.errstate(invalid="ignore"):
            return np.where(self.is_task[rows], time < seed_time, ~(time > seed_time))


SEED = -1  # the seed row's id in a walk: it is no row of a table


class _ContextWalk:
    """One seed's walk over the rows it may see, within a budget of cells: up each row's parents
    depth-first, then down to a sample of children breadth-first. It records the rows reached in
    order (the seed first), each row's node, and its parent links. Rows are global ids (_RowIndex)."""

    def __init__(self, index: _RowIndex, seed_time: float, budget: int) -> None:
        self.index = index
        self.seed_time = seed_time
        self.budget = budget  # cells left; the seed's timestamp and label cells are not in it
        self.order: list[int] = [SEED]
        self.node_of: dict[int, int] = {SEED: 0}
        self.row_parents: list[list[int]] = [[]]

    def release(self) -> None:
        """Clear the index's marks of the rows this walk reached, for the next walk."""
        self.index.seen[self.order[1:]] = False

    def visit(self, row: int) -> None:
        """Add the row and, depth-first, its parents, until the budget is spent."""
        # (Locals, not attributes, in this loop: it runs once per row of every context.)
        index, node_of, order, row_parents = self.index, self.node_of, self.order, self.row_parents
        seen, times, is_task, parents, cell_count = (
            index.seen,
            index.time,
            index.is_task,
            index.parents,
            index.cell_count,
        )
        seed_time, budget = self.seed_time, self.budget
        stack = [row]
        while stack and budget > 0:
            g = stack.pop()
            if g in node_of:
                continue
            time = times[g]
            if (time < seed_time) if is_task[g] else not time > seed_time:
                node_of[g] = len(order)
                order.append(g)
                seen[g] = True
                budget -= cell_count[g]
                links = [p for p in parents[g].tolist() if p >= 0]
                row_parents.append(links)
                stack.extend(reversed(links))
        self.budget = int(budget)

    def spread(self, rng: np.random.Generator, max_children: int) -> None:
        """From the rows reached so far, visit their children level by level until the budget is spent."""
        frontier = list(self.order)
        while frontier and self.budget > 0:
            frontier = self._visit_children(frontier, rng, max_children)

    def _visit_children(self, frontier: list[int], rng: np.random.Generator, max_children: int) -> list[int]:
        """Visit a sample of each frontier row's children; the rows this reached (the next frontier)."""
        reached: list[int] = []
        for g in frontier:
            if g == SEED:
                continue
            for child in self._sampled_children(g, rng, max_children):
                before = len(self.order)
                self.visit(child)
                reached.extend(self.order[before:])
                if self.budget <= 0:
                    return reached
        return reached

    def _sampled_children(self, g: int, rng: np.random.Generator, max_children: int) -> list[int]:
        """The row's children not yet reached that the seed may see, at most `max_children` of them
        (a random sample, in their order)."""
        index = self.index
        start, end = index.child_start[g], index.child_start[g + 1]
        if start == end:
            return []
        candidates = index.children[start:end]
        candidates = candidates[~index.seen[candidates] & index.visible(candidates, self.seed_time)]
        if len(candidates) > max_children:
            picked = rng.choice(len(candidates), max_children, replace=False)
            candidates = candidates[np.sort(picked)]
        return list(candidates.tolist())


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
