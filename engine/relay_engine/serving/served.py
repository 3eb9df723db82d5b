"""What the policy server asks of a served model, and the loading of one by what it is.

A pi05 policy (`ServedPolicy`: observations -> action chunks) and a tuned RT-J
(`ServedRelationalModel`: entity rows -> predictions) both `decode` one request item into the
model's input (a ConfigError naming the field when it is wrong) and `act` on many in ONE batched
forward pass, so the same Batcher and server front serve either. `kind` says which endpoints
answer: "pi05" (POST /actions, openpi's websocket) or "rt-j" (POST /predictions).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from relay import families
from relay_engine.serving.policy import DEFAULT_NUM_STEPS, ServedPolicy
from relay_engine.serving.relational import ServedRelationalModel


class ServedModel(Protocol):
    kind: str
    name: str

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
) -> ServedPolicy | ServedRelationalModel:
    """The model loaded once, as `relay local eval` resolves models (a job's output, a work
    directory, a base model's name); an RT-J with the database of its task (`database` and
    `task` override what its config.json records; they are refused for a pi05 policy)."""
    from relay_engine.acting import model_directory
    from relay_engine.errors import ConfigError
    from relay_engine.families import family_owning

    directory = model_directory(str(model))
    family = family_owning(str(directory) if directory is not None else str(model))
    if family.name == families.RTJ:
        return ServedRelationalModel.load(model, device=device, database=database, task=task)
    for value, field in ((database, "database"), (task, "task")):
        if value is not None:
            raise ConfigError(
                f"{field}: only an RT-J model is served with a database and a task", param=field
            )
    return ServedPolicy.load(model, device=device, num_steps=num_steps)
