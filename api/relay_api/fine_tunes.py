"""What the API does with recipe jobs: create (idempotently), find, list, cancel, read events.

Each function is one or two short transactions on the fine-tune row; statuses only move as
``relay.sft.status.TRANSITIONS`` allows, through conditional updates, so concurrent requests and
workers cannot undo each other.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from relay import families
from relay.checkpoints import architecture_mismatch, checkpoint_model, parse_checkpoint
from relay.dataset_mixture import recipe_datasets
from relay.dataset_names import is_database_url, local_dataset_path, names_local_directory
from relay.env_evaluation import check_job_eval_budget
from relay.errors import ConfigError
from relay.events import CancelledEvent, ValidationEvent
from relay.integrations import tracker_secrets, without_secrets
from relay.memory_plan import GB, MemoryPlan, cpu_refusal, gpu_shortfall, plan_named, plan_of_recipe
from relay.sft import status as st
from relay.sft.config import SFTConfig
from relay.sft.summary import validation_summary
from relay_api import dataset_credentials
from relay_api.db import Db, iso, rows_changed, utcnow
from relay_api.errors import APIProblem, not_found
from relay_api.event_rows import insert_event
from relay_api.idempotency import insert_once, request_hash
from relay_api.models import fine_tune_events, fine_tunes
from relay_api.pagination import newest_first
from relay_api.schemas import FineTuneOut
from relay_api.settings import Settings
from relay_api.tracker_credentials import keep_tracker_secrets
from relay_api.workers import LiveWorker, live_workers

log = logging.getLogger(__name__)

CONFIG_FIELDS: tuple[str, ...] = tuple(SFTConfig.model_fields)
JOB_ID_PREFIX = "ft-"
_OLD_JOBS_DEFAULTS: dict[str, Any] = {
    name: field.get_default(call_default_factory=True)  # integrations: []
    for name, field in SFTConfig.model_fields.items()
    if not field.is_required()
}


def new_job_id() -> str:
    return JOB_ID_PREFIX + secrets.token_hex(6)


def job_object(
    row: Mapping[str, Any], validation: Mapping[str, Any] | None = None, *, stored: bool = True
) -> dict[str, Any]:
    """A job as the API shows it (schemas.FineTuneOut, the one definition of its shape): its own
    attributes, then the config's fields. `validation`: its block (validation_blocks), if any.
    `stored`: a row read back, which may predate today's rules (_shown_despite them); False for a
    row about to be written, which must pass them."""
    config = row["config"]
    job = {
        "id": row["id"],
        "object": "fine_tune",
        "status": row["status"],
        "step": row["step"],
        "loss": row["loss"],
        "error": row["error"],
        "output_dir": row["output_dir"],
        "created_at": iso(row["created_at"]),
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
        "attempts": row["attempt"],
        "lease_lapsed_seconds": lease_lapsed_seconds(row),
        "dataset": row.get("dataset"),
        "weights": row.get("weights"),
        "validation": validation,
        # A field the stored config lacks (created before the field existed) shows its default,
        # which is what the job ran with.
        **{name: config[name] if name in config else _OLD_JOBS_DEFAULTS.get(name) for name in CONFIG_FIELDS},
    }
    try:
        return FineTuneOut.model_validate(job).model_dump(mode="json")
    except ValidationError as error:
        if not stored:
            raise
        return _shown_despite(job, error)


def _shown_despite(job: dict[str, Any], error: ValidationError) -> dict[str, Any]:
    """A stored job whose config today's rules refuse (a rule tightened after it was created: an
    eval.seed of 2**64 once passed): shown with each refused optional field as null, so that what a
    user created never makes their own list or job answer 500. The row itself is left as it is."""
    refused = {str(item["loc"][0]) for item in error.errors() if item.get("loc")}
    nullable = {
        name for name in refused if name in CONFIG_FIELDS and not FineTuneOut.model_fields[name].is_required()
    }
    if nullable != refused:
        raise error
    log.warning(
        "job %s: shown with %s as null (today's rules refuse them)", job["id"], ", ".join(sorted(refused))
    )
    return FineTuneOut.model_validate({**job, **dict.fromkeys(refused)}).model_dump(mode="json")


def lease_lapsed_seconds(row: Mapping[str, Any]) -> float | None:
    """For a running job whose worker stopped renewing its lease: how long ago the lease lapsed,
    whether or not a reconciler has handed the job on since (that clears `lease_until` and keeps
    `lease_lapsed_at` until a worker claims the job). A worker resumes such a job within a
    reconciler pass, so a number that keeps growing means no worker is alive to do it."""
    if row["status"] not in (st.RUNNING, st.CANCEL_REQUESTED):
        return None
    lapsed_at = row.get("lease_until") or row.get("lease_lapsed_at")
    if lapsed_at is None:
        return None
    lapsed = (utcnow() - lapsed_at).total_seconds()
    return round(lapsed, 1) if lapsed > 0 else None


def named_datasets(config: SFTConfig) -> list[tuple[str, str]]:
    """Each dataset the recipe reads and the field that names it: its dataset_name, or each of a
    mixture's ``datasets[i].name`` (relay.dataset_mixture)."""
    sources = recipe_datasets(config)
    if config.datasets is None:
        return [(sources[0].name, "dataset_name")]
    return [(source.name, f"datasets[{index}].name") for index, source in enumerate(sources)]


def check_datasets(config: SFTConfig, settings: Settings) -> None:
    """check_dataset for each dataset the recipe reads."""
    for name, param in named_datasets(config):
        check_dataset(name, settings, param)


def check_mixture(config: SFTConfig, settings: Settings) -> None:
    """Refuse a mixture whose datasets cannot share one model (state or action widths, frame rate:
    relay_engine.datasets.mixture's rule), where the API sees the workers' disk and the datasets are
    local: what their meta/info.json says. A Hub dataset's is the worker's to read: a mismatch then
    fails the job at its start, in the same words."""
    if config.datasets is None or not settings.api_shares_workers_disk:
        return
    shapes = [(source.name, _robot_shape(source.name)) for source in recipe_datasets(config)]
    first_name, first = shapes[0]
    for index, (name, shape) in enumerate(shapes[1:], start=1):
        if first is None or shape is None:
            continue
        for what, ours, theirs in zip(("state", "action"), first[:2], shape[:2], strict=True):
            if ours != theirs:
                raise APIProblem(
                    400,
                    f"bad datasets[{index}]: {name}'s {what} is {theirs} wide and {first_name}'s "
                    f"(datasets[0]) is {ours}: a mixture's datasets share their state and action widths",
                    param=f"datasets[{index}]",
                    code="invalid_value",
                )
        if first[2] != shape[2]:
            raise APIProblem(
                400,
                f"bad datasets[{index}]: {name} records at {shape[2]:g} fps and {first_name} (datasets[0]) "
                f"at {first[2]:g}: a mixture's datasets share their frame rate (an action chunk spans the "
                "same time in each)",
                param=f"datasets[{index}]",
                code="invalid_value",
            )


def _robot_shape(name: str) -> tuple[int, int, float] | None:
    """A local dataset's state width, action width and fps from its meta/info.json (None where it is
    not local or cannot be read: the worker's validation then says why)."""
    path = local_dataset_path(name) if names_local_directory(name) else None
    if path is None:
        return None
    try:
        info = json.loads((path / "meta" / "info.json").read_text(encoding="utf-8"))
        features = info["features"]
        return (
            int(features["observation.state"]["shape"][0]),
            int(features["action"]["shape"][0]),
            float(info["fps"]),
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError):
        return None


def check_dataset(name: str, settings: Settings, param: str = "dataset_name") -> None:
    """Refuse a dataset no worker can read: a local directory where the service reads none
    (RELAY_LOCAL_DATASETS=false), or one that is not there, where the API sees the workers' disk
    (RELAY_API_SHARES_WORKERS_DISK). Which names are local is relay.dataset_names' one rule."""
    if is_database_url(name):
        _check_database_url(name, settings)
        return
    if not names_local_directory(name):
        return
    if not settings.local_datasets:
        raise _bad_dataset(
            name,
            "this server does not read local directories; name a LeRobot dataset on the Hugging Face "
            "Hub, such as lerobot/pusht_image",
            param,
        )
    path = local_dataset_path(name)
    if settings.api_shares_workers_disk and path is not None and not path.exists():
        raise _bad_dataset(
            name, f"it names a local directory, and {path} does not exist on the workers' disk", param
        )


def check_checkpoint(
    db: Db, user_id: int, model: str, from_checkpoint: str | None, settings: Settings
) -> None:
    """Refuse a from_checkpoint no worker can start from, where the API can tell: a fine-tune that is
    not a completed job of the caller's, a local directory where the service reads none or, where the
    API shares the workers' disk, one that is not there; and a checkpoint of another architecture
    than `model` (relay.checkpoints' sentence), read from the parent job or the directory. A Hub
    repo is the worker's to fetch: a missing one (or revision) fails the job once, in one sentence."""
    if from_checkpoint is None:
        return
    source = parse_checkpoint(from_checkpoint)
    found: str | None = None
    if source.kind == "job":
        row = (
            db.execute(
                select(fine_tunes.c.status, fine_tunes.c.config).where(
                    fine_tunes.c.id == source.job, fine_tunes.c.user_id == user_id
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise _bad_checkpoint(from_checkpoint, "no fine-tune of yours has this id")
        if row["status"] != st.COMPLETED:
            raise _bad_checkpoint(
                from_checkpoint,
                f"that fine-tune is {row['status']}; training starts from a completed job's weights",
            )
        found = str(row["config"].get("model"))
    elif source.kind == "directory":
        assert source.path is not None
        if not settings.local_datasets:
            raise _bad_checkpoint(
                from_checkpoint,
                "this server does not read local directories; name a Hub model repo or a completed "
                "fine-tune's id",
            )
        if not settings.api_shares_workers_disk:
            return
        if not source.path.is_dir():
            raise _bad_checkpoint(from_checkpoint, f"{source.path} is not a directory on the workers' disk")
        found = checkpoint_model(source.path)
    if found is not None and found != model:
        raise APIProblem(
            400,
            architecture_mismatch(model, found, from_checkpoint),
            param="from_checkpoint",
            code="invalid_value",
        )


def _bad_checkpoint(value: str, rule: str) -> APIProblem:
    return APIProblem(
        400,
        f"bad from_checkpoint: {json.dumps(value)} ({rule})",
        param="from_checkpoint",
        code="invalid_value",
    )


def check_eval_budget(config: SFTConfig, settings: Settings) -> None:
    """The eval block's budget at the cadence this service checkpoints at (RELAY_CHECKPOINT_EVERY;
    SFTConfig checked it at the default): relay.env_evaluation's one rule."""
    try:
        check_job_eval_budget(config.eval, config.steps, settings.checkpoint_every)
    except ConfigError as error:
        raise APIProblem(400, error.message, param=error.param, code=error.code) from None


def check_tasks_dir(tasks_dir: str | None, settings: Settings) -> None:
    """An RT-J job's tasks_dir is a directory on the workers' disk (SFTConfig: an absolute path):
    refused where the service reads no local directories, and where the API shares the workers'
    disk, when it is not there."""
    if tasks_dir is None:
        return
    if not settings.local_datasets:
        raise _bad_tasks_dir(tasks_dir, "this server does not read local directories")
    if not settings.api_shares_workers_disk:
        return
    try:  # (~nobody, or text no file system names: no directory either)
        there = Path(tasks_dir).expanduser().is_dir()
    except (RuntimeError, ValueError, OSError):
        there = False
    if not there:
        raise _bad_tasks_dir(tasks_dir, "it is not a directory on the workers' disk")


def _bad_tasks_dir(tasks_dir: str, rule: str) -> APIProblem:
    return APIProblem(
        400, f"bad tasks_dir: {json.dumps(tasks_dir)} ({rule})", param="tasks_dir", code="invalid_value"
    )


def _check_database_url(name: str, settings: Settings) -> None:
    """A SQLite file is a local dataset: refused where the service reads none, and it must be named
    by an absolute path (a relative one would mean the worker's working directory). A server's URL
    (postgresql://...) is the worker's to reach; it says at the job's start if it cannot."""
    url = make_url(name)
    if url.get_backend_name() != "sqlite":
        return
    shown = dataset_credentials.masked(name)[0]
    if not settings.local_datasets:
        raise _bad_dataset(shown, "this server does not read local files; a SQLite database is one")
    path = Path(url.database or "")
    if not url.database or url.database == ":memory:" or not path.is_absolute():
        raise _bad_dataset(
            shown, "a SQLite database of a job must be named by its absolute path: sqlite:////data/shop.db"
        )
    if settings.api_shares_workers_disk and not path.is_file():
        raise _bad_dataset(shown, f"{path} does not exist on the workers' disk")


def check_video_codecs(
    name: str, settings: Settings, workers: list[LiveWorker], param: str = "dataset_name"
) -> None:
    """Refuse a local dataset with a video camera whose codec (meta/info.json's `video.codec`) no
    live worker decodes, where the API sees the workers' disk; before any GPU time is spent. With
    no live worker, or one that has not said what it decodes, nothing is known and nothing refused."""
    path = local_dataset_path(name) if names_local_directory(name) else None
    if path is None or not settings.api_shares_workers_disk or not workers:
        return
    told = [worker.video_decoders for worker in workers]
    readable = frozenset().union(*(decoders for decoders in told if decoders is not None))
    if any(decoders is None for decoders in told):
        return
    for camera, codec in video_codecs(path).items():
        if codec not in readable:
            raise _bad_dataset(
                name,
                f"camera {camera} is stored as {codec} video, which no live worker can decode; "
                "re-encode it as av1, h264 or hevc (the codecs lerobot writes)",
                param,
            )


def video_codecs(root: Path) -> dict[str, str]:
    """Each video camera's codec as the dataset's meta/info.json names it (none if it cannot be read:
    the worker's validation then says why)."""
    try:
        features = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))["features"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return {}
    codecs = {}
    for camera, feature in features.items() if isinstance(features, dict) else ():
        if not isinstance(feature, dict) or feature.get("dtype") != "video":
            continue
        info = feature.get("info") or feature.get("video_info") or {}
        codec = info.get("video.codec") if isinstance(info, dict) else None
        if isinstance(codec, str) and codec:
            codecs[camera] = codec
    return codecs


def _bad_dataset(name: str, rule: str, param: str = "dataset_name") -> APIProblem:
    return APIProblem(400, f"bad {param}: {json.dumps(name)} ({rule})", param=param, code="invalid_value")


def gpu_count(number: int) -> str:
    """A count of GPUs in words, as the messages give it: 1 GPU, 4 GPUs (slots count as GPUs)."""
    return f"{number} GPU" if number == 1 else f"{number} GPUs"


def place_on_workers(
    db: Db, config: SFTConfig, settings: Settings, *, cpu_full_size: bool = False
) -> SFTConfig:
    """Fill in `gpus` where the service chooses it, and refuse a job no worker could ever run.

    A full fine-tune without `gpus` gets all the GPUs of the largest live worker (1 when none is
    alive yet). A job of more GPUs than one worker has spans several (a gang); one asking for more
    than all live workers have together is refused, naming `gpus`; so is one whose memory plan
    does not fit enough of the live workers' GPUs (check_memory; `cpu_full_size` is
    RELAY_ALLOW_CPU_FULL_SIZE), and so is a dataset whose video codec none decodes
    (check_video_codecs). With no live worker nothing is known, so nothing is refused: the job
    waits for workers.
    """
    workers = live_workers(db, settings.reconcile_seconds)
    for name, param in named_datasets(config):
        check_video_codecs(name, settings, workers, param)
    if config.gpus is None:
        largest = max((w.gpus for w in workers), default=1)
        config = config.model_copy(update={"gpus": min(largest, config.batch_size)})
    else:
        check_gpus(config.gpus, workers)
    check_memory(config, workers, cpu_full_size=cpu_full_size, cpu_workers_only=settings.cpu_workers_only)
    return config


def check_gpus(gpus: int, workers: list[LiveWorker]) -> None:
    """Refuse a job of more GPUs than all live workers have together (with none alive, nothing is
    known: the job waits)."""
    total = sum(w.gpus for w in workers)
    if workers and gpus > total:
        largest = max(w.gpus for w in workers)
        raise APIProblem(
            400,
            f"bad gpus: {gpus} (must be at most the {gpu_count(total)} of all live workers "
            f"together, per their heartbeats; the largest worker has {largest})",
            param="gpus",
            code="no_worker_fits",
        )


def check_memory(
    config: SFTConfig,
    workers: list[LiveWorker],
    *,
    cpu_full_size: bool = False,
    cpu_workers_only: bool = False,
) -> None:
    """Refuse a job whose memory plan (relay.memory_plan) the live workers' GPUs cannot hold.

    Each of the job's `gpus` processes holds the plan's per-GPU bytes, whichever hosts run it: one
    worker with enough slots, or a gang of several. So the job fits when the workers whose GPUs
    hold the plan have its `gpus` together. Workers with CPU slots (no GPU memory reported) hold
    anything but a model sized for GPUs (relay.families.is_gpu_sized; unless `cpu_full_size`), and
    run the job when they have its `gpus` together; their slots are not added to GPUs (a cluster
    of both kinds is a test's, and the other workers' beats then decide nothing here). The error
    names the field to change: `gpus` when more GPUs would share it (or fewer would fit on the
    GPUs large enough), else `batch_size` when a smaller batch would, else `finetune` when LoRA
    would, else `model` (always `model` when only CPU workers are alive). `cpu_workers_only`
    (RELAY_CPU_WORKERS_ONLY, which `relay server` sets on a machine without a GPU) says so before
    any worker has beaten: a job created in the server's first seconds is refused as well."""
    gpus = config.gpus or 1
    cpus_take_it = cpu_full_size or not families.is_gpu_sized(config.model)
    if cpus_take_it and sum(w.gpus for w in workers if w.gpu_memory is None) >= gpus:
        return
    if cpu_workers_only and not cpus_take_it:
        raise _too_big_for_cpus(config, known_before_beats=True)
    cpu_only = bool(workers) and all(w.gpu_memory is None for w in workers)
    if cpu_only and not cpus_take_it:
        raise _too_big_for_cpus(config)
    gpu_workers = [w for w in workers if w.gpu_memory is not None]
    if not gpu_workers:
        return
    fit = _GpuFit(config, gpu_workers)
    planned = fit.plan(config.batch_size, gpus, config.finetune)
    if fit.fits(planned, gpus):
        return
    assert planned is not None
    field, value, rule = _setting_to_change(fit, gpus)
    raise APIProblem(
        400,
        f"bad {field}: {json.dumps(value)} (the job's memory plan does not fit the live workers' GPUs: "
        f"{fit.shortfall(planned, gpus)}; {rule})",
        param=field,
        code="no_worker_fits",
    )


@dataclass(frozen=True)
class _GpuFit:
    """The memory plans of one job's settings, against the live workers that report GPU memory."""

    config: SFTConfig
    workers: list[LiveWorker]

    def plan(self, batch_size: int, processes: int, finetune: str) -> MemoryPlan | None:
        """The job's memory plan with these settings changed (None for a model without one)."""
        return plan_named(
            self.config.model,
            finetune=finetune,
            targets=self.config.targets,
            lora_rank=self.config.lora_rank,
            batch_size=batch_size,
            gpus=processes,
        )

    def slots_holding(self, candidate: MemoryPlan) -> int:
        """How many of the workers' GPUs are each large enough for the plan."""
        return sum(
            w.gpus for w in self.workers if w.gpu_memory is not None and candidate.total <= w.gpu_memory
        )

    def fits(self, candidate: MemoryPlan | None, processes: int) -> bool:
        """Whether enough GPUs hold the plan for its processes (no plan: nothing is refused)."""
        return candidate is None or self.slots_holding(candidate) >= processes

    def fits_on(self, processes: int) -> bool:
        """Whether the job as it is fits when spread over `processes` GPUs."""
        return self.fits(self.plan(self.config.batch_size, processes, self.config.finetune), processes)

    def shortfall(self, planned: MemoryPlan, gpus: int) -> str | None:
        """What the refused plan lacks, in words (gpu_shortfall is None only for a plan that fits)."""
        holding = self.slots_holding(planned)
        # Either no GPU is large enough, or too few are for the job's processes (a gang).
        if holding == 0:
            return gpu_shortfall(planned, max(w.gpu_memory or 0 for w in self.workers))
        return (
            f"needs about {planned.total / GB:.0f} GB on each of its {gpu_count(gpus)}; "
            f"the live workers have {gpu_count(holding)} that large"
        )


def _setting_to_change(fit: _GpuFit, gpus: int) -> tuple[str, int | str, str]:
    """The field a refused job should change, its value and why: the first of `gpus`, `batch_size`,
    `finetune` and `model` whose change would make the plan fit."""
    config = fit.config
    most = min(sum(w.gpus for w in fit.workers), config.batch_size)
    spec = families.family_of(config.model)
    if spec is not None and spec.max_gpus is not None:
        most = min(most, spec.max_gpus)  # SmolVLA's one process is never told to spread out
    if any(fit.fits_on(n) for n in range(gpus + 1, most + 1)):
        return "gpus", gpus, "more GPUs would share it"
    # Fewer processes need more memory each, but may then be few enough for the GPUs that hold it.
    fewer = next((n for n in range(gpus - 1, 0, -1) if fit.fits_on(n)), None)
    if fewer is not None:
        return "gpus", gpus, f"{gpu_count(fewer)} would fit, on the GPUs large enough"
    if fit.fits(fit.plan(gpus, gpus, config.finetune), gpus):
        return "batch_size", config.batch_size, "a smaller batch would fit"
    if config.finetune == "full" and fit.fits(fit.plan(gpus, gpus, "lora"), gpus):
        return "finetune", config.finetune, "LoRA would fit"
    return "model", config.model, "no setting of this model fits"


def _too_big_for_cpus(config: SFTConfig, *, known_before_beats: bool = False) -> APIProblem:
    """The refusal of a job of a model sized for GPUs when every live worker trains on its CPU."""
    return too_big_for_cpus(
        config.model, "model", plan_of_recipe(config, device="cpu"), known_before_beats=known_before_beats
    )


def too_big_for_cpus(
    model: str, param: str, planned: MemoryPlan | None = None, *, known_before_beats: bool = False
) -> APIProblem:
    """The refusal of `model` (the field `param`) when every live worker trains on its CPU (or,
    `known_before_beats`, the service says its workers do: RELAY_CPU_WORKERS_ONLY)."""
    where = (
        "this service's workers train on their CPUs"
        if known_before_beats
        else "every live worker trains on its CPU"
    )
    return APIProblem(
        400,
        f"bad {param}: {json.dumps(model)} ({cpu_refusal(model, planned, where)})",
        param=param,
        code="no_worker_fits",
    )


def check_session_model(db: Db, model: str, settings: Settings) -> None:
    """Refuse a session of a model sized for GPUs while every live worker trains on its CPU (the
    rule of check_memory; a session has no batch to plan for)."""
    if settings.allow_cpu_full_size or not families.is_gpu_sized(model):
        return
    if settings.cpu_workers_only:
        raise too_big_for_cpus(model, "base_model", known_before_beats=True)
    workers = live_workers(db, settings.reconcile_seconds)
    if workers and all(w.gpu_memory is None for w in workers):
        raise too_big_for_cpus(model, "base_model")


def create(
    db: Db, user_id: int, config: SFTConfig, idempotency_key: str | None
) -> tuple[dict[str, Any], bool]:
    """Insert a queued job and commit; returns (row, replayed): see create_shown."""
    row, replayed, _ = create_shown(db, user_id, config, idempotency_key)
    return row, replayed


def create_shown(
    db: Db, user_id: int, config: SFTConfig, idempotency_key: str | None
) -> tuple[dict[str, Any], bool, dict[str, Any]]:
    """Insert a queued job and commit; returns (row, replayed, the job as the API shows it). A new
    job's answer is the one built to check it before its row was written (job_object of the row,
    which it stays): built once, not again for the response. The same Idempotency-Key with the
    same config returns the job it created before; with a different config, 409. A database URL's
    password is not stored with the job: the job holds the URL masked, and the password waits in
    its own row for the job's snapshot (relay_api.dataset_credentials); nor are the keys given with
    its integrations, which wait in theirs for its attempts (relay_api.tracker_credentials)."""
    secret = None
    if is_database_url(config.dataset_name):
        stored, secret = dataset_credentials.masked(config.dataset_name)
        config = config.model_copy(update={"dataset_name": stored})
    keys = tracker_secrets(config.integrations)
    if keys:
        config = config.model_copy(update={"integrations": without_secrets(config.integrations)})
    digest = request_hash(config)

    def keep_secret(db: Db, row: dict[str, Any]) -> None:
        if secret is not None:
            dataset_credentials.keep_secret_url(db, row["id"], secret)
        keep_tracker_secrets(db, row["id"], keys)

    def new_row() -> dict[str, Any]:
        now = utcnow()
        return {
            "id": new_job_id(),
            "user_id": user_id,
            "config": config.model_dump(mode="json"),
            "status": st.QUEUED,
            "step": 0,
            "loss": None,
            "error": None,
            "output_dir": None,
            "files": None,
            "attempt": 0,
            "handovers": 0,
            "lease_until": None,
            "lease_lapsed_at": None,
            "lease_owner": None,
            "last_failure": None,
            "enqueued_at": None,
            "idempotency_key": idempotency_key,
            "request_hash": digest,
            "created_at": now,
            "updated_at": now,
            "started_at": None,
            "finished_at": None,
            "cancel_requested_at": None,
        }

    def shown(row: dict[str, Any]) -> dict[str, Any]:
        return job_object(row, stored=False)

    row, replayed, answer = insert_once(
        db, fine_tunes, user_id, idempotency_key, digest, new_row, "fine-tune", shown, keep_secret
    )
    return row, replayed, job_object(row) if answer is None else answer


def mark_enqueued(db: Session, job_ids: str | list[str]) -> None:
    """Note that these jobs' messages reached the broker (see relay_api.enqueued)."""
    ids = [job_ids] if isinstance(job_ids, str) else job_ids
    if db.get_bind().dialect.name == "postgresql":
        # Losing this note in a crash only means the reconciler publishes the job again, so it need
        # not wait for the disk (the job's own row did).
        db.execute(text("SET LOCAL synchronous_commit = off"))
    db.execute(
        update(fine_tunes)
        .where(fine_tunes.c.id.in_(ids), fine_tunes.c.enqueued_at.is_(None))
        .values(enqueued_at=utcnow())
    )
    db.commit()


# The statements of the busiest routes are built once, with their values bound at execution:
# SQLAlchemy memoizes a statement's cache key, so a request skips building the expression and
# hashing it (a fifth of a short read's CPU).
_CALLERS_JOB = select(fine_tunes).where(
    fine_tunes.c.id == bindparam("job_id"), fine_tunes.c.user_id == bindparam("user_id")
)
# The columns job_object reads: retrieve and list convert no others (a job row has 23).
SHOWN_COLUMNS = tuple(
    fine_tunes.c[name]
    for name in (
        "id",
        "status",
        "step",
        "loss",
        "error",
        "output_dir",
        "created_at",
        "started_at",
        "finished_at",
        "attempt",
        "lease_until",
        "lease_lapsed_at",
        "config",
        "dataset",
        "weights",
    )
)
_CALLERS_JOB_SHOWN = _CALLERS_JOB.with_only_columns(*SHOWN_COLUMNS)
# Their column names, for dicts built by zip rather than through a row mapping (see events_page).
_JOB_KEYS = tuple(_CALLERS_JOB.selected_columns.keys())
_SHOWN_KEYS = tuple(_CALLERS_JOB_SHOWN.selected_columns.keys())
# The columns event_object reads: a page of 100 events converts no others.
_EVENT_COLUMNS = tuple(fine_tune_events.c[name] for name in ("id", "created_at", "step", "kind", "data"))
_EVENT_KEYS = tuple(column.name for column in _EVENT_COLUMNS)
_CALLERS_EVENTS = (
    select(*_EVENT_COLUMNS)
    .where(
        fine_tune_events.c.job_id == bindparam("job_id"),
        fine_tune_events.c.id > bindparam("after"),
        select(fine_tunes.c.id)
        .where(fine_tunes.c.id == bindparam("job_id"), fine_tunes.c.user_id == bindparam("user_id"))
        .exists(),
    )
    .order_by(fine_tune_events.c.id)
    .limit(bindparam("limit"))
)


# A job's validation scores, oldest first: validation_blocks reads them for the jobs that have a split.
_VALIDATION_SCORES = (
    select(fine_tune_events.c.job_id, fine_tune_events.c.step, fine_tune_events.c.data)
    .where(
        fine_tune_events.c.job_id.in_(bindparam("job_ids", expanding=True)),
        fine_tune_events.c.kind == ValidationEvent.kind,
    )
    .order_by(fine_tune_events.c.job_id, fine_tune_events.c.id)  # as the summary reads them
)


def validation_blocks(db: Db, rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `validation` block of each job of `rows` that has been scored (relay.sft.summary's
    validation_summary, as the job's results card has it). One query, and none when no job of
    `rows` has validation_episodes."""
    job_ids = [row["id"] for row in rows if (row["config"] or {}).get("validation_episodes") is not None]
    if not job_ids:
        return {}
    scorings: dict[str, list[dict[str, Any]]] = {}
    for job_id, step, data in db.execute(_VALIDATION_SCORES, {"job_ids": job_ids}):
        scorings.setdefault(job_id, []).append({**data, "step": step})
    _end_read(db)
    return {
        job_id: block.model_dump(mode="json")
        for job_id, scored in scorings.items()
        if (block := validation_summary(scored)) is not None
    }


def get(db: Db, user_id: int, job_id: str, shown_only: bool = False) -> dict[str, Any]:
    """The caller's job `job_id` (only its SHOWN_COLUMNS if `shown_only`); another user's job is as
    absent as a job that never existed."""
    query, keys = (_CALLERS_JOB_SHOWN, _SHOWN_KEYS) if shown_only else (_CALLERS_JOB, _JOB_KEYS)
    row = db.execute(query, {"job_id": job_id, "user_id": user_id}).first()
    _end_read(db)
    if row is None:
        raise not_found(job_id)
    return dict(zip(keys, row, strict=True))


def _end_read(db: Db) -> None:
    # End a read's transaction here, in the route's thread, so its connection goes back to the pool
    # before the response is sent (and the request's teardown has no round trip to make).
    db.rollback()


def list_page(db: Db, user_id: int, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The caller's jobs, newest first, starting after the job `after`; and whether more follow."""
    return newest_first(db, fine_tunes, user_id, after, limit, "fine-tunes", SHOWN_COLUMNS)


def events_page(
    db: Db, user_id: int, job_id: str, after: int | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """The caller's job's events after event id `after`, oldest first; and whether more follow.

    One round trip when there are events: the ownership check rides in the same statement. Only an
    empty page looks the job up on its own, to tell "none yet" from "no such job" (a 404)."""
    values = {
        "job_id": job_id,
        "user_id": user_id,
        "after": 0 if after is None else after,  # event ids start at 1
        "limit": limit + 1,
    }
    rows = db.execute(_CALLERS_EVENTS, values).all()
    _end_read(db)
    if not rows:
        get(db, user_id, job_id)
    # zip: a tenth of the CPU of Row._asdict, which builds a key view per row
    return [dict(zip(_EVENT_KEYS, row, strict=True)) for row in rows[:limit]], len(rows) > limit


def cancel(db: Session, user_id: int, job_id: str) -> dict[str, Any]:
    """Cancel: a queued job ends `cancelled` now; a running one becomes `cancel_requested` and its
    worker stops it at the next step. Asking again is harmless; a completed or failed job is 409."""
    for _ in range(5):
        row = get(db, user_id, job_id)
        now = utcnow()
        if row["status"] in (st.CANCEL_REQUESTED, st.CANCELLED):
            return row
        if row["status"] in st.TERMINAL:
            raise APIProblem(
                409,
                f"fine-tune {job_id} is already {row['status']}; "
                "only a queued or running job can be cancelled",
                param="id",
                code="job_finished",
            )
        if row["status"] == st.QUEUED:
            moved = rows_changed(
                db.execute(
                    update(fine_tunes)
                    .where(fine_tunes.c.id == job_id, fine_tunes.c.status == st.QUEUED)
                    .values(status=st.CANCELLED, cancel_requested_at=now, finished_at=now, updated_at=now)
                )
            )
            if moved:
                insert_event(db, job_id, CancelledEvent(step=row["step"]), row["attempt"], now)
        else:  # running
            moved = rows_changed(
                db.execute(
                    update(fine_tunes)
                    .where(fine_tunes.c.id == job_id, fine_tunes.c.status == st.RUNNING)
                    .values(status=st.CANCEL_REQUESTED, cancel_requested_at=now, updated_at=now)
                )
            )
        db.commit()
        if moved:
            return get(db, user_id, job_id)
        # A worker moved the job meanwhile (claimed or finished it): look again.
    raise APIProblem(409, f"fine-tune {job_id} kept changing; try again", param="id", code="conflict")
