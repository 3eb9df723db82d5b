"""What a failed job tells its owner about the service's own paths (relay_worker.fine_tune.public_message)."""

from __future__ import annotations

from pathlib import Path

from relay_api.settings import Settings
from relay_worker.fine_tune import public_message


def test_the_services_paths_are_named_in_words_and_the_users_part_is_kept(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", dataset_cache_dir=tmp_path / "cache")
    cache, jobs = tmp_path / "cache", settings.jobs_dir
    message = public_message(
        f"cannot read '{cache}/datasets/lerobot/pusht/data.parquet': truncated; "
        f"work dir {jobs}/ft-1; cache {cache}. elsewhere {tmp_path}/home-old",
        settings,
    )
    assert message == (
        "cannot read 'the service's dataset cache (at datasets/lerobot/pusht/data.parquet)': truncated; "
        f"work dir the service's jobs directory (at ft-1); cache the service's dataset cache. "
        f"elsewhere {tmp_path}/home-old"
    )
    assert "<" not in message
