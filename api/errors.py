"""The api's own exception types (no HTTP here: `api/http/errors.py` maps each to a status and body).

Every one carries a client-safe `message` and `param`, the request field at fault (or None).
"""

from __future__ import annotations

from constrained.errors import GrammarError


class ApiError(Exception):
    """Base of the api's own exceptions. `param` names the request field at fault, if any."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(ApiError):
    """The body is malformed, of the wrong type or out of range (400)."""


class NotSupported(ApiError):
    """A well-formed request asks for something this server does not do (yet) (400)."""


class ModelNotFound(ApiError):
    """`model` names neither a served model nor an adapter (404)."""


class ResponseNotFound(ApiError):
    """No stored response has this id (never stored, stored with `store: false`, or deleted) (404)."""


class PreviousResponseNotFound(ResponseNotFound):
    """`previous_response_id` names no stored response (404, code previous_response_not_found)."""


class AuthenticationFailed(ApiError):
    """Missing or wrong `Authorization: Bearer` key (401)."""


class RequestAborted(ApiError):
    """The engine ended the request without finishing it (shutdown, 503)."""


class ClientDisconnected(ApiError):
    """The client went away before the answer; nothing is sent back."""


class ServerShuttingDown(ApiError):
    """The server is draining before it exits and takes no new requests (503, Retry-After)."""


class ReplicaUnavailable(ApiError):
    """The engine replica serving the request died or could not be reached (`--data-parallel-size`:
    503 with Retry-After; Serve restarts the replica and new requests go to the others)."""


class RequestGrammarError(ApiError):
    """A grammar backend could not compile the grammar a request field asked for: `param` names
    that field (e.g. "response_format.json_schema.schema"), recorded with the grammar when the
    request was translated; `cause`, the backend's error, decides the status and code."""

    def __init__(self, cause: GrammarError, param: str) -> None:
        super().__init__(cause.message, param)
        self.cause = cause
