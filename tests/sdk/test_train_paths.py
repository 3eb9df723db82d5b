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


def test_a_mixtures_relative_directories_are_sent_absolute_and_the_config_still_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = Recorder()
    mixture = [{"name": "./pick", "weight": 3}, {"name": "lerobot/pusht_image"}]
    train(SFTConfig(model="pi05-tiny", datasets=mixture, steps=1), client=client)  # type: ignore[arg-type]
    assert [entry["name"] for entry in client.body["datasets"]] == [f"{tmp_path}/pick", "lerobot/pusht_image"]
    assert client.body["dataset_name"] == f"{tmp_path}/pick"
    # What the API parses: the first dataset is still the dataset_name.
    assert SFTConfig.parse(client.body).dataset_name == f"{tmp_path}/pick"
    # A plain mapping without dataset_name is sent without one (the API fills it in).
    train({"model": "pi05-tiny", "datasets": mixture}, client=client)  # type: ignore[arg-type]
    assert "dataset_name" not in client.body and client.body["datasets"][0]["name"] == f"{tmp_path}/pick"
