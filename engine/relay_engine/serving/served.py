"""What the policy server asks of a served model, and the loading of one by what it is.

A robot policy (`ServedPolicy`, pi05's or a tuned SmolVLA: observations -> action chunks) and a tuned RT-J
(`ServedRelationalModel`: entity rows -> predictions) both `decode` one request item into the
model's input (a ConfigError naming the field when it is wrong) and `act` on many in ONE batched
forward pass, so the same Batcher and server front serve either. `answers` says which endpoints
answer: "actions" (POST /actions, openpi's websocket) or "predictions" (POST /predictions); `kind`
names the model's family. Which one a model loads as is its family's to say (`Family.served_model`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from relay_engine.serving.policy import DEFAULT_NUM_STEPS


class ServedModel(Protocol):
    kind: str  # its family's name
    name: str
    # "actions" (observations -> chunks: POST /actions, openpi's websocket) or "predictions"
    # (entity rows -> predictions: POST /predictions); what a request to another endpoint is told.
    answers: str
    use_instead: str

    def metadata(self) -> dict[str, Any]: ...

    def decode(self, item: Any, field: str = ..., /) -> Any: ...

    def act(self, items: Sequence[Any], seeds: Sequence[int | None], /) -> list[Any]: ...


def load_served_model(
    model: str | os.PathLike[str],
    *,
    device: str = "auto",
    num_steps: int = DEFAULT_NUM_STEPS,
    database: str | os.PathLike[str] | None = None,
    task: str | None = None,
) -> ServedModel:
    """The model loaded once, as `relay local eval` resolves models (a job's output, a work
    directory, a base model's name); an RT-J with the database of its task (`database` and
    `task` override what its config.json records; they are refused for a pi05 policy)."""
    from relay_engine.acting import model_directory
    from relay_engine.families import family_owning

    directory = model_directory(str(model))
    family = family_owning(str(directory) if directory is not None else str(model))
    return family.served_model(model, device=device, num_steps=num_steps, database=database, task=task)
