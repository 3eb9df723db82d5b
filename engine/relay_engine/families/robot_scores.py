"""The robot policies' scores (pi05's, SmolVLA's): how well a policy's sampled action chunks match a
dataset's, in normalized units, and the blind baseline to judge them by. `relay local eval` and a
recipe's validation split (families/robot_validation.py) both score here; each family gives its
own flow-matching loss (pi05: families/pi05/evaluate.py:flow_loss).

A sampled chunk is the policy's answer plus its sampling spread: where the data is noise (a column
no observation predicts), one sample's error is the truth's spread plus the policy's, so a policy
that samples as widely as the data (as one that learned it does) misses by about twice what the
blind baseline's mean chunk misses by. So each frame gets `CHUNKS_PER_FRAME`
chunks from independent noise, and the headline is the error of their mean (`mean_mse`): what
the policy believes the action is. The chunks' spread about their mean is reported beside it, and
so is one chunk's error, for continuity with the figure reported before; per element, one
chunk's error (averaged over the chunks) is exactly the mean's error plus the spread."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay.events import CHUNKS_PER_FRAME
from relay_engine.core.data import MapDataset
from relay_engine.datasets import LeRobotDataset, NormStats
from relay_engine.families.base import EvaluationRequest

# Frames per batch of sampling (no gradients: far less memory than a training batch of the size).
EVAL_BATCH_SIZE = 32


@dataclass(frozen=True)
class EvalResult:
    mse: float  # mean squared error over real (step, dimension) elements, normalized units
    samples: int


@dataclass(frozen=True)
class ActionScores:
    """A policy's sampled chunks against a dataset's, over the real (step, column) elements of
    `samples` frames, `chunks` chunks each, in normalized units (see the module's docstring)."""

    mean_mse: float  # the headline: the error of each frame's mean chunk
    mse: float  # one sampled chunk's error, averaged over the chunks: mean_mse + spread
    spread: float  # the chunks' mean squared distance from their mean chunk
    chunks: int
    samples: int


def _real_elements(sample: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A sample's chunk and the mask of its real elements: steps before the episode's end and
    the robot's own columns (the padding columns are trained, but no robot reads them)."""
    actions = np.asarray(sample["actions"], dtype=np.float32)
    mask = np.zeros(actions.shape, dtype=bool)
    width = int(sample["action_dim"])
    valid_steps = ~np.asarray(sample["action_is_pad"], dtype=bool)
    mask[:, :width] = valid_steps[:, None]
    return actions, mask


@torch.no_grad()
def evaluate_actions(
    policy: Any,
    dataset: MapDataset,
    indices: Sequence[int],
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    num_steps: int = 10,
    seed: int = 0,
    chunks: int = CHUNKS_PER_FRAME,
    on_batch: Callable[[int], None] | None = None,
) -> ActionScores:
    """Sample `chunks` chunks for each frame in `indices` and compare them with the dataset's chunk:
    the error of their mean, their spread, and one chunk's error.

    Padded steps past an episode's end and the padding columns are left out. The sampler's noise
    comes from `seed`, so two evaluations of one policy agree exactly. `batch_size` bounds the
    chunks sampled in one pass (frames x chunks, at least one frame), so memory stays what one
    chunk a frame took; the frames of a pass share their prefix pass. `on_batch(frames_done)`
    after each batch, for progress.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    policy.eval()
    device = next(policy.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    frames_per_batch = max(1, batch_size // chunks)
    mean_error, single_error, spread, count = 0.0, 0.0, 0.0, 0
    for start in range(0, len(indices), frames_per_batch):
        samples = [dataset[i] for i in indices[start : start + frames_per_batch]]
        batch = policy.collate(samples).to(device)
        predicted = policy.sample_actions(batch, num_steps=num_steps, generator=generator, chunks=chunks)
        # (frames, chunks, H, 32), in float64 so that the three sums below add up exactly.
        predicted_chunks = predicted.double().cpu().numpy()
        predicted_chunks = predicted_chunks.reshape(len(samples), chunks, *predicted.shape[1:])
        for row, sample in enumerate(samples):
            actions, mask = _real_elements(sample)
            sampled = predicted_chunks[row, :, :, : actions.shape[1]]
            mean = sampled.mean(axis=0)
            mean_error += float(((mean - actions) ** 2)[mask].sum())
            single_error += float(((sampled - actions) ** 2).mean(axis=0)[mask].sum())
            spread += float(((sampled - mean) ** 2).mean(axis=0)[mask].sum())
            count += int(mask.sum())
        if on_batch is not None:
            on_batch(start + len(samples))
    elements = max(count, 1)
    return ActionScores(
        mean_mse=mean_error / elements,
        mse=single_error / elements,
        spread=spread / elements,
        chunks=chunks,
        samples=len(indices),
    )


def blind_baseline(
    train: MapDataset,
    train_indices: Iterable[int],
    held_out: MapDataset,
    held_out_indices: Sequence[int],
) -> EvalResult:
    """The error of a policy that ignores its inputs: it always answers the training frames'
    mean chunk (per step and column). A policy that learned to look must beat it.

    It samples nothing, so all its chunks are that one chunk: its error is at once its mean
    chunk's (compared with a policy's `mean_mse`) and any one chunk's, and its spread is zero.

    `held_out` may be the training dataset itself (other episodes of it) or another dataset
    normalized with the training set's stats (see `with_norm_stats`).
    """
    mean = mean_chunk(train, train_indices)
    squared_error, count = 0.0, 0
    for i in held_out_indices:
        actions, mask = _real_elements(held_out[i])
        squared_error += float(((mean - actions) ** 2)[mask].sum())
        count += int(mask.sum())
    return EvalResult(mse=squared_error / max(count, 1), samples=len(held_out_indices))


def mean_chunk(train: MapDataset, indices: Iterable[int]) -> np.ndarray:
    """The training frames' mean chunk (H, 32), per step and column over their real elements, in
    normalized units: the blind baseline's one answer, offline and in closed loop."""
    total: np.ndarray | None = None
    counts: np.ndarray | None = None
    for i in indices:
        actions, mask = _real_elements(train[i])
        if total is None or counts is None:
            total, counts = np.zeros(actions.shape), np.zeros(actions.shape)
        total += np.where(mask, actions, 0.0)
        counts += mask
    if total is None or counts is None:
        raise ValueError("the blind baseline needs at least one training frame")
    return total / np.maximum(counts, 1)


@dataclass(frozen=True)
class BlindConfig:
    """What evaluation reads of a policy's config: its name and its chunk's shape."""

    model: str
    action_horizon: int
    action_dim: int


class BlindPolicy:
    """The blind baseline as a policy that acts: whatever it is shown, it answers the training
    frames' mean chunk. `evaluate_in_env` runs it as it runs a model, so a closed-loop success
    rate has the same floor to be judged by as the offline error."""

    def __init__(self, chunk: np.ndarray, norm_stats: NormStats, name: str = "blind") -> None:
        self.chunk = torch.as_tensor(np.asarray(chunk, dtype=np.float32))
        self.norm_stats = norm_stats
        self.config = BlindConfig(name, int(self.chunk.shape[0]), int(self.chunk.shape[1]))
        self.reads_cameras: tuple[str, ...] | None = ()  # it reads none
        self.frame_size: int | None = None

    @classmethod
    def from_dataset(cls, dataset: LeRobotDataset, episodes: Iterable[int] | None = None) -> BlindPolicy:
        """The mean chunk of `dataset`'s frames (of `episodes` only, if given), with its stats."""
        chunks = ActionChunks(dataset)
        frames = range(len(chunks)) if episodes is None else dataset.indices_of_episodes(episodes).tolist()
        return cls(mean_chunk(chunks, frames), dataset.norm_stats)

    def eval(self) -> BlindPolicy:
        return self

    def collate(self, samples: Sequence[Any]) -> int:
        return len(samples)  # it looks at nothing: the batch is only its size

    def sample_actions(
        self,
        batch: int,
        num_steps: int = 10,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.chunk.expand(batch, *self.chunk.shape).clone()


class ActionChunks:
    """A dataset's frames as their action chunks alone (``actions``, ``action_dim``,
    ``action_is_pad``), read without images: what the blind baseline reads, thousands at a time."""

    def __init__(self, dataset: LeRobotDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, frame: int) -> dict[str, Any]:
        actions, action_is_pad = self.dataset.action_chunk(frame)
        return {
            "actions": actions,
            "action_dim": self.dataset.summary.action_dim,
            "action_is_pad": action_is_pad,
        }


def with_norm_stats(dataset: LeRobotDataset, model_dir: str | Path) -> LeRobotDataset:
    """`dataset`, normalized as the model in `model_dir` was trained (its norm_stats.json), so
    that episodes the model never saw are compared in the model's units."""
    path = Path(model_dir) / "norm_stats.json"
    if path.is_file():
        # The file keeps every statistic; the dataset's method (the model's) says which normalize.
        dataset.norm_stats = replace(NormStats.from_json(path.read_text()), method=dataset.norm_stats.method)
    return dataset


def score_request(
    policy: Any,
    data: LeRobotDataset,
    request: EvaluationRequest,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """`relay local eval`'s report of a robot policy (pi05's, or any with `collate` and
    `sample_actions`) on `data`: the mean chunk's error, the spread, one chunk's error and, with
    `request.blind_from`, the blind baseline's."""
    selected = request.episodes
    indices = list(data.indices_of_episodes(selected) if selected is not None else range(len(data)))
    if on_progress is not None:
        on_progress(0, len(indices))
    result = evaluate_actions(
        policy,
        data,
        indices,
        batch_size=request.batch_size,
        num_steps=request.num_steps,
        seed=request.seed,
        chunks=request.chunks,
        on_batch=(lambda done: on_progress(done, len(indices))) if on_progress is not None else None,
    )
    blind = None
    if request.blind_from is not None:
        training = data.indices_of_episodes(request.blind_from)
        chunks = ActionChunks(data)  # the baseline reads no images
        blind = blind_baseline(chunks, training, chunks, indices).mse
    return {
        "mean_action_mse": result.mean_mse,
        "action_spread": result.spread,
        "mse": result.mse,
        "chunks": result.chunks,
        "frames": result.samples,
        "blind_mse": blind,
    }


def report_lines(report: dict[str, Any], request: EvaluationRequest) -> list[str]:
    """The report of score_request as `relay local eval` prints it."""
    headline, blind, chunks = report["mean_action_mse"], report["blind_mse"], report["chunks"]
    lines = [
        f"action MSE {headline:.4f} (the mean of {chunks} sampled chunk{'' if chunks == 1 else 's'} "
        f"per frame, normalized units) over {report['frames']} frames",
        f"one chunk {report['mse']:.4f}: the mean's error plus the chunks' spread "
        f"{report['action_spread']:.4f}",
    ]
    if blind is not None:
        better = ""
        if headline > 0:
            ratio = blind / headline
            better = (
                f": the model is {ratio:.2f}x better"
                if ratio >= 1
                else f": the model is {1 / ratio:.2f}x worse"
            )
        episodes = request.blind_from_text
        lines.append(
            f"blind baseline {blind:.4f} (always the mean chunk of episodes {episodes}; it samples "
            f"nothing, so its error is its mean chunk's){better}"
        )
    return lines
