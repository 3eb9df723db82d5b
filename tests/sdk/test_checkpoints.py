"""Which architecture a checkpoint directory holds (relay.checkpoints.checkpoint_model), read from
its own config: what the API checks a recipe's from_checkpoint against."""

from __future__ import annotations

import json
from pathlib import Path

from relay.checkpoints import architecture_mismatch, checkpoint_model


def test_lerobot_s_policy_type_names_the_family_and_anything_else_is_unknown(tmp_path: Path) -> None:
    for kind, expected in (("pi05", "pi05"), ("smolvla", "smolvla"), ("act", None), (7, None)):
        directory = tmp_path / str(kind)
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({"type": kind}))
        assert checkpoint_model(directory) == expected, kind
    # A SmolVLA's files named as a pi05's starting point: the sentence the API refuses it with.
    message = architecture_mismatch("pi05-tiny", "smolvla", str(tmp_path / "smolvla"))
    assert message.startswith(f'bad from_checkpoint: "{tmp_path / "smolvla"}" holds smolvla weights')
