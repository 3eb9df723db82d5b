"""`relay.sft.train` sends a relative dataset directory as the caller's absolute path: the service
reads `./dots` from its own working directory otherwise (docs/evaluation.md's `dataset_name="./dots"`
was refused by `relay server`, which runs elsewhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relay.sft.config import SFTConfig
from relay.sft.train import train


class Recorder:
    """A client that keeps the body it is sent and answers with a queued job."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {}

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.body = kwargs["json_body"]
        return {"id": "ft-000000000000", "object": "fine_tune", "status": "queued", **self.body}


@pytest.mark.parametrize(
    ("given", "sent"),
    [("./dots", "{cwd}/dots"), ("lerobot/pusht_image", "lerobot/pusht_image"), ("/data/x", "/data/x")],
)
def test_a_relative_directory_is_sent_absolute(
    given: str, sent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = Recorder()
    train(SFTConfig(model="pi05-tiny", dataset_name=given, steps=1), client=client)  # type: ignore[arg-type]
    assert client.body["dataset_name"] == sent.format(cwd=tmp_path)
