"""The rules of the API's path, query and header parameters, written once for every route.

Every id is short printable ASCII, and every number fits PostgreSQL's bigint and a Redis stream id,
so odd input (a NUL byte, an id of a megabyte, 2^64) is a 400 or a 404 with the usual error body
rather than an error from the database or from Redis.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Path, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from relay_api.errors import APIProblem

# The ids the API hands out ("ft-3f2a...", "ses-..."), with room to spare; nothing else matches.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ID_MAX = 64
# The largest number a parameter may carry: PostgreSQL's bigint, and below Redis's 2^64 stream ids.
INT_MAX = 2**63 - 1
# Visible ASCII, spaces only between words: no empty or blank key, no control characters.
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]([ -~]{0,253}[!-~])?$"

JobId = Annotated[str, Path(pattern=ID_PATTERN, max_length=ID_MAX, description="The fine-tune's id.")]
SessionId = Annotated[str, Path(pattern=ID_PATTERN, max_length=ID_MAX, description="The session's id.")]
DeploymentId = Annotated[str, Path(pattern=ID_PATTERN, max_length=ID_MAX, description="The deployment's id.")]
WebhookId = Annotated[str, Path(pattern=ID_PATTERN, max_length=ID_MAX, description="The webhook's id.")]
PageAfter = Annotated[
    str | None,
    Query(pattern=ID_PATTERN, max_length=ID_MAX, description="The last id of the previous page."),
]
PageLimit = Annotated[int, Query(ge=1, le=100)]
EventAfter = Annotated[int | None, Query(ge=0, le=INT_MAX, description="Only events after this event id.")]
CallNumber = Annotated[int, Path(ge=1, le=INT_MAX, description="The call's number.")]
CallNumberHeader = Annotated[
    int, Header(alias="x-relay-seq", ge=1, le=INT_MAX, description="The call's number: 1, 2, 3, ...")
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Send the same key again to get the same object, not a second one: 1 to 255 visible "
        "ASCII characters (spaces only inside). Leave the header out for no idempotency; an empty "
        "or blank one is refused.",
    ),
]


def event_id_from_header(last_event_id: str | None) -> int | None:
    """A stream's `Last-Event-ID`, if it is an event id we could have sent; anything else is ignored."""
    if (
        last_event_id
        and last_event_id.isascii()
        and last_event_id.isdigit()
        and int(last_event_id) <= INT_MAX
    ):
        return int(last_event_id)
    return None


async def known_query_parameters(request: Request) -> None:
    """Refuse a query parameter the route does not take (a 400 naming it), as an unknown field of
    a body is refused: a misspelt `limit` would otherwise be a silent default. `async def`, as it
    does no blocking work: a sync dependency would cost every /v1 request a trip to the thread
    pool of its own, besides its route's."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    known: frozenset[str] | None = getattr(route, _QUERY_NAMES, None)
    if known is None:
        known = frozenset(_query_parameters(route.dependant))
        setattr(route, _QUERY_NAMES, known)
    for name in request.query_params:
        if name not in known:
            takes = ", ".join(sorted(known)) or "none"
            raise APIProblem(
                400,
                f"unknown query parameter {name!r} (this route takes: {takes})",
                param=name,
                code="unknown_parameter",
            )


# Where a route keeps the names of its query parameters (its dependencies' included), found on its
# first request: on the route itself, which lives as long as its app.
_QUERY_NAMES = "_relay_query_names"


def _query_parameters(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_parameters(dependency)
    return names
