"""Typed dependencies of the routes: the settings, a database session, the calling user."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from relay_api.errors import APIProblem
from relay_api.keys import KeyCache
from relay_api.queue import Publisher
from relay_api.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_publisher(request: Request) -> Publisher:
    publisher: Publisher = request.app.state.publisher
    return publisher


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]

_UNAUTHORIZED = {"www-authenticate": "Bearer"}


def current_user(
    request: Request,
    session: SessionDep,
    authorization: Annotated[str | None, Header(description="Bearer <your API key>")] = None,
) -> int:
    """The id of the user whose key the request carries; 401 without a valid one."""
    if not authorization:
        raise APIProblem(401, "missing API key: send the header Authorization: Bearer <key>",
                         code="missing_api_key", headers=_UNAUTHORIZED)
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise APIProblem(401, "the Authorization header must read: Bearer <key>",
                         code="invalid_api_key", headers=_UNAUTHORIZED)
    cache: KeyCache = request.app.state.keys
    user_id = cache.user_of(session, key.strip())
    if user_id is None:
        raise APIProblem(401, "invalid API key", code="invalid_api_key", headers=_UNAUTHORIZED)
    return user_id


CurrentUser = Annotated[int, Depends(current_user)]
