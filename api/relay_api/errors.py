"""Error answers in the peers' shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}

# How long a caller should wait before trying again while the database is away.
DATABASE_RETRY_AFTER_SECONDS = 5


class APIProblem(Exception):
    """Raised anywhere in a request to answer with an error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = TYPE_OF_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def database_unavailable(error: Exception) -> APIProblem:
    """503 while the database cannot be reached: the request may be sent again as it was."""
    log.warning("the database is unavailable: %s", str(error).splitlines()[0] if str(error) else error)
    return APIProblem(
        503,
        "the service's database is unavailable for the moment; try again shortly",
        code="database_unavailable",
        headers={"retry-after": str(DATABASE_RETRY_AFTER_SECONDS)},
    )


def not_found(job_id: str) -> APIProblem:
    return APIProblem(404, f"no fine-tune {job_id}", param="id", code="not_found")
