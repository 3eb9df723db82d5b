"""A recipe job: the engine's loop driven by an SFTConfig.

A Recipe is a validated SFTConfig (the user's settings, their rules and defaults declared there
once) plus the engine's own settings that a job's user does not choose.

`run_recipe` runs a recipe of any model family (relay_engine.families): the family opens its data
and builds its model and learner (`Family.prepare_recipe`); this driver alone resumes from the work
directory's last complete checkpoint if there is one, keeps the seeded batch order, runs the fixed
schedule, checkpoints (scoring the family's validation split after each, where the recipe has
one), and has the family write its output. It is what a worker runs for
`POST /v1/fine-tunes` and what `relay local train` runs on a laptop.

Under torch.distributed.run (`relay local train --nproc-per-node N`, or a worker's launcher) a
family that runs on many processes (pi05) runs as one process of a group: each process reads its
part of every global batch, the model trains under DDP or FSDP (pi05's wrapping:
relay_engine.families.pi05.parallel), the ranks agree through relay_engine.core.group, and rank 0
alone reports events and writes the output.

Work directory layout:
    checkpoints/step-00001000/ ...   complete checkpoints, and `latest` naming the newest
    output/                          once completed: the family's output (pi05: model.safetensors
                                     with adapters merged, config.json, norm_stats.json)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from relay import families
from relay.catalog import ACTION_HORIZON
from relay.env_evaluation import check_job_eval_budget
from relay.events import (
    METRICS_EVERY,
    CheckpointEvent,
    Event,
    RecipeResult,
    ResumedEvent,
    StageEvent,
    TrackerEvent,
)
from relay.memory_plan import cpu_refusal, plan_of_recipe
from relay.sft.config import CHECKPOINT_EVERY_DEFAULT, SFTConfig
from relay_engine.core.checkpoint import CheckpointStore
from relay_engine.core.data import BatchOrder, DataPosition
from relay_engine.core.group import join, launched, leave
from relay_engine.core.loop import LoopResult, LoopState, MetricsWindow, run_loop
from relay_engine.core.schedule import learning_rate
from relay_engine.errors import ConfigError, DiskFullError
from relay_engine.families import Family, PreparedRecipe, RecipeRun, family_for
from relay_engine.trackers import NO_TRACKERS, Trackers, check_installed, open_trackers

LOG_EVERY = METRICS_EVERY
# SFTConfig's fields when checkpoints began to carry a recipe's fingerprint (name aside).
FINGERPRINTED_FIELDS = frozenset(
    {"model", "dataset_name", "batch_size", "learning_rate", "steps", "finetune", "lora_rank"}
    | {"lora_alpha", "targets", "cameras"}
)


@dataclass(frozen=True)
class Recipe:
    """The user's validated recipe and the engine's settings that are not the user's to choose in a job."""

    config: SFTConfig
    action_horizon: int = ACTION_HORIZON
    checkpoint_every: int = CHECKPOINT_EVERY_DEFAULT
    log_every: int = LOG_EVERY
    seed: int = 0
    # Which episodes to train on (None: all); `relay local train --episodes` keeps some back.
    episodes: list[int] | None = None
    num_workers: int | None = None  # data-loading processes; None: 0 on the CPU, more on a GPU
    device: str = "auto"
    # How a run of many processes shares the model: auto (FSDP for full, DDP for LoRA), ddp or fsdp.
    strategy: str = "auto"
    # The service job's attempt (its fencing token; 0 for a local run). It names this run's temporary
    # checkpoint directories, so that an older attempt's tidying never removes this one's writes.
    attempt: int = 0
    # The output directory of the fine-tune a job id in from_checkpoint names: the service's to know
    # (the worker resolves it); a local run has none, and refuses a job id.
    checkpoint_output: str | None = None
    # The service job's id (None for a local run): the trackers' run is named by it, so that every
    # attempt of the job continues one run (relay_engine.trackers).
    job_id: str | None = None

    def __post_init__(self) -> None:
        # The eval block's budget at the cadence this run checkpoints at (SFTConfig checked the default).
        check_job_eval_budget(self.config.eval, self.config.steps, self.checkpoint_every)

    @classmethod
    def from_config(cls, config: SFTConfig | Mapping[str, Any], **engine_settings: Any) -> Recipe:
        """From an SFTConfig, or the fields of one (a stored job's config), validated here.

        Raises ConfigError naming the field and the rule if they break one."""
        checked = config if isinstance(config, SFTConfig) else SFTConfig.parse(config)
        return cls(checked, **engine_settings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for another process: the config's fields under "config", then the engine's."""
        engine = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}
        return {"config": self.config.model_dump(mode="json"), **engine}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """The inverse of to_dict (the config validated again)."""
        settings = dict(data)
        return cls.from_config(settings.pop("config"), **settings)

    def fingerprint(self) -> str:
        """What must not change between a checkpoint and a resume: the recipe but its name, and the
        engine settings that shape training. Where it runs, how often it reports, and how many
        processes run it and share the model may change (checkpoints reshard)."""
        # The trackers (integrations) watch the run and do not shape it: a resume may change them.
        recipe = self.config.model_dump(exclude={"name", "gpus", "integrations"})
        fixed = {
            # Fields added to SFTConfig since checkpoints carried a fingerprint count only when set
            # away from their default, so that those checkpoints still resume.
            **{k: v for k, v in recipe.items() if k in FINGERPRINTED_FIELDS or v != SFTConfig.default(k)},
            "action_horizon": self.action_horizon,
            "checkpoint_every": self.checkpoint_every,
            "seed": self.seed,
            "episodes": self.episodes,
        }
        return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def pick_device(name: str) -> torch.device:
    """`auto` (a GPU where PyTorch sees one, else the CPU), `cpu` or `cuda` (`cuda:N`). Asking for
    a GPU PyTorch cannot use is one sentence, not a traceback from deep inside the first copy."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"bad device: {name!r} (must be auto, cpu or cuda)", param="device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ConfigError(
            f"bad device: {name} (no CUDA GPU is available to PyTorch here: torch {torch.__version__} is "
            f"{build}{'' if torch.version.cuda is None else ' and finds no GPU or driver'}; use auto or cpu)",
            param="device",
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"bad device: {name} (this machine has {torch.cuda.device_count()} CUDA GPUs)", param="device"
        )
    return device


# The permission the service's workers read (relay_api.settings: allow_cpu_full_size), asked by
# every run, so that the local trainer and a worker agree on what a CPU may train.
ALLOW_CPU_FULL_SIZE = "RELAY_ALLOW_CPU_FULL_SIZE"


def check_cpu_full_size(config: SFTConfig, device: torch.device) -> None:
    """Refuse a model sized for GPUs (pi05, 3.35 B weights) on the CPU unless
    RELAY_ALLOW_CPU_FULL_SIZE=true: a step there takes about a minute and the run most of the
    machine's memory, which should be chosen, not stumbled into (the message gives the plan)."""
    allowed = os.environ.get(ALLOW_CPU_FULL_SIZE, "").strip().lower() in ("1", "true", "yes", "on")
    if device.type != "cpu" or allowed or not families.is_gpu_sized(config.model):
        return
    planned = plan_of_recipe(config, device="cpu")
    raise ConfigError(
        f"bad model: {config.model!r} ({cpu_refusal(config.model, planned, 'this run is on the CPU')})",
        param="model",
    )


def run_recipe(
    recipe: Recipe,
    work_dir: Path,
    *,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    dataset_cache_dir: Path | None = None,
    output_dir: Path | None = None,
    checkpoint_on_stop: bool = False,
    tracker_secrets: Mapping[str, str] | None = None,
) -> RecipeResult:
    """Run the recipe here; under torch.distributed.run, as this process's part of the group.

    A resumed run first reports `{"step": N, "event": "resumed"}`. With `checkpoint_on_stop`, a
    run stopped by `should_stop` saves a checkpoint at the step it reached (a local run's
    Ctrl-C), so that the same command again loses nothing. `tracker_secrets`: the keys the service
    held for the job's trackers, by environment variable (relay.integrations.tracker_secrets), in
    place of this process's environment."""
    family = family_for(recipe.config.model)
    work_dir = Path(work_dir)
    output = Path(output_dir) if output_dir is not None else work_dir / "output"
    callbacks = _Callbacks(on_event, should_stop, checkpoint_on_stop)
    if family.spec.one_process or not launched():
        device = pick_device(recipe.device)
        check_cpu_full_size(recipe.config, device)
        run = RecipeRun(recipe, work_dir, device, None, dataset_cache_dir, dict(tracker_secrets or {}))
        return _run(family, run, output, callbacks)
    # A caller that joined the group itself (to run several recipes in one launch) keeps it.
    joined_here = not torch.distributed.is_initialized()
    world = join(recipe.device)
    try:
        check_cpu_full_size(recipe.config, world.device)
        run = RecipeRun(recipe, work_dir, world.device, world, dataset_cache_dir, dict(tracker_secrets or {}))
        return _run(family, run, output, callbacks)
    finally:
        if joined_here:
            leave()


@dataclass(frozen=True)
class _Callbacks:
    """The caller's side of a run: where events go, when to stop, and whether a stop checkpoints."""

    on_event: Callable[[Event], None]
    should_stop: Callable[[], bool]
    checkpoint_on_stop: bool


def _run(family: Family, run: RecipeRun, output_dir: Path, callbacks: _Callbacks) -> RecipeResult:
    # Before anything loads: a tracker whose library this machine lacks ends the run in words.
    check_installed(run.recipe.config)
    with family.recipe_context(run):
        prepared = family.prepare_recipe(run)
        store = CheckpointStore(run.work_dir / "checkpoints", attempt=run.recipe.attempt)
        state, position = _resume(run, prepared, store)
        resumed_from = state.step if position is not None else None
        trackers = _open_trackers(run, resumed_from)
        training = _Training(run, prepared, store, position or DataPosition(), callbacks, trackers)
        result: RecipeResult | None = None
        try:
            result = _train(run, prepared, training, state, resumed_from, output_dir)
            return result
        finally:
            # Bounded: a tracker that is down costs the run at most flush_seconds() here.
            warnings = trackers.finish(result)
            # After a failure, its error is the one raised: a warning that cannot be reported goes.
            with contextlib.suppress(Exception) if result is None else contextlib.nullcontext():
                training.report_warnings(warnings)


def _open_trackers(run: RecipeRun, resumed_from: int | None) -> Trackers:
    """Rank 0's trackers of the recipe's integrations (the other ranks log nothing)."""
    if run.rank != 0:
        return NO_TRACKERS
    recipe = run.recipe
    return open_trackers(
        recipe.config,
        run.work_dir,
        resumed_from=resumed_from,
        job_id=recipe.job_id,
        attempt=recipe.attempt,
        engine_settings={"checkpoint_every": recipe.checkpoint_every, "seed": recipe.seed},
        secrets=run.tracker_secrets,
    )


def _train(
    run: RecipeRun,
    prepared: PreparedRecipe,
    training: _Training,
    state: LoopState,
    resumed_from: int | None,
    output_dir: Path,
) -> RecipeResult:
    if prepared.data_read is not None:
        training.report(prepared.data_read(state.step))
    if prepared.weights_read is not None:
        training.report(prepared.weights_read(state.step))
    if resumed_from is not None:
        training.report(ResumedEvent.of_attempt(resumed_from, run.recipe.attempt))
    result = training.loop(state)
    if result.status != "completed":
        training.checkpoint_the_stop(state)
        return RecipeResult(result.status, result.step, result.loss, None, resumed_from)
    training.report(StageEvent(step=result.step, stage="writing"))
    _write_output(prepared, output_dir)
    evaluated = training.evaluate_the_end(result.step)
    if prepared.parallel is not None:
        prepared.parallel.barrier()  # the output is whole before any process reports completion
    if not evaluated:  # stopped (a cancel) while it evaluated the trained policy
        return RecipeResult("stopped", result.step, result.loss, None, resumed_from)
    return RecipeResult("completed", result.step, result.loss, output_dir, resumed_from, extra=prepared.extra)


def _write_output(prepared: PreparedRecipe, output_dir: Path) -> None:
    """The family's output writer; a disk that fills while it writes (the run's largest write: 13.9
    GB for pi05) ends the run in words, as a full disk at a checkpoint does (DiskFullError: a
    worker ends the job at once, where an OSError would be retried on the same disk). The writers
    leave no partial output."""
    try:
        prepared.write_output(output_dir)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        existing = next(path for path in (output_dir, *output_dir.parents) if path.exists())
        free = shutil.disk_usage(existing).free
        raise DiskFullError(
            f"no space left on device at {output_dir}: the disk filled up while writing the trained "
            f"model ({free / (1 << 30):.2f} GB free); the same disk would fail the same way, so free "
            "some space and run the job again"
        ) from None


def _resume(
    run: RecipeRun, prepared: PreparedRecipe, store: CheckpointStore
) -> tuple[LoopState, DataPosition | None]:
    """The loop state and data position of the last complete checkpoint, loaded into the learner;
    a fresh state and no position when there is none. A different recipe's checkpoints are refused."""
    latest = store.latest()
    if latest is None:
        return LoopState(), None
    manifest = store.manifest(latest)
    if manifest.get("recipe") != run.recipe.fingerprint():
        raise ConfigError(f"{run.work_dir} holds checkpoints of a different recipe; use a new directory")
    prepared.load_checkpoint(latest)
    state = LoopState(
        step=int(manifest["step"]),
        window=MetricsWindow.from_dict(manifest["window"]),
        last_loss=manifest.get("loss"),
    )
    return state, DataPosition.from_dict(manifest["data_position"])


class _Training:
    """The loop of one run: the seeded batch order from its position, checkpoints and events."""

    def __init__(
        self,
        run: RecipeRun,
        prepared: PreparedRecipe,
        store: CheckpointStore,
        position: DataPosition,
        callbacks: _Callbacks,
        trackers: Trackers = NO_TRACKERS,
    ) -> None:
        self.run, self.prepared, self.store, self.callbacks = run, prepared, store, callbacks
        self.trackers = trackers
        self.order = BatchOrder(
            prepared.samples,
            prepared.batch_size,
            run.recipe.seed,
            span_epochs=True,
            epoch_samples=prepared.epoch_samples,
        )
        self.position = position
        self.batches = prepared.batches(self.order, position)
        self.evaluated: set[int] = set()  # the steps whose closed-loop evaluation ran

    def next_step_batches(self) -> list[Any]:
        _, self.position = self.order.next_batch(self.position)
        return [next(self.batches)]

    def save_checkpoint(self, loop_state: LoopState) -> None:
        meta: dict[str, object] = {
            "recipe": self.run.recipe.fingerprint(),
            "data_position": self.position.to_dict(),
            "window": loop_state.window.to_dict(),
            "loss": loop_state.last_loss,
        }
        self.prepared.save_checkpoint(self.store, loop_state.step, meta)

    def report(self, event: Event) -> None:
        if self.run.rank == 0:  # one process speaks for the group
            self.callbacks.on_event(event)
            # The trackers log it too; a tracker's first failure comes back as its one warning.
            self.report_warnings(self.trackers.feed(event))

    def report_warnings(self, warnings: list[TrackerEvent]) -> None:
        for warning in warnings:
            self.callbacks.on_event(warning)

    def stop_agreed(self) -> bool:
        # A stop asked of any process (rank 0 hears the service's cancel) stops all at the same step.
        wanted = self.callbacks.should_stop()
        parallel = self.prepared.parallel
        return parallel.any(wanted) if parallel is not None else wanted

    def loop(self, state: LoopState) -> LoopResult:
        config = self.run.recipe.config
        return run_loop(
            self.prepared.learner,
            self.next_step_batches,
            state=state,
            total_steps=config.steps,
            learning_rate_at=lambda step: learning_rate(step, config.steps, config.learning_rate),
            adam=self.prepared.adam,
            on_event=self.report,
            should_stop=self.stop_agreed,
            save_checkpoint=self.save_checkpoint,
            checkpoint_every=self.run.recipe.checkpoint_every,
            log_every=self.run.recipe.log_every,
            after_checkpoint=self.after_checkpoint,
        )

    def after_checkpoint(self, loop_state: LoopState) -> None:
        """The validation split's scores at the checkpoint just written (every process scores), then
        the closed-loop evaluation if the recipe asks for one at each checkpoint."""
        if self.prepared.validate is not None:
            self.report(StageEvent(step=loop_state.step, stage="validating", detail="the held-out episodes"))
            self.report(self.prepared.validate(loop_state.step))
        if self.prepared.evaluate_at_checkpoints:
            self.evaluate(loop_state.step)

    def evaluate_the_end(self, step: int) -> bool:
        """The recipe's closed-loop evaluation of the trained policy, unless its last checkpoint's
        evaluation was at the same step; False when a stop cut it short."""
        if step not in self.evaluated:
            return self.evaluate(step)
        return True

    def evaluate(self, step: int) -> bool:
        """The eval block's evaluation at `step` (on rank 0), reported; False when the run's
        should_stop (a cancel, a shutdown) cut it short between two environment steps: the loop
        then stops at its next step, as it does for a stop between steps."""
        evaluate = self.prepared.evaluate_in_env
        if evaluate is None:
            return True
        self.evaluated.add(step)
        # One simulator run, on rank 0: in a group it scores rank 0's model (whole under DDP).
        if self.run.rank == 0 and (
            self.prepared.parallel is None or self.prepared.parallel.whole_on_each_rank
        ):
            self.report(
                StageEvent(step=step, stage="evaluating", detail=_eval_detail(self.run.recipe.config))
            )
            event = evaluate(step, self.callbacks.should_stop)
            if event is None:
                self.evaluated.discard(step)
                return False
            self.report(event)
        return True

    def checkpoint_the_stop(self, state: LoopState) -> None:
        """With checkpoint_on_stop, a stopped run's step is kept in a checkpoint, unless one holds it."""
        if self.callbacks.checkpoint_on_stop and state.step > 0 and _latest_step(self.store) != state.step:
            self.save_checkpoint(state)
            self.report(CheckpointEvent(step=state.step))


def _eval_detail(config: SFTConfig) -> str | None:
    block = config.eval
    return None if block is None else f"in {block.env} ({block.episodes} episodes)"


def _latest_step(store: CheckpointStore) -> int | None:
    latest = store.latest()
    return None if latest is None else int(store.manifest(latest)["step"])
