"""Errors the SDK raises.

A request the API refused raises ``APIError``, a RuntimeError whose message reads like
``POST /v1/fine-tunes: 400 bad batch_size: 0 (...)``; a config the SDK can check before sending
raises ``ConfigError``, a ValueError naming the field and the rule; a training session's call that
failed raises ``RequestFailedError`` from its future's ``.result()``.

``ConfigError`` is the one class for a broken setting everywhere: the SDK, the API and the engine
raise it. It is an ``InputError``, the engine's ``EngineError``, so whatever shows the user an
engine problem (the worker, the CLI) shows a broken setting too.
"""

from __future__ import annotations


class InputError(Exception):
    """Something the user gave (a setting, a dataset, data) cannot be used; the message says what to
    fix. The engine raises it as ``relay_engine.errors.EngineError``."""


class ConfigError(InputError, ValueError):
    """A setting that breaks a rule. ``param`` names the (first) field at fault; ``code`` says
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


class RequestFailedError(RuntimeError):
    """A training session's call failed. ``category`` says whose fault: ``"user"`` (a malformed
    datum, a bad name, a state that does not fit; the session goes on) or ``"server"`` (a fault of
    the service, such as a lost worker). ``request_id`` is the id of the request that sent the call,
    to quote when asking for help; ``call`` names the call and ``seq`` is its number in the session."""

    def __init__(
        self,
        message: str,
        *,
        category: str,
        request_id: str | None = None,
        call: str | None = None,
        seq: int | None = None,
        code: str | None = None,
    ) -> None:
        what = f"{call} (call {seq})" if call and seq is not None else call or "the call"
        detail = f"{category} error" + (f", request id {request_id}" if request_id else "")
        super().__init__(f"{what} failed: {message} [{detail}]")
        self.message = message
        self.category = category
        self.request_id = request_id
        self.call = call
        self.seq = seq
        self.code = code
