"""/v1/datasets/{name}: what a dataset holds, as a job would read it, from its meta files alone.

The engine describes it (`relay_engine.datasets.describe_dataset`, the same function as `relay
datasets inspect`) in a process of its own (relay_api.inspectors): the API never imports the engine.
A Hub repo's `meta/` is fetched into the dataset cache; a local directory is read only where the API
sees the workers' disk, as fine-tune creation decides it (`RELAY_LOCAL_DATASETS`,
`RELAY_API_SHARES_WORKERS_DISK`).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from relay.dataset_description import DatasetDescription
from relay.dataset_names import (
    LEROBOT_DATASET_NAME_PATTERN,
    MALFORMED_URL_RULE,
    is_database_url,
    is_malformed_url,
    is_relational_source,
    names_local_directory,
    redacted_url,
)
from relay.sft.config import DATASET_NAME_MAX, DATASET_REVISION_MAX, REVISION_PATTERN
from relay_api import schemas
from relay_api.deps import CurrentUser, SettingsDep
from relay_api.errors import APIProblem
from relay_api.inspectors import InspectionFailed, Inspectors
from relay_api.responses import JSONResponse
from relay_api.settings import Settings

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=schemas.ERRORS)

NAME_RULE = (
    "must be a Hub dataset repo id such as lerobot/pusht_image (owner/name: letters, digits, _, - and ., "
    "1 to 96 a part, starting and ending with a letter, digit or _, no -- or .., not ending in .git), "
    "or a local dataset directory (an absolute path, ~/..., ./... or a file:// URL): "
    f"1 to {DATASET_NAME_MAX} characters, no control characters"
)
_NAME = re.compile(LEROBOT_DATASET_NAME_PATTERN)

DatasetName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=DATASET_NAME_MAX,
        # Stated for the document and checked in the route, with the rule in words (NAME_RULE).
        json_schema_extra={"pattern": LEROBOT_DATASET_NAME_PATTERN},
        description="A Hub dataset repo id (`lerobot/pusht_image`: its slash needs no escaping), or a "
        "local dataset directory (`/data/my_dataset`, `%2Fdata%2Fmy_dataset` escaped), which the API "
        "reads only where it sees the workers' disk.",
    ),
]
DatasetRevision = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=DATASET_REVISION_MAX,
        pattern=REVISION_PATTERN,
        description="A Hub dataset's branch, tag or commit (default: v2.1, else a v3.0 default branch).",
    ),
]

# The engine's reasons (relay_engine.errors.DatasetError.reason) -> status, code, the parameter at fault.
_ANSWERS: dict[str, tuple[int, str, str | None]] = {
    "not_found": (404, "dataset_not_found", "name"),
    "no_such_revision": (404, "revision_not_found", "revision"),
    "refused": (400, "dataset_refused", "name"),
    "bad_name": (400, "invalid_value", "name"),
    "unavailable": (502, "dataset_unavailable", None),
}


@router.get(
    "/{name:path}",
    summary="Describe a dataset: cameras, widths, episodes, format",
    responses={
        200: {"model": DatasetDescription},
        403: {
            "model": schemas.ErrorOut,
            "description": "A local directory, where this server does not let the API read one "
            "(`local_datasets_off`: RELAY_LOCAL_DATASETS=false; `workers_disk_not_shared`: "
            "RELAY_API_SHARES_WORKERS_DISK=false).",
        },
        404: {
            "model": schemas.ErrorOut,
            "description": "No such dataset (`dataset_not_found`: no such Hub repo or directory), or no "
            "such revision of it (`revision_not_found`).",
        },
        502: {
            "model": schemas.ErrorOut,
            "description": "The dataset could not be read for now: the Hub cannot be reached or answered "
            "an error (`dataset_unavailable`), or describing it failed (`inspection_failed`).",
        },
        504: {
            "model": schemas.ErrorOut,
            "description": "Describing the dataset took longer than the limit (`inspection_timeout`).",
        },
    },
)
async def describe_dataset(
    name: DatasetName,
    request: Request,
    user: CurrentUser,
    settings: SettingsDep,
    revision: DatasetRevision = None,
) -> Response:
    """What the dataset holds, read from its meta files alone (`meta/info.json`, the episodes, the
    tasks; of a Hub repo only `meta/` is fetched, at the revision a job would read): each camera
    (image or video, height and width, a video camera's codec, pixel format and fps), the state
    and action widths, fps, episodes, frames, tasks, the LeRobot format, what was read (the Hub
    revision and commit, or the directory) and `camera_map`, the model cameras a job fills from
    the dataset's cameras when it names no `cameras`. A dataset Relay does not read is a 400
    giving every reason."""
    check_name(name, revision, settings)
    inspectors: Inspectors = request.app.state.inspectors
    cache_dir = str(settings.dataset_cache_dir) if settings.dataset_cache_dir else None
    async with _slots(request, inspectors.processes):
        try:
            answer = await run_in_threadpool(inspectors.describe, name, revision, cache_dir)
        except InspectionFailed as error:
            if error.timed_out:
                raise APIProblem(504, str(error), code="inspection_timeout") from None
            raise APIProblem(502, str(error), code="inspection_failed") from None
    return JSONResponse(described(answer))


def check_name(name: str, revision: str | None, settings: Settings) -> None:
    """Refuse a malformed name (400), and a local directory the API may not read (403)."""
    if is_malformed_url(name):  # never shown back: it may hold a password
        raise APIProblem(400, f"bad name: {MALFORMED_URL_RULE}", param="name", code="invalid_value")
    if is_relational_source(name):
        shown = redacted_url(name) if is_database_url(name) else name
        raise APIProblem(
            400,
            f"bad name: {json.dumps(shown)} (a database URL or RelBench name is an rt-j model's data; "
            "this endpoint describes LeRobot datasets: check a database with `relay datasets check "
            "NAME` on a machine that reads it)",
            param="name",
            code="invalid_value",
        )
    if not _NAME.fullmatch(name):
        raise APIProblem(
            400, f"bad name: {json.dumps(name)} ({NAME_RULE})", param="name", code="invalid_value"
        )
    if not names_local_directory(name):
        return
    if not settings.local_datasets:
        raise APIProblem(
            403,
            f"dataset {name}: this server does not read local directories (RELAY_LOCAL_DATASETS is "
            "false); name a LeRobot dataset on the Hugging Face Hub, such as lerobot/pusht_image",
            param="name",
            code="local_datasets_off",
        )
    if not settings.api_shares_workers_disk:
        raise APIProblem(
            403,
            f"dataset {name}: the API reads a local directory only where it sees the workers' disk "
            "(RELAY_API_SHARES_WORKERS_DISK is false on this server); run `relay datasets inspect "
            f"{name}` where the directory is",
            param="name",
            code="workers_disk_not_shared",
        )
    if revision is not None:
        raise APIProblem(
            400,
            f"bad revision: {json.dumps(revision)} (a local directory has no revisions; a revision "
            "names a branch, tag or commit of a Hub dataset repo)",
            param="revision",
            code="invalid_value",
        )


def described(answer: dict[str, Any]) -> dict[str, Any]:
    """The engine's answer as the API's: the description, or the error with its status."""
    if "dataset" in answer:
        return DatasetDescription.model_validate(answer["dataset"]).model_dump(mode="json")
    error = answer.get("error") or {}
    reason, message = str(error.get("reason")), str(error.get("message"))
    status, code, param = _ANSWERS.get(reason, (502, "inspection_failed", None))
    raise APIProblem(status, message, param=param, code=code)


def _slots(request: Request, processes: int) -> asyncio.Semaphore:
    """At most `processes` descriptions at once per app (and event loop); the others wait here,
    holding no thread of the pool."""
    loop = asyncio.get_running_loop()
    held: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = getattr(
        request.app.state, "inspect_slots", None
    )
    if held is None or held[0] is not loop:
        held = (loop, asyncio.Semaphore(processes))
        request.app.state.inspect_slots = held
    return held[1]
