"""From a database and a task to labelled contexts, as RT samples them.

For each row of a task split (an entity, a timestamp, a label) the context is built from the seed:
  1. the seed's own row: its timestamp and its label, the label hidden as the target cell;
  2. every parent through foreign keys, depth first (the entity row, then what it points to);
  3. children breadth first (rows that point to a visited row), at most `max_children` per row,
     sampled without replacement (those with the smallest random keys, a hash of the context's
     key and the child), each followed depth first by its parents not visited yet;
  4. labelled task rows of the same task as in-context examples: from the train split only, and
     only those strictly earlier than the seed;
  5. cells of the visited rows in visiting order until `context_length`.
No row later than the seed's timestamp is visited, so nothing from the future reaches a context,
and the seed's own label appears only as the hidden target. Many seeds are walked at once, level by
level, with array operations (`_ContextWalk`); a context does not depend on what is walked with it.

Values are encoded per type: numbers z-scored per column, datetimes as seconds z-scored together
(every datetime cell and the train timestamps), booleans as 0/1, text through the text embedder;
each cell also carries the embedding of "<column> of <table>". Nulls make no cell. Every mean and
standard deviation is taken over the rows known before the task's split cutoff only (cutoff.py),
so no later row moves the encoding of an earlier one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from relay_engine.errors import DatasetError
from relay_engine.families.rtj import pair_table
from relay_engine.families.rtj.batch import (
    MAX_PARENTS,
    SEM_BOOLEAN,
    SEM_DATETIME,
    SEM_NUMBER,
    SEM_TEXT,
    LookedUpBatch,
    RelationalBatch,
)
from relay_engine.families.rtj.cutoff import StatisticsCutoff, statistics_cutoff
from relay_engine.families.rtj.database import SPLITS, Database, Table, TaskSpec, column_type, seconds
from relay_engine.families.rtj.encoding import TextEmbedder
from relay_engine.families.rtj.mapped import memory_mapped
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
    With `cache_dir`, the per-row arrays are written under it once and memory-mapped (mapped.py).
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
        cache_dir: Path | None = None,
    ) -> None:
        if context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {context_length}")
        self.database = database
        self.spec: TaskSpec = database.task(task)
        self.embedder = embedder
        self.context_length = context_length
        self.max_children = max_children
        self.seed = seed
        self.cache_dir = cache_dir
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
        # The embedding tables a context's cells index, each ending with the zero row of padding.
        zero_row = np.zeros((1, self.embedder.dim), np.float32)
        self.text_table = np.concatenate([self.text_vectors, zero_row]).astype(np.float32)
        self._column_table = torch.from_numpy(
            np.concatenate([self.column_vectors, zero_row]).astype(np.float32)
        )
        self._index = _RowIndex(self.tables)
        if self.cache_dir is not None:
            self._map_to_files(self.cache_dir / "rtj-contexts")
        self.text_vectors = self.text_table[:-1]
        self._text_table = _tensor(self.text_table)

    def _map_to_files(self, root: Path) -> None:
        """Replace every per-row array (of the row index, of the encoded tables) and the text
        embeddings by memory maps of files under `root` (see mapped.py)."""
        arrays: dict[str, np.ndarray] = {"text_table": self.text_table}
        arrays.update({f"index.{name}": value for name, value in _arrays_of(self._index).items()})
        for t, table in enumerate(self.tables):
            arrays.update({f"table{t}.{name}": value for name, value in _arrays_of(table).items()})
            for k, (_, rows) in enumerate(table.parents):
                arrays[f"table{t}.parent{k}"] = rows
            for k, (_, offsets, rows) in enumerate(table.children):
                arrays[f"table{t}.child{k}.offsets"], arrays[f"table{t}.child{k}.rows"] = offsets, rows
        mapped = memory_mapped(arrays, root)
        self.text_table = mapped["text_table"]
        for name in _arrays_of(self._index):
            setattr(self._index, name, mapped[f"index.{name}"])
        for t, table in enumerate(self.tables):
            for name in _arrays_of(table):
                setattr(table, name, mapped[f"table{t}.{name}"])
            table.parents = [(p, mapped[f"table{t}.parent{k}"]) for k, (p, _) in enumerate(table.parents)]
            table.children = [
                (c, mapped[f"table{t}.child{k}.offsets"], mapped[f"table{t}.child{k}.rows"])
                for k, (c, _, _) in enumerate(table.children)
            ]

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
        examples: list[RelationalExample] = []
        # Contexts are walked together, a chunk at a time: the walk's array operations then serve
        # many contexts at once, and a chunk's cell arrays stay small.
        for first in range(0, count, CONTEXTS_PER_WALK):
            chunk = np.arange(first, min(first + CONTEXTS_PER_WALK, count))
            keys = _context_keys(
                np.stack([np.full(len(chunk), self.seed), np.full(len(chunk), split_code), chunk])
            )
            batches = self._contexts(entities[chunk], times[chunk], keys)
            examples.extend(
                RelationalExample(batch, float(label))
                for batch, label in zip(batches, labels[chunk], strict=True)
            )
        return examples

    def context(self, entity_row: int, seed_time: float, rng_key: tuple[int, ...]) -> RelationalBatch:
        """The context of one seed: an entity row (-1 if unknown) at a time (seconds)."""
        keys = _context_keys(np.asarray(rng_key, dtype=object).reshape(-1, 1))
        return self._contexts(np.asarray([entity_row]), np.asarray([seed_time]), keys)[0]

    def visited_rows(
        self, entity_row: int, seed_time: float, rng_key: tuple[int, ...]
    ) -> list[tuple[str, int]]:
        """The rows the context of a seed visits after the seed, in order, as (table, row): rows of
        the database's tables, and train rows of the task (named by the task) as in-context examples."""
        keys = _context_keys(np.asarray(rng_key, dtype=object).reshape(-1, 1))
        walk = self._walk(np.asarray([entity_row]), np.asarray([seed_time], np.float64), keys)
        index = self._index
        return [
            (self.tables[table].name, int(row))
            for table, row in zip(
                index.table_of[walk.rows].tolist(), index.row_of[walk.rows].tolist(), strict=True
            )
        ]

    def _walk(self, entity_rows: np.ndarray, seed_times: np.ndarray, keys: np.ndarray) -> _Walked:
        index = self._index
        entity_first = int(index.first[self.table_index[self.spec.entity_table]])
        starts = np.where(entity_rows >= 0, entity_first + entity_rows, -1).astype(np.int64)
        walk = _ContextWalk(index, seed_times.astype(np.float64), keys, budget=self.context_length - 2)
        return walk.run(starts, self.max_children)

    def _contexts(
        self, entity_rows: np.ndarray, seed_times: np.ndarray, keys: np.ndarray
    ) -> list[RelationalBatch]:
        """The batches of the contexts of these seeds (entity rows, -1 if unknown; times in seconds;
        one random key each)."""
        seed_times = np.asarray(seed_times, np.float64)
        walked = self._walk(entity_rows, seed_times, keys)
        return self._emit(walked, seed_times)

    def _emit(self, walked: _Walked, seed_times: np.ndarray) -> list[RelationalBatch]:
        """Each context's batch: the seed's two cells, then every present cell of the rows reached,
        in the walk's order, cut to the context length. All contexts' cells are gathered at once in
        flat arrays, then each context takes its slice."""
        index, task = self._index, self.tables[-1]
        contexts = len(seed_times)
        ctx, rows = walked.contexts, walked.rows
        # Each row's cells, cut where its context's cells pass the budget.
        counts = index.cell_count[rows]
        kept = np.clip(self.context_length - 2 - _exclusive_cumsum_within(counts, ctx), 0, counts)
        # Entries: per context its seed (two cells, node 0), then its rows reached, in the order
        # of the cells. A cell then takes its entry's node, table, parents and first cell. (Rows
        # are context by context, so row i has the seeds of contexts 0..ctx[i] before it.)
        seed_entry = np.searchsorted(ctx, np.arange(contexts)) + np.arange(contexts)
        row_entry = np.arange(len(rows)) + ctx + 1
        entries = len(rows) + contexts
        seed_parents = np.full((contexts, MAX_PARENTS), -1, np.int64)
        seed_parents[walked.entity_reached(contexts), 0] = 1  # the seed points to its entity (node 1)
        entry_cells = _entries(entries, seed_entry, 2, row_entry, kept)
        # (A seed's cells are gathered from cell 0, then written over: the train split's labels
        # are cells, so there is one.)
        entry_first = _entries(entries, seed_entry, 0, row_entry, index.cell_start[rows])
        cells_of = np.bincount(ctx, kept, minlength=contexts).astype(np.int64) + 2
        starts = np.cumsum(cells_of) - cells_of
        total = int(cells_of.sum())
        # Each cell's entry, once: gathering by it is much faster than np.repeat per field.
        entry_of = np.repeat(np.arange(entries), entry_cells)
        within = np.arange(total) - (np.cumsum(entry_cells) - entry_cells)[entry_of]
        source = entry_first[entry_of] + within
        source[starts + 1] = 0
        node_idxs = _entries(entries, seed_entry, 0, row_entry, walked.nodes)[entry_of]
        table_idxs = _entries(entries, seed_entry, task.index, row_entry, index.table_of[rows])[entry_of]
        parents = np.take(
            _entries(entries, seed_entry, seed_parents, row_entry, walked.parent_nodes(index)),
            entry_of,
            axis=0,
        )
        col_idxs = index.cell_column[source]
        sem = index.cell_sem[source]
        value = index.cell_value[source]
        text = index.cell_text[source]
        col_idxs[starts], col_idxs[starts + 1] = task.column_ids[0], task.column_ids[1]
        sem[starts], sem[starts + 1] = SEM_DATETIME, task.sem[1]
        value[starts] = (seed_times - self.time_mean) / self.time_std
        value[starts + 1] = 0.0
        text[starts] = text[starts + 1] = -1

        targets = np.zeros(total, bool)
        targets[starts + 1] = True
        channels = {code: np.where(sem == code, value, np.float32(0.0)) for code in SEM_CODES.values()}
        flat = {
            "node_idxs": node_idxs,
            "f2p_nbr_idxs": parents,
            "col_name_idxs": col_idxs,
            "table_name_idxs": table_idxs,
            "is_padding": np.zeros(total, bool),
            "sem_types": sem,
            "is_targets": targets,
            "number_values": channels[SEM_NUMBER][:, None],
            "datetime_values": channels[SEM_DATETIME][:, None],
            "boolean_values": channels[SEM_BOOLEAN][:, None],
            # Rows of the embedding tables; a cell without text (-1) takes the zero row at the end.
            "text_rows": np.where(text >= 0, text, np.int64(len(self._text_table) - 1)),
            "col_name_rows": col_idxs,
        }
        return self._split(flat, cells_of.tolist())

    def _split(self, flat: dict[str, np.ndarray], sizes: list[int]) -> list[RelationalBatch]:
        """Each context's batch from the flat arrays of all contexts' cells (`sizes` cells each):
        its tensors are views of the flat ones ([1, cells, ...]), one split per field."""
        names = list(flat)
        per_field = [torch.split(torch.from_numpy(flat[name])[None], sizes, dim=1) for name in names]
        batches: list[RelationalBatch] = []
        for views in zip(*per_field, strict=True):
            context = dict(zip(names, views, strict=True))
            batches.append(
                LookedUpBatch(
                    context,
                    text_rows=context["text_rows"],
                    text_table=self._text_table,
                    col_name_rows=context["col_name_rows"],
                    col_name_table=self._column_table,
                )
            )
        return batches


CONTEXTS_PER_WALK = 256  # contexts walked together by `examples` (their cells' arrays: ~70 KB each at 1024)


class _RowIndex:
    """Every row of every table (the task's train rows last) under one global id, as flat arrays:
    the cells of a row in column order, its time, its parents and its children. A context's walk
    and its cells are then array lookups over many rows at once.

    Global id = the table's first id + the row. `cell_start[g]`, `cell_count[g]`: the row's
    present cells in `cell_column`/`cell_sem`/`cell_value`/`cell_text`; `parents[g]`: its parents'
    ids in foreign-key order (-1 where null or dangling); `child_start[g]..child_start[g + 1]`: its
    children's ids in `children`, by foreign key and then by row, as `_EncodedTable.children`
    lists them."""

    # The arrays with one entry per row or cell, which ContextSampler memory-maps.
    PER_ROW = (
        "table_of",
        "row_of",
        "draw_id",
        "visible_from",
        "cell_count",
        "cell_start",
        "cell_column",
        "cell_sem",
        "cell_value",
        "cell_text",
        "parents",
        "children",
        "child_start",
    )

    def __init__(self, tables: list[_EncodedTable]) -> None:
        sizes = np.asarray([t.num_rows for t in tables], np.int64)
        self.first = np.concatenate([[0], np.cumsum(sizes)])
        self.size = int(self.first[-1])
        self.task_table = len(tables) - 1
        self.table_of = np.repeat(np.arange(len(tables)), sizes)
        self.row_of = np.concatenate([np.arange(n) for n in sizes]) if len(sizes) else np.zeros(0, np.int64)
        # A row's identity for random draws: its table and row, not its global id, so that rows
        # added to one table change no draw among the rows of another.
        self.draw_id = ((self.table_of << 40) + self.row_of).astype(np.uint64)
        self.visible_from = np.concatenate([_visible_from(t, t.index == self.task_table) for t in tables])
        self.cell_count = np.concatenate([t.present.sum(axis=1) for t in tables]).astype(np.int64)
        self.cell_start = np.concatenate([[0], np.cumsum(self.cell_count)[:-1]]).astype(np.int64)
        where = [np.nonzero(t.present) for t in tables]  # row-major: a row's cells in column order
        self.cell_column = np.concatenate([t.column_ids[j] for t, (_, j) in zip(tables, where, strict=True)])
        self.cell_sem = np.concatenate([t.sem[j] for t, (_, j) in zip(tables, where, strict=True)])
        self.cell_value = np.concatenate([t.scalars[r, j] for t, (r, j) in zip(tables, where, strict=True)])
        self.cell_text = np.concatenate([t.text_ids[r, j] for t, (r, j) in zip(tables, where, strict=True)])
        self.parents = np.full((self.size, MAX_PARENTS), -1, np.int64)
        for t, table in enumerate(tables):
            for k, (parent, rows) in enumerate(table.parents):
                linked = rows >= 0
                ids = np.where(linked, self.first[parent] + rows, -1)
                self.parents[self.first[t] : self.first[t + 1], k] = ids
        self._index_children(tables)

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
            counts = np.bincount(owner, minlength=self.size)
        else:
            self.children = np.zeros(0, np.int64)
            counts = np.zeros(self.size, np.int64)
        self.child_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def visible(self, rows: np.ndarray, seed_times: np.ndarray) -> np.ndarray:
        """Which rows their seeds may see (`seed_times`: one per row): see `_visible_from`."""
        return self.visible_from[rows] <= seed_times


@dataclass
class _Walked:
    """The rows the walks reached, context by context and each context's in visiting order:
    `contexts[i]` reached `rows[i]` (a global id) as its node `nodes[i]` (the seed is node 0)."""

    contexts: np.ndarray
    rows: np.ndarray
    nodes: np.ndarray
    size: int  # the number of global ids, for the (context, row) keys
    reached: pair_table.PairTable | pair_table.DenseTable  # (context x size + row) -> node

    def entity_reached(self, contexts: int) -> np.ndarray:
        """Per context, whether its walk reached a row at all (the first is the seed's entity)."""
        return np.bincount(self.contexts, minlength=contexts) > 0

    def parent_nodes(self, index: _RowIndex) -> np.ndarray:
        """Each reached row's parents as nodes of its context, those reached, packed to the left
        in foreign-key order (-1 after them)."""
        links = index.parents[self.rows]
        packed = np.full(links.shape, -1, np.int64)
        filled = np.zeros(len(self.rows), np.int64)  # per row, the parents packed so far
        for k in range(links.shape[1]):
            linked = np.flatnonzero(links[:, k] >= 0)  # (most slots are empty: look up the links)
            nodes = self.reached.get(self.contexts[linked] * self.size + links[linked, k])
            hit = nodes >= 0
            linked = linked[hit]
            packed[linked, filled[linked]] = nodes[hit]
            filled[linked] += 1
        return packed


class _ContextWalk:
    """The walks of many seeds at once, level by level, each within a budget of cells.

    A level is a list of (context, row) pairs, context by context and in visiting order within a
    context. The first level is each seed's entity row; every next level is a sample of the
    children of the rows the level before reached (at most `max_children` per row, without
    replacement, those the seed may see and not reached yet). Each row a level adds is followed,
    depth first, by its parents not reached yet; a context stops once its cells reach the budget
    (the row that reaches it still counts, as its cells are cut when emitted)."""

    def __init__(self, index: _RowIndex, seed_times: np.ndarray, keys: np.ndarray, budget: int) -> None:
        self.index = index
        self.seed_times = seed_times
        self.keys = keys  # one random key per context (uint64)
        self.remaining = np.full(len(seed_times), budget, np.int64)
        # (context x size + row) -> node, of the rows reached; a context's nodes count from 1 (the
        # seed is node 0) in the order its rows are reached.
        self.reached = pair_table.table_for(
            len(seed_times) * index.size, expected=len(seed_times) * max(budget // 2, 1)
        )
        self.node_count = np.zeros(len(seed_times), np.int64)

    def run(self, starts: np.ndarray, max_children: int) -> _Walked:
        size = self.index.size
        ctx = np.flatnonzero(starts >= 0)
        first = self._reach(ctx, starts[ctx])
        steps, frontier = [first], first
        depth = 1
        while len(frontier[0]):
            reached = self._next_level(frontier, max_children, depth)
            steps.extend(reached)
            frontier = _by_context(reached)
            depth += 1
        all_ctx, all_rows = _by_context(steps)
        nodes = _position_within(all_ctx) + 1
        return _Walked(all_ctx, all_rows, nodes, size, self.reached)

    def _next_level(
        self, frontier: tuple[np.ndarray, np.ndarray], max_children: int, depth: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The rows reached from the children of a frontier, in steps: each context's first
        frontier row, then its next 2, then 4, ..., so that a context whose budget is spent early
        stops drawing children (as a walk one row at a time would) while a step still serves every
        context at once."""
        ctx, rows = frontier
        position = _position_within(ctx)
        steps: list[tuple[np.ndarray, np.ndarray]] = []
        low, width = 0, 1
        while low <= (position.max() if len(position) else -1):
            step = (position >= low) & (position < low + width) & (self.remaining[ctx] > 0)
            if step.any():
                children = self._sampled_children(ctx[step], rows[step], max_children, depth)
                steps.append(self._reach(*children))
            low, width = low + width, width * 2
        return steps

    def _reach(self, ctx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reach these rows (each followed by its parents), within the budget: the pairs reached."""
        ctx, rows = self._within_budget(*self._with_parents(ctx, rows))
        # New pairs are distinct, not reached before, and context by context (as every level is).
        nodes = self.node_count[ctx] + _position_within(ctx) + 1
        self.node_count += np.bincount(ctx, minlength=len(self.node_count))
        self.reached.insert(ctx * self.index.size + rows, nodes)
        return ctx, rows

    def _unreached(self, ctx: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return ~self.reached.contains(ctx * self.index.size + rows)

    def _with_parents(self, ctx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pairs, each followed depth first by its parents, keeping the first time a row comes
        and only rows the seed may see that no earlier level reached."""
        parents, size = self.index.parents, self.index.size
        open_ = np.ones(len(rows), bool)  # rows whose parents are not listed yet
        while True:
            candidate = np.flatnonzero(open_)
            candidate_ctx, candidate_rows = ctx[candidate], rows[candidate]
            passed = self.index.visible(candidate_rows, self.seed_times[candidate_ctx])
            passed[passed] = self._unreached(candidate_ctx[passed], candidate_rows[passed])
            keep = ~open_
            keep[candidate] = passed
            if passed.any():  # (the rows kept before are distinct: only a new one can repeat a row)
                keep &= _first_times(ctx * size + rows)
            ctx, rows, open_ = ctx[keep], rows[keep], open_[keep]
            if not open_.any():
                return ctx, rows
            # Each open row is followed by its parents (open in turn); the others stay alone.
            opened = np.flatnonzero(open_)
            links = parents[rows[opened]]
            linked = links >= 0
            span = np.ones(len(rows), np.int64)
            span[opened] += linked.sum(axis=1)
            at = np.cumsum(span) - span  # where each row goes
            owner, slot = np.nonzero(linked)
            parent_at = at[opened[owner]] + np.cumsum(linked, axis=1)[owner, slot]
            listed = np.empty(int(at[-1] + span[-1]), rows.dtype)
            listed[at] = rows
            listed[parent_at] = links[owner, slot]
            open_ = np.zeros(len(listed), bool)
            open_[parent_at] = True
            ctx, rows = np.repeat(ctx, span), listed

    def _within_budget(self, ctx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pairs up to and including the one whose cells reach its context's budget."""
        counts = self.index.cell_count[rows]
        keep = _exclusive_cumsum_within(counts, ctx) < self.remaining[ctx]
        ctx, rows = ctx[keep], rows[keep]
        self.remaining -= np.bincount(ctx, counts[keep], minlength=len(self.remaining)).astype(np.int64)
        return ctx, rows

    def _sampled_children(
        self, ctx: np.ndarray, rows: np.ndarray, max_children: int, depth: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per pair, its row's children that the seed may see and are not reached yet, at most
        `max_children` of them: those with the smallest random keys, in their order."""
        index = self.index
        low, high = index.child_start[rows], index.child_start[rows + 1]
        counts = high - low
        group = np.repeat(np.arange(len(rows)), counts)
        # The children of pair i lie at low[i]..high[i]: each position is its index in the
        # candidates plus its pair's shift.
        shift = np.repeat(low - (np.cumsum(counts) - counts), counts)
        children = index.children[np.arange(len(group)) + shift]
        child_ctx = ctx[group]
        visible = np.flatnonzero(index.visible(children, self.seed_times[child_ctx]))
        keep = visible[self._unreached(child_ctx[visible], children[visible])]
        group, children, child_ctx = group[keep], children[keep], child_ctx[keep]
        # Only a row with more candidates than max_children draws: the others keep them all.
        drawing = np.bincount(group, minlength=len(rows)) > max_children
        sampled = np.flatnonzero(drawing[group])
        if not len(sampled):
            return child_ctx, children
        group_s, children_s, ctx_s = group[sampled], children[sampled], child_ctx[sampled]
        random = _mix(self.keys[ctx_s] ^ _mix(index.draw_id[children_s] + np.uint64(depth << 56)))
        by_key = _order_within_groups(group_s, random)
        rank = np.empty(len(sampled), np.int64)
        rank[by_key] = _position_within(group_s[by_key])
        picked = np.ones(len(group), bool)
        picked[sampled] = rank < max_children
        return child_ctx[picked], children[picked]


def _entries(
    count: int, seed_entry: np.ndarray, seeds: np.ndarray | int, row_entry: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """One value per entry (a seed's or a reached row's), as np.insert of the seeds' values before
    each context's rows would give, in one scatter of each."""
    values = np.empty((count, *rows.shape[1:]), rows.dtype)
    values[seed_entry] = seeds
    values[row_entry] = rows
    return values


def _visible_from(table: _EncodedTable, is_task: bool) -> np.ndarray:
    """Per row, the earliest seed time that may see it, so that one comparison tells: a row of the
    database from its own time on (always, without a time), a train task row only strictly after
    its time (the next float up; never, without a time)."""
    if table.time is None:
        return np.full(table.num_rows, np.inf if is_task else -np.inf)
    if is_task:
        return np.where(np.isnan(table.time), np.inf, np.nextafter(table.time, np.inf))
    return np.where(np.isnan(table.time), -np.inf, table.time)


def _by_context(steps: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The (context, row) pairs of several steps, context by context, each context's in step order."""
    if not steps:
        empty = np.zeros(0, np.int64)
        return empty, empty
    ctx = np.concatenate([c for c, _ in steps])
    rows = np.concatenate([r for _, r in steps])
    order = np.argsort(ctx, kind="stable")
    return ctx[order], rows[order]


def _position_within(groups: np.ndarray) -> np.ndarray:
    """Each item's position within its run of equal (consecutive) group values."""
    if not len(groups):
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
    lengths = np.diff(np.concatenate([starts, [len(groups)]]))
    return np.arange(len(groups)) - np.repeat(starts, lengths)


def _exclusive_cumsum_within(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per item, the sum of the values before it in its run of equal (consecutive) group values."""
    if not len(values):
        return np.zeros(0, np.int64)
    total = np.cumsum(values) - values
    starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
    lengths = np.diff(np.concatenate([starts, [len(groups)]]))
    return total - np.repeat(total[starts], lengths)


def _order_within_groups(groups: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The order of np.lexsort((keys, groups)) for sorted int `groups` and uint64 `keys`, faster:
    one stable sort of the group's rank in the top bits and the key's top bits below it. Only keys
    equal in those bits within a group (about never: 2^-44 a pair) need lexsort's full comparison."""
    rank = np.cumsum(np.concatenate([[False], groups[1:] != groups[:-1]])).astype(np.uint64)
    bits = np.uint64(int(rank[-1]).bit_length() if len(rank) else 0)
    combined = (rank << (np.uint64(64) - bits)) | (keys >> bits) if bits else keys
    # No stable sort needed: ties are checked below, and without them every sort gives one order
    # (numpy's default sort is several times faster than its stable one on random 64-bit keys).
    order = np.argsort(combined)
    ordered = combined[order]
    if bool((ordered[1:] == ordered[:-1]).any()):
        return np.lexsort((keys, groups))
    return order


def _first_times(keys: np.ndarray) -> np.ndarray:
    """Which items are the first of their key: the smallest index of each run of equal keys in
    sorted order (an unstable sort, several times faster than a stable one on these keys)."""
    first = np.zeros(len(keys), bool)
    if not len(keys):
        return first
    order = np.argsort(keys)
    ordered = keys[order]
    runs = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    first[np.minimum.reduceat(order, runs)] = True
    return first


_MASK64 = (1 << 64) - 1


def _mix(values: np.ndarray) -> np.ndarray:
    """A 64-bit integer hash (splitmix64's finaliser): random-looking keys from integers."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _context_keys(parts: np.ndarray) -> np.ndarray:
    """One random key per context from its integers (a column each: seed, split, row): the same
    integers give the same key, whatever else is walked with them."""
    keys = np.zeros(parts.shape[1], np.uint64)
    for part in parts:
        keys = _mix(keys ^ np.asarray([int(v) & _MASK64 for v in part], np.uint64))
    return keys


def _arrays_of(holder: object) -> dict[str, np.ndarray]:
    """An object's array attributes with one value per row (not its per-column or per-table ones)."""
    per_row = {"present", "scalars", "text_ids", "time"} | set(_RowIndex.PER_ROW)
    return {
        name: value
        for name, value in vars(holder).items()
        if name in per_row and isinstance(value, np.ndarray)
    }


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over the array's memory; a read-only memory map stays read-only (nothing writes to
    these tables: contexts gather copies of their rows)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


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
