"""Errors the SDK raises.

A request the API refused raises ``APIError``, a RuntimeError whose message reads like
``POST /v1/fine-tunes: 400 bad batch_size: 0 (...)``; a config the SDK can check before sending
raises ``ConfigError``, a ValueError naming the field and the rule.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A recipe setting that breaks a rule. ``param`` names the (first) field at fault; ``code`` says
    how (``invalid_value``, ``missing_field``, ``unknown_field``, ``invalid_body``)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class APIError(RuntimeError):
    """The API answered with an error, or could not be reached (``status`` is None then)."""

    def __init__(
        self,
        method: str,
        path: str,
        status: int | None,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        prefix = f"{method} {path}: " + (f"{status} " if status is not None else "")
        super().__init__(prefix + message)
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.request_id = request_id
