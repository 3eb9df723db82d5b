"""Starting a recipe from a checkpoint (a recipe's `from_checkpoint`, relay.checkpoints): its weights
loaded as the recipe's architecture and chunk length, where they came from, and the statistics they
were trained with.

A Hub repo is fetched at its revision into the Hub cache; a local directory is read where it is;
a fine-tune's id is read from the job's output directory, which only the service knows (the worker
resolves it and passes it in as `job_output`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from relay.checkpoints import architecture_mismatch, job_id_needs_the_service, parse_checkpoint
from relay.events import WeightsEvent
from relay_engine.datasets.norm_stats import NormStats, Stats
from relay_engine.errors import ConfigError
from relay_engine.models.lerobot_files import ACTION_KEY, NORMALIZER_FILE, STATE_KEY
from relay_engine.models.pi05 import Pi05Policy
from relay_engine.models.weights import (
    NORM_STATS_FILE,
    WEIGHTS_FILE,
    fetch_from_hub,
    load_weights,
    read_config,
)

_PARAM = "from_checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    """A from_checkpoint value resolved to a directory holding its files, and where it came from."""

    value: str
    directory: Path
    repo: str | None = None
    revision: str | None = None
    sha: str | None = None
    job: str | None = None

    def event(self, step: int, model: str) -> WeightsEvent:
        """The job's report of where its starting weights came from (relay.events.WeightsEvent)."""
        return WeightsEvent(
            step=step,
            model=model,
            repo=self.repo,
            revision=self.revision,
            sha=self.sha,
            # A local directory's own path; none for a repo, nor for a job (its output's path is the
            # service's, which no answer shows).
            path=str(self.directory) if self.repo is None and self.job is None else None,
            job=self.job,
        )


def resolve_checkpoint(value: str, job_output: Path | None = None) -> Checkpoint:
    """The directory `value` names, fetched from the Hub first for a repo id. `job_output`: the output
    directory of the fine-tune a job id names (the service's; without it a job id is refused)."""
    try:
        source = parse_checkpoint(value)
    except ValueError as error:
        raise ConfigError(f"bad from_checkpoint: {value!r} ({error})", _PARAM) from None
    if source.kind == "job":
        assert source.job is not None
        if job_output is None:
            raise ConfigError(job_id_needs_the_service(source.job), _PARAM)
        if not (job_output / WEIGHTS_FILE).is_file():
            raise ConfigError(
                f"bad from_checkpoint: the output of {source.job} holds no {WEIGHTS_FILE} (was it deleted?)",
                _PARAM,
            )
        return Checkpoint(value, job_output, job=source.job)
    if source.kind == "directory":
        assert source.path is not None
        if not source.path.is_dir():
            raise ConfigError(f"bad from_checkpoint: {value} is not a directory on this machine", _PARAM)
        if not (source.path / WEIGHTS_FILE).is_file():
            raise ConfigError(f"bad from_checkpoint: {value} holds no {WEIGHTS_FILE}", _PARAM)
        return Checkpoint(value, source.path)
    assert source.repo is not None
    try:
        directory = fetch_from_hub(source.repo, source.revision, with_stats=True)
    except ConfigError as error:
        raise ConfigError(f"bad from_checkpoint: {error}", _PARAM) from None
    # The Hub cache keeps a revision's files in snapshots/<commit sha>/.
    return Checkpoint(value, directory, repo=source.repo, revision=source.revision, sha=directory.name)


def load_checkpoint(
    checkpoint: Checkpoint,
    *,
    model: str | None,
    action_horizon: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Pi05Policy:
    """The checkpoint's weights as a policy of `model`'s architecture (refused, naming both, when
    the checkpoint's own config says another; None: whichever it is), cutting chunks of
    `action_horizon` steps: the recipe's, not the length the checkpoint was trained with (lerobot's
    chunk_size, 50, for its pi05 checkpoints)."""
    config = read_config(checkpoint.directory, seed)
    if model is not None and config.model != model:
        raise ConfigError(architecture_mismatch(model, config.model, checkpoint.value), _PARAM)
    config = config.replace(action_horizon=action_horizon)
    return load_weights(
        config, checkpoint.directory / WEIGHTS_FILE, torch.device(device), str(checkpoint.directory)
    )


def checkpoint_norm_stats(checkpoint: Checkpoint) -> NormStats:
    """The statistics the checkpoint was trained with: Relay's norm_stats.json, else lerobot's
    normalizer processor file (its q01 and q99, mean and std of the state and the action). A
    checkpoint with neither (a base model's) is refused: normalization "checkpoint" needs them."""
    directory = checkpoint.directory
    path = directory / NORM_STATS_FILE
    if path.is_file():
        try:
            return NormStats.from_json(path.read_text())
        except ValueError as error:
            raise ConfigError(
                f"bad normalization: {checkpoint.value}'s {NORM_STATS_FILE}: {error}", "normalization"
            ) from None
    path = directory / NORMALIZER_FILE
    if path.is_file():
        return _lerobot_stats(checkpoint.value, path)
    raise ConfigError(
        f'bad normalization: "checkpoint", and {checkpoint.value} carries no statistics (no '
        f'{NORM_STATS_FILE} or {NORMALIZER_FILE}); use normalization "dataset", the new dataset\'s own',
        "normalization",
    )


def _lerobot_stats(value: str, path: Path) -> NormStats:
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    names = ("mean", "std", "q01", "q99")

    def stats(key: str) -> Stats:
        missing = [f"{key}.{name}" for name in names if f"{key}.{name}" not in tensors]
        if missing:
            raise ConfigError(
                f"bad normalization: {value}'s {NORMALIZER_FILE} lacks {', '.join(missing)}; pi05 "
                'normalizes with quantiles (use normalization "dataset")',
                "normalization",
            )
        arrays = {name: tensors[f"{key}.{name}"].double().numpy().astype(np.float64) for name in names}
        return Stats(**arrays)

    return NormStats(state=stats(STATE_KEY), actions=stats(ACTION_KEY))


def use_checkpoint_norm_stats(dataset: object, checkpoint: Checkpoint) -> None:
    """Normalize `dataset` (a LeRobotDataset) with the checkpoint's statistics, refused when their
    widths are not the dataset's (the statistics of another robot)."""
    stats = checkpoint_norm_stats(checkpoint)
    summary = dataset.summary  # type: ignore[attr-defined]
    for what, theirs, ours in (
        ("state", stats.state_dim, summary.state_dim),
        ("action", stats.action_dim, summary.action_dim),
    ):
        if theirs != ours:
            raise ConfigError(
                f"bad normalization: {checkpoint.value}'s statistics are of a {theirs}-wide {what}, and "
                f"the dataset's {what} is {ours} wide (another robot's); use normalization \"dataset\"",
                "normalization",
            )
    dataset.norm_stats = stats  # type: ignore[attr-defined]
