"""Writing a trained model out: merged weights, config and norm stats."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from relay_engine.models import Pi05Policy
from relay_engine.tuning import merged_policy


def write_output(model: Pi05Policy, output_dir: Path, norm_stats_json: str | None) -> None:
    """Merged weights, config and norm stats, written beside the target and renamed into place.

    A new output directory appears whole. Into an existing one (a local run's directory, which
    also holds its checkpoints, or the output of an attempt that finished writing but not
    reporting) each file is replaced whole.
    """
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_dir.with_name(f".{output_dir.name}.{uuid.uuid4().hex}.tmp")
    try:
        merged_policy(model).save_pretrained(tmp)
        if norm_stats_json is not None:
            (tmp / "norm_stats.json").write_text(norm_stats_json)
        if output_dir.exists():
            for path in sorted(tmp.iterdir()):
                os.replace(path, output_dir / path.name)
            tmp.rmdir()
        else:
            os.rename(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
