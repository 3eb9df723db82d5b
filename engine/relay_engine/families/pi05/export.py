"""Writing a trained model out: merged weights, Relay's and lerobot's configs, norm stats and
lerobot's processor files."""

from __future__ import annotations

from pathlib import Path

from relay_engine.core.checkpoint import write_whole
from relay_engine.models import Pi05Policy
from relay_engine.models.lerobot_files import DescribesRobot, RobotFeatures, write_processors


def write_output(model: Pi05Policy, output_dir: Path, dataset: DescribesRobot | None) -> None:
    """Merged weights and configs, plus (given the training dataset) its norm stats in openpi's
    layout and lerobot's processors, written beside the target and renamed into place.

    A new output directory appears whole. Into an existing one (a local run's directory, which
    also holds its checkpoints, or the output of an attempt that finished writing but not
    reporting) each file is replaced whole.
    """
    features = RobotFeatures.of(dataset) if dataset is not None else None

    def files(directory: Path) -> None:
        # Straight from the trained model, adapters merged tensor by tensor as they are written: no
        # merged copy of the model (for pi05, 13 GB more than training needed).
        model.save_pretrained(directory, features)
        # The tokenizer the model reads its prompts with, beside the weights (none for pi05-tiny's
        # bytes): the output then samples wherever it is copied, the gated Hub repo not needed.
        model.tokenizer.save_to(directory)
        if dataset is not None and features is not None:
            (directory / "norm_stats.json").write_text(dataset.norm_stats.to_json())
            write_processors(directory, model.config, features, dataset.norm_stats)

    write_whole(output_dir, files)
