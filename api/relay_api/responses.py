"""The routes' JSON answers, encoded with orjson: a page of 100 events encodes several times faster
than with the standard library, and the events page is what consoles and `--follow` read most."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse as StarletteJSONResponse


def rendered(content: Any) -> bytes:
    """`content` as the answer's bytes; a TypeError for what JSON cannot carry (an integer past 64
    bits). The routes that create a row render its answer before committing it (idempotency.insert_once)."""
    return orjson.dumps(content)


class JSONResponse(StarletteJSONResponse):
    """Starlette's JSONResponse (compact UTF-8, as before), rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return rendered(content)
