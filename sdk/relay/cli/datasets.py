"""`relay datasets`: describe or check a LeRobot v2.1 or v3.0 dataset, print its norm stats, write a
synthetic one.

These commands run the engine on this machine (they need the engine extra); a dataset is a Hub
repo id (at --revision; by default v2.1, else a v3.0 default branch), a local directory or a file://
URL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from pkgutil import resolve_name
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from relay import families
from relay.cli._common import console, dataset_name, fail, parse_pairs
from relay.cli._extras import require
from relay.dataset_description import DatasetDescription
from relay.dataset_names import is_database_url, is_relational_source, redacted_url

app = typer.Typer(
    help="Describe and check LeRobot v2.1 and v3.0 datasets, print their norm stats, write synthetic ones.",
    no_args_is_help=True,
)

_out = console()
_err = console(stderr=True)

DatasetArg = Annotated[
    str,
    typer.Argument(
        help="A Hub dataset repo id, a local directory or a file:// URL (rt-j: a database directory, or "
        "a database URL such as sqlite:///shop.db or postgresql://host/db)."
    ),
]
TasksDirOption = Annotated[
    Path | None,
    typer.Option(
        "--tasks-dir",
        help="rt-j: a directory holding the database's tasks (schema.json's tasks, <task>/train.parquet...).",
    ),
]
RevisionOption = Annotated[
    str | None,
    typer.Option(help="A Hub dataset's branch, tag or commit (default: v2.1, else a v3.0 default branch)."),
]
CacheDirOption = Annotated[
    Path | None,
    typer.Option(
        help="Where fetched datasets and frame indexes go [default: RELAY_CACHE_DIR or ~/.cache/relay]."
    ),
]


@app.command()
def inspect(
    dataset: DatasetArg,
    cache_dir: CacheDirOption = None,
    revision: RevisionOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the description as JSON.")] = False,
) -> None:
    """Describe the dataset from its meta files alone (of a Hub repo only meta/ is fetched): its
    cameras (image or video; size; a video camera's codec, pixel format and fps), state and action
    widths, fps, episodes, frames, tasks, format, what was read, and the camera map a job would use.
    Nothing is decoded: `relay datasets check` checks the files."""
    if families.family_of_data(dataset) is not None:
        shown = redacted_url(dataset) if is_database_url(dataset) else dataset
        fail(f"{shown} is a relational database; `relay datasets check {shown}` describes it")
    datasets = require("relay_engine.datasets")
    errors = require("relay_engine.errors")
    try:
        description = datasets.describe_dataset(dataset_name(dataset), revision=revision, cache_dir=cache_dir)
    except errors.EngineError as error:
        fail(str(error))
    if json_output:
        print(description.model_dump_json(indent=2))
        return
    _print_description(description)


@app.command()
def check(
    dataset: DatasetArg,
    camera: Annotated[
        list[str] | None,
        typer.Option(help="MODEL_CAMERA=FEATURE, repeatable; by default the image features in order."),
    ] = None,
    cache_dir: CacheDirOption = None,
    revision: RevisionOption = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="Read images' headers only, not every pixel (faster; misses broken frames)."
        ),
    ] = False,
    tasks_dir: TasksDirOption = None,
) -> None:
    """Print what the dataset holds and every problem; exit 0 only if it can be trained on. Every
    image is decoded, as training will (in parallel, with a progress bar), unless --quick.
    A relational database (a directory of schema.json + tables/, or a SQL database's URL, read as
    one snapshot whose row counts are shown) is checked as one, for rt-j."""
    own = families.family_of_data(dataset)
    if own is not None:  # a family's own kind of data (an rt-j database), checked by its checker
        if revision is not None:
            fail(f"bad --revision: {redacted_url(dataset)} is a {own.name} database, which has no revisions")
        _own_data_checker(own).check(dataset_name(dataset), tasks_dir)
        return
    _no_tasks_dir(dataset, tasks_dir)
    datasets = require("relay_engine.datasets")
    errors = require("relay_engine.errors")
    name = dataset_name(dataset)
    try:
        source = datasets.locate_dataset(name, revision=revision, cache_dir=cache_dir)
    except errors.EngineError as error:
        fail(str(error))
    root = source.root
    inspection = datasets.inspect_dataset(root, name)
    problems: list[str] = inspection.problems.messages()
    if not quick and inspection.meta is not None:
        problems += _decode_every_image(inspection.meta)
    camera_map: dict[str, str] = {}
    summary = inspection.summary
    if summary is not None:
        try:
            camera_map = datasets.map_cameras(
                name, summary, parse_pairs(camera, "camera") if camera else None
            )
        except errors.EngineError as error:
            problems.append(str(getattr(error, "problem", error)))
        try:
            shipped = datasets.shipped_norm_stats(root, name, summary)
        except errors.DatasetError as error:
            problems.append(error.problem)
            shipped = None
        _print_summary(summary, source, camera_map, shipped[1] if shipped else None, inspection)
    if problems:
        plural = "s" if len(problems) > 1 else ""
        _err.print(f"[red]{len(problems)} problem{plural} in {escape(name)}:[/red]", soft_wrap=True)
        for problem in problems:
            _err.print(f"  - {problem}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    _out.print(f"[green]{escape(name)} can be trained on.[/green]", soft_wrap=True)


def _decode_every_image(meta: Any) -> list[str]:
    image_check = require("relay_engine.datasets.image_check")
    with Progress(
        TextColumn("decoding every image"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("episodes"),
        TimeRemainingColumn(),
        console=_err,
        transient=True,
    ) as progress:
        task = progress.add_task("decode", total=len(meta.episodes))
        bad = image_check.decode_every_image(meta, lambda done: progress.advance(task, done))
    described: list[str] = image_check.describe(bad)
    return described


@app.command()
def stats(
    dataset: DatasetArg,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print openpi's norm_stats.json layout.")
    ] = False,
    output: Annotated[Path | None, typer.Option(help="Write norm_stats.json (openpi's layout) here.")] = None,
    cache_dir: CacheDirOption = None,
    revision: RevisionOption = None,
    tasks_dir: TasksDirOption = None,
) -> None:
    """Print (or write) the normalization statistics training uses, in openpi's layout. For a
    relational database: each column's type and statistics, and each task's labels."""
    own = families.family_of_data(dataset)
    if own is not None:
        _own_data_checker(own).stats(dataset_name(dataset), tasks_dir, json_output)
        return
    _no_tasks_dir(dataset, tasks_dir)
    datasets = require("relay_engine.datasets")
    errors = require("relay_engine.errors")
    name = dataset_name(dataset)
    try:
        norm_stats, source = datasets.dataset_norm_stats(name, revision=revision, cache_dir=cache_dir)
    except errors.EngineError as error:
        fail(str(error))
    text = norm_stats.to_json()
    if output is not None:
        try:
            output.write_text(text + "\n")
        except OSError as error:
            fail(f"cannot write {output}: {error}")
    if json_output:
        print(text)
    elif output is None:
        origin = "computed over every frame; exact quantiles" if source == "computed" else f"from {source}"
        _out.print(f"Norm stats of [bold]{escape(name)}[/bold] ({origin})", soft_wrap=True)
        if source == "computed":
            _print_lerobot_quantile_gap(datasets, name, norm_stats, revision, cache_dir)
        for label, values in (("state", norm_stats.state), ("actions", norm_stats.actions)):
            table = Table(title=label, title_justify="left")
            for column in ("dim", "mean", "std", "q01", "q99"):
                table.add_column(column, justify="right")
            for d in range(values.width):
                table.add_row(
                    str(d), *(f"{getattr(values, k)[d]:.6g}" for k in ("mean", "std", "q01", "q99"))
                )
            _out.print(table)
    if output is not None and not json_output:
        _out.print(f"wrote {output}", soft_wrap=True, markup=False)


def _print_lerobot_quantile_gap(
    datasets: Any, name: str, norm_stats: Any, revision: str | None, cache_dir: Path | None
) -> None:
    """Say how far the dataset's own meta/stats.json quantiles (lerobot's) are from the exact ones."""
    root = datasets.resolve_dataset(name, revision=revision, cache_dir=cache_dir)
    gap = datasets.lerobot_quantile_gap(root, norm_stats)
    if gap is not None:
        _out.print(
            f"meta/stats.json's q01/q99 (lerobot's estimates: per-episode histograms, averaged) differ "
            f"from these by up to {gap:.1%} of the q01..q99 span; Relay normalizes with these.",
            soft_wrap=True,
            markup=False,
        )


@app.command()
def synth(
    out_dir: Annotated[Path, typer.Argument(help="Where to write the dataset (absent or empty).")],
    episodes: Annotated[int, typer.Option(help="Number of episodes.")] = 40,
    length: Annotated[
        str, typer.Option(help="Frames per episode: N, or LOW-HIGH drawn per episode.")
    ] = "30-60",
    camera: Annotated[
        list[str] | None,
        typer.Option(
            help="FEATURE=HEIGHTxWIDTH, repeatable, e.g. observation.images.top=64x64 "
            "[default: observation.images.top=64x64, observation.images.wrist=64x64]."
        ),
    ] = None,
    state_dim: Annotated[int, typer.Option(help="State width, 2 to 32.")] = 2,
    action_dim: Annotated[int, typer.Option(help="Action width, 2 to 32.")] = 2,
    tasks: Annotated[int, typer.Option(help="Number of tasks (target colours), 1 to 8.")] = 1,
    colour: Annotated[
        list[str] | None,
        typer.Option(
            "--colour",
            help="A task's target colour, repeatable (instead of --tasks): red, blue, green, yellow, "
            "magenta, cyan, orange, black. The pi05-tiny base never saw orange.",
        ),
    ] = None,
    fps: Annotated[int, typer.Option(help="Frames per second.")] = 10,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    noise: Annotated[int, typer.Option(help="Pixel noise amplitude, 0 to 64.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT_DIR if it is not empty.")] = False,
    format: Annotated[
        str, typer.Option("--format", help="LeRobot format: v2.1 (one file per episode) or v3.0.")
    ] = "v2.1",
    video: Annotated[
        bool, typer.Option(help="Store the cameras as mp4 video instead of PNG images.")
    ] = False,
    video_codec: Annotated[
        str, typer.Option(help="With --video: h264 (yuv420p) or av1 (libsvtav1, where PyAV has it).")
    ] = "h264",
    episodes_per_file: Annotated[
        int, typer.Option(help="v3.0: episodes per data file and per video file.")
    ] = 1000,
) -> None:
    """Write a synthetic LeRobot dataset (v2.1 images by default): move to the dot of the task's colour."""
    # A LeRobot dataset, which every robot family reads: written by the shared reader's package.
    synth = require("relay_engine.datasets.synth")
    errors = require("relay_engine.errors")
    episode_length = _length(length)
    cameras = (
        {feature: _size(size) for feature, size in parse_pairs(camera, "camera").items()} if camera else None
    )
    try:
        path = synth.write_synthetic_dataset(
            out_dir,
            episodes=episodes,
            episode_length=episode_length,
            cameras=cameras,
            state_dim=state_dim,
            action_dim=action_dim,
            num_tasks=tasks,
            colours=colour,
            fps=fps,
            seed=seed,
            noise=noise,
            overwrite=overwrite,
            format=format,
            video=video,
            video_codec=video_codec,
            episodes_per_file=episodes_per_file,
        )
    except errors.EngineError as error:
        message = str(error)
        if not overwrite and "already exists and is not empty" in message:
            message += "; add --overwrite to replace it"
        fail(message)
    _out.print(f"wrote {path}", soft_wrap=True, markup=False)


@app.command("synth-db")
def synth_db(
    out_dir: Annotated[Path, typer.Argument(help="Where to write the database (absent or empty).")],
    customers: Annotated[int, typer.Option(help="Customers, 2 to 100,000.")] = 100,
    products: Annotated[int, typer.Option(help="Products, 1 to 100,000.")] = 30,
    reviews: Annotated[int, typer.Option(help="Reviews (one every two days), 10 to 1,000,000.")] = 600,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Write a small shop database for rt-j (customers, products, reviews) with two tasks:
    user-churn (binary) and user-ltv (regression)."""
    for option, value, low, high in (
        ("customers", customers, 2, 100_000),
        ("products", products, 1, 100_000),
        ("reviews", reviews, 10, 1_000_000),
    ):
        if not low <= value <= high:
            fail(f"--{option} must be from {low:,} to {high:,}, got {value}")
    if out_dir.exists() and any(out_dir.iterdir()):
        fail(f"{out_dir} is not empty")
    shop = require("relay_engine.families.rtj.synth")
    path = shop.write_fake_shop(out_dir, customers=customers, products=products, reviews=reviews, seed=seed)
    _out.print(f"wrote {path} (tasks user-churn, user-ltv)", soft_wrap=True, markup=False)


@app.command("task")
def task(
    database: Annotated[Path, typer.Argument(help="An rt-j database directory (schema.json, tables/).")],
    name: Annotated[str, typer.Argument(help="The new task's name (its folder under tasks/).")],
    entity: Annotated[str, typer.Option(help="The entity table: one row per entity and timestamp.")],
    events: Annotated[
        str, typer.Option(help="The event table: it has a time column and a foreign key to the entity table.")
    ],
    window: Annotated[str, typer.Option(help="How far after each timestamp events count: 30d, 12h, 2w.")],
    aggregate: Annotated[
        str, typer.Option(help="count, sum, mean, max or min (of --column), or exists.")
    ] = "count",
    column: Annotated[str | None, typer.Option(help="The event column for sum, mean, max and min.")] = None,
    threshold: Annotated[
        str | None,
        typer.Option(help="Makes a binary label, e.g. '==0' (no event: churn); without it: regression."),
    ] = None,
    val_timestamp: Annotated[
        str | None, typer.Option(help="The validation cutoff (ISO); train steps back from it.")
    ] = None,
    test_timestamp: Annotated[str | None, typer.Option(help="The test cutoff (ISO).")] = None,
    step: Annotated[str | None, typer.Option(help="Between train timestamps (default: the window).")] = None,
    train_timestamps: Annotated[
        str | None, typer.Option(help="Instead of the cutoffs: comma-separated ISO timestamps.")
    ] = None,
    val_timestamps: Annotated[str | None, typer.Option(help="With --train-timestamps.")] = None,
    test_timestamps: Annotated[str | None, typer.Option(help="With --train-timestamps.")] = None,
    event_key: Annotated[
        str | None, typer.Option(help="The event table's key to the entity, if it has several.")
    ] = None,
    replace: Annotated[bool, typer.Option(help="Remake a task of that name.")] = False,
) -> None:
    """Make a task from time windows, as RelBench does: at each timestamp, each entity that exists
    then, labelled by --aggregate of its events in the --window after it. Writes
    tasks/NAME/{train,val,test}.parquet and adds the task to schema.json."""
    tasks = require("relay_engine.families.rtj.tasks")
    errors = require("relay_engine.errors")
    opened = _open_database(str(database), None)
    try:
        spec = tasks.WindowTask(
            name=name,
            entity_table=entity,
            event_table=events,
            window=_duration(tasks, "window", window),
            aggregate=aggregate,
            column=column,
            threshold=_threshold(tasks, threshold),
            event_key=event_key,
        )
        stamps = _split_timestamps(
            tasks,
            opened,
            spec,
            (val_timestamp, test_timestamp, step),
            (train_timestamps, val_timestamps, test_timestamps),
        )
        written = tasks.write_window_task(opened, spec, stamps, replace=replace)
    except errors.EngineError as error:
        fail(str(error))
    rows = ", ".join(f"{split} {len(times)} timestamp(s)" for split, times in stamps.of().items())
    _out.print(
        f"wrote task {name} ({written.problem_type}, on {entity}): {rows}", soft_wrap=True, markup=False
    )


def _duration(tasks: Any, option: str, text: str) -> Any:
    try:
        return tasks.parse_duration(text)
    except ValueError as error:
        fail(f"--{option}: {error}")


def _threshold(tasks: Any, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return tasks.Threshold.parse(text)
    except ValueError as error:
        fail(f"--threshold: {error}")


def _timestamps(option: str, text: str | None) -> tuple[datetime, ...]:
    if not text:
        return ()
    try:
        return tuple(datetime.fromisoformat(part.strip()) for part in text.split(","))
    except ValueError:
        fail(f"--{option}: timestamps are ISO dates or datetimes separated by commas, got {text!r}")


def _split_timestamps(
    tasks: Any,
    database: Any,
    spec: Any,
    cutoffs: tuple[str | None, str | None, str | None],
    lists: tuple[str | None, str | None, str | None],
) -> Any:
    """The splits' timestamps: from --val-timestamp and --test-timestamp (and --step), or the lists."""
    val, test, step = cutoffs
    if any(lists):
        if val or test or step:
            fail(
                "give either --val-timestamp and --test-timestamp (and --step), or --train-timestamps "
                "(and --val-timestamps, --test-timestamps)"
            )
        train_at, val_at, test_at = (
            _timestamps(option, text)
            for option, text in zip(
                ("train-timestamps", "val-timestamps", "test-timestamps"), lists, strict=True
            )
        )
        if not train_at:
            fail("--train-timestamps: at least one timestamp")
        return tasks.SplitTimestamps(train_at, val_at, test_at)
    if not (val and test):
        fail("give --val-timestamp and --test-timestamp (or --train-timestamps)")
    every = _duration(tasks, "step", step) if step else None
    return tasks.stepped_timestamps(
        database, _timestamp("val-timestamp", val), _timestamp("test-timestamp", test), spec.window, every
    )


def _timestamp(option: str, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        fail(f"--{option}: an ISO date or datetime (e.g. 2024-01-31 or 2024-01-31T12:00), got {text!r}")


# -- helpers -----------------------------------------------------------------------------------------


def _print_summary(
    summary: Any, source: Any, camera_map: dict[str, str], norm_stats_file: str | None, inspection: Any
) -> None:
    table = Table(title=f"Dataset {summary.name}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("read", escape(source.describe()))
    table.add_row("format", f"LeRobot {inspection.meta.version}")
    table.add_row("files", str(source.root))
    table.add_row("robot type", summary.robot_type)
    table.add_row("episodes", f"{summary.episodes:,}")
    table.add_row("frames", f"{summary.frames:,}")
    table.add_row("fps", f"{summary.fps:g}")
    table.add_row("state width", str(summary.state_dim))
    table.add_row("action width", str(summary.action_dim))
    table.add_row("norm stats", norm_stats_file or "none shipped: computed when training starts")
    _out.print(table)

    model_cameras: dict[str, list[str]] = {}
    for camera, feature in camera_map.items():
        model_cameras.setdefault(feature, []).append(camera)
    cameras = Table(title="Cameras", title_justify="left")
    for column in ("feature", "stored", "height x width", "video (its first mp4)", "model camera"):
        cameras.add_column(column)
    for feature, (height, width) in summary.cameras.items():
        video = feature in inspection.meta.video_sizes
        probed = inspection.videos.get(feature)
        cameras.add_row(
            escape(feature),
            "video" if video else "image",
            f"{height} x {width}",
            f"{probed.codec}, {probed.pix_fmt}, {probed.fps:g} fps"
            if probed
            else ("not decodable" if video else ""),
            ", ".join(model_cameras.get(feature, ["(unused)"])),
        )
    _out.print(cameras)

    _print_tasks(summary.tasks)


def _print_description(description: DatasetDescription) -> None:
    table = Table(title=f"Dataset {description.name}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("read", escape(description.read()))
    table.add_row("format", f"LeRobot {description.format}")
    table.add_row("robot type", escape(description.robot_type))
    table.add_row("episodes", f"{description.episodes:,}")
    table.add_row("frames", f"{description.frames:,}")
    table.add_row("fps", f"{description.fps:g}")
    table.add_row("state width", str(description.state_dim))
    table.add_row("action width", str(description.action_dim))
    _out.print(table)

    model_cameras: dict[str, list[str]] = {}
    for model_camera, feature in description.camera_map.items():
        model_cameras.setdefault(feature, []).append(model_camera)
    cameras = Table(title="Cameras (model camera: the map a job uses without --camera)", title_justify="left")
    for column in ("feature", "stored", "height x width", "video", "model camera"):
        cameras.add_column(column)
    for camera in description.cameras:
        cameras.add_row(
            escape(camera.feature),
            camera.stored,
            camera.size(),
            escape(camera.video()),
            ", ".join(model_cameras.get(camera.feature, ["(unused)"])),
        )
    _out.print(cameras)
    _print_tasks({task.task_index: task.task for task in description.tasks})


def _print_tasks(tasks_by_index: dict[int, str]) -> None:
    tasks = Table(title=f"Tasks ({len(tasks_by_index)})", title_justify="left")
    tasks.add_column("task_index", justify="right")
    tasks.add_column("task (the prompt)")
    shown = list(tasks_by_index.items())
    for index, task in shown[:10]:
        tasks.add_row(str(index), escape(task))
    if len(shown) > 10:
        tasks.add_row("...", f"and {len(shown) - 10} more")
    _out.print(tasks)


def _size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match:
        raise typer.BadParameter(f"expected HEIGHTxWIDTH, got {text!r}", param_hint="--camera")
    return int(match[1]), int(match[2])


def _length(text: str) -> int | tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    if not match:
        raise typer.BadParameter(f"expected N or LOW-HIGH, got {text!r}", param_hint="--length")
    return int(match[1]) if match[2] is None else (int(match[1]), int(match[2]))


def _no_tasks_dir(dataset: str, tasks_dir: Path | None) -> None:
    if tasks_dir is not None:
        fail(f"bad --tasks-dir: {dataset} is not a relational database (--tasks-dir is for rt-j's)")


@dataclass(frozen=True)
class OwnDataChecker:
    """How `relay datasets check` and `stats` show a family's own kind of data."""

    check: Callable[[str, Path | None], None]  # the dataset, its tasks_dir
    stats: Callable[[str, Path | None, bool], None]  # and whether to print JSON


def _own_data_checker(family: families.FamilySpec) -> OwnDataChecker:
    if family.data_checker is None:
        fail(f"relay datasets cannot check {family.name}'s data")
    checker = resolve_name(family.data_checker)
    if not isinstance(checker, OwnDataChecker):
        fail(f"relay datasets cannot check {family.name}'s data: {family.data_checker} is no OwnDataChecker")
    return checker


def _open_database(dataset: str, tasks_dir: Path | None) -> Any:
    database = require("relay_engine.families.rtj.database")
    errors = require("relay_engine.errors")
    source = dataset if is_relational_source(dataset) else Path(dataset).expanduser()
    try:
        return database.open_database(source, tasks_dir)
    except errors.EngineError as error:
        fail(str(error))


def _check_database(dataset: str, tasks_dir: Path | None) -> None:
    summary = require("relay_engine.families.rtj.summary")
    database = _open_database(dataset, tasks_dir)
    snapshot = database.snapshot
    if snapshot is not None:
        counts = ", ".join(f"{name} {rows:,}" for name, rows in snapshot.row_counts.items())
        _out.print(
            f"snapshot of {escape(snapshot.source)} taken at {snapshot.taken_at} in {snapshot.path}; "
            f"rows: {counts}",
            soft_wrap=True,
            highlight=False,
        )
    shown = redacted_url(dataset) if is_database_url(dataset) else dataset
    report, problems = summary.check_database(database)
    tables = Table("table", "rows", "key", "time", "foreign keys (dangling)", "columns", box=None)
    for name, table in report["tables"].items():
        links = ", ".join(
            f"{c}->{link['table']} ({link['dangling']})" for c, link in table["foreign_keys"].items()
        )
        columns = ", ".join(f"{c}:{kind}" for c, kind in table["columns"].items())
        tables.add_row(
            name, f"{table['rows']:,}", table["primary_key"] or "", table["time_column"] or "", links, columns
        )
    _out.print(tables)
    for name, task in report["tasks"].items():
        splits = ", ".join(f"{split} {info['rows']:,} rows" for split, info in task["splits"].items())
        _out.print(
            f"task [bold]{escape(name)}[/bold] ({task['problem_type']}, on {task['entity_table']}): {splits}"
        )
    if problems:
        _err.print(f"[red]{len(problems)} problem(s) in {escape(shown)}:[/red]", soft_wrap=True)
        for problem in problems:
            _err.print(f"  - {problem}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    _out.print(f"[green]{escape(shown)} can be trained on (rt-j).[/green]", soft_wrap=True)


def _database_stats(dataset: str, tasks_dir: Path | None, json_output: bool) -> None:
    summary = require("relay_engine.families.rtj.summary")
    database = _open_database(dataset, tasks_dir)
    stats = summary.column_stats(database)
    report, _ = summary.check_database(database)
    if json_output:
        print(json.dumps({"columns": stats, "tasks": report["tasks"]}))
        return
    for name, columns in stats.items():
        table = Table(title=name, title_justify="left", box=None)
        for header in ("column", "type", "missing", "statistics"):
            table.add_column(header)
        for column, row in columns.items():
            figures = ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in row.items()
                if k not in ("type", "missing")
            )
            table.add_row(column, row["type"], str(row["missing"]), figures)
        _out.print(table)
    for name, task in report["tasks"].items():
        for split, info in task["splits"].items():
            figures = ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items()
            )
            _out.print(f"task {escape(name)} {split}: {figures}", soft_wrap=True)


# A relational database's checker: RT-J's spec names it (FamilySpec.data_checker).
DATABASE_CHECKER = OwnDataChecker(check=_check_database, stats=_database_stats)
