"""/v1/states: the training states a user's sessions saved (``save_state``), to find one to load.

A state is a directory under the user's data directory that the worker wrote (RELAY_HOME/users/<id>/
states/<name>); its meta file says which model and targets it belongs to. The API reads the same
directory as the workers (one volume, as for jobs' files), so no table keeps a second copy.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from relay.training.config import STATE_META_FILE
from relay_api import schemas
from relay_api.db import iso
from relay_api.deps import CurrentUser, SettingsDep
from relay_api.responses import JSONResponse

router = APIRouter(prefix="/v1/states", tags=["training sessions"], responses=schemas.ERRORS)


@router.get(
    "", summary="List your saved training states, newest first", responses={200: {"model": schemas.StateList}}
)
def list_states(user: CurrentUser, settings: SettingsDep) -> Response:
    """Each state's name (what `load_state` takes), what it was saved from, its size and time."""
    data = saved_states(settings.user_dir(user) / "states")
    return JSONResponse({"object": "list", "data": data, "has_more": False})


def saved_states(directory: Path) -> list[dict[str, Any]]:
    """The complete states in `directory`, newest first. A state being written (a dot-named temporary
    directory) or one without its meta file is not listed: it cannot be loaded."""
    found = []
    if not directory.is_dir():
        return []
    for path in directory.iterdir():
        meta = path / STATE_META_FILE
        if path.name.startswith(".") or not meta.is_file():
            continue
        try:
            saved = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue  # being replaced, or damaged: not loadable either
        files = [f for f in path.rglob("*") if f.is_file()]
        modified = max(f.stat().st_mtime for f in files)
        found.append(
            {
                "object": "training_state",
                "name": path.name,
                "base_model": saved.get("base_model"),
                "finetune": saved.get("finetune"),
                "targets": saved.get("targets"),
                "lora_rank": saved.get("lora_rank"),
                "bytes": sum(f.stat().st_size for f in files),
                "saved_at": iso(dt.datetime.fromtimestamp(modified, dt.UTC)),
            }
        )
    found.sort(key=lambda state: (state["saved_at"], state["name"]), reverse=True)
    return found
