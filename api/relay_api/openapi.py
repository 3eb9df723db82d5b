"""Pieces of the OpenAPI document that FastAPI cannot derive from a route's signature."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON Schema with its `$defs` written in place, for a route that parses its body by hand."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref")
            if isinstance(reference, str) and reference.startswith("#/$defs/"):
                return inline(definitions[reference.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    inlined: dict[str, Any] = inline(schema)
    return inlined


BEARER = "bearer"
SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "Your API key (`relay keys create --user NAME`), sent as `Authorization: Bearer <key>`; "
    "the API takes no other form of it.",
}


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document as FastAPI builds it, then told what FastAPI cannot know: every
    /v1 operation needs a bearer key (so /docs has an Authorize button), and no route answers 422
    (a broken rule is a 400 in the error body of relay_api.errors). Built once per app."""
    if app.openapi_schema is None:
        built = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
            tags=app.openapi_tags,
        )
        components = built.setdefault("components", {})
        components.setdefault("securitySchemes", {})[BEARER] = SECURITY_SCHEME
        for schema_name in ("HTTPValidationError", "ValidationError"):
            components.get("schemas", {}).pop(schema_name, None)
        for path, operations in built.get("paths", {}).items():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
                if path.startswith("/v1/"):
                    operation["security"] = [{BEARER: []}]
        app.openapi_schema = built
    return app.openapi_schema
