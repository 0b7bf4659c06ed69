"""The one table mapping every exception type to an OpenAI error (the api's own types are in api/errors.py).

Every non-2xx body is `{"error": {"message", "type", "param", "code"}}`; `code` is a string or
null, never the HTTP status. Inside a started SSE stream the same body goes out as a final
`data:` event (see `api/streaming/sse.py`).

On Anthropic's routes (/v1/messages*) the same exceptions render as Anthropic's error body
`{"type": "error", "error": {"type", "message"}}` with the type of the status
(https://docs.anthropic.com/en/api/errors); an overloaded engine is 529 overloaded_error there.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import (
    ApiError,
    AuthenticationFailed,
    ClientDisconnected,
    InvalidRequest,
    ModelNotFound,
    NotSupported,
    PreviousResponseNotFound,
    RequestAborted,
    RequestGrammarError,
    ReplicaUnavailable,
    ResponseNotFound,
    ServerShuttingDown,
)
from api.protocol.common import ErrorInfo, ErrorResponse
from constrained.errors import GrammarCompileTimeout, GrammarError, InvalidGrammar, UnwritableGrammar
from engine import (
    ContextLengthExceeded,
    EngineDeadError,
    EngineStepError,
    EngineError,
    EngineOverloaded,
    InvalidSamplingParams,
    ModelLoadError,
    RequestTimedOut,
)
from lora.errors import InvalidLoraAdapter, LoraAdapterExists, LoraAdapterNotFound, LoraError, LoraNotEnabled
from toolparsers.errors import ToolParserError

logger = logging.getLogger(__name__)


ERROR_STATUS: dict[type[BaseException], tuple[int, str, str | None]] = {
    # exception type -> (HTTP status, OpenAI type, code)
    InvalidRequest: (400, "invalid_request_error", None),
    NotSupported: (400, "invalid_request_error", "not_supported"),
    InvalidSamplingParams: (400, "invalid_request_error", None),
    ContextLengthExceeded: (400, "invalid_request_error", "context_length_exceeded"),
    UnwritableGrammar: (400, "invalid_request_error", "unwritable_grammar"),
    InvalidGrammar: (400, "invalid_request_error", "invalid_grammar"),
    GrammarCompileTimeout: (400, "invalid_request_error", "grammar_compile_timeout"),
    ToolParserError: (400, "invalid_request_error", None),
    AuthenticationFailed: (401, "invalid_request_error", "invalid_api_key"),
    ModelNotFound: (404, "invalid_request_error", "model_not_found"),
    InvalidLoraAdapter: (400, "invalid_request_error", "invalid_lora_adapter"),
    LoraAdapterExists: (400, "invalid_request_error", "lora_adapter_exists"),
    LoraNotEnabled: (400, "invalid_request_error", "not_supported"),
    LoraAdapterNotFound: (404, "invalid_request_error", "model_not_found"),
    ResponseNotFound: (404, "invalid_request_error", "response_not_found"),
    PreviousResponseNotFound: (404, "invalid_request_error", "previous_response_not_found"),
    EngineOverloaded: (429, "rate_limit_error", "overloaded"),
    RequestTimedOut: (408, "server_error", "request_timeout"),
    ClientDisconnected: (499, "invalid_request_error", "client_disconnected"),
    EngineDeadError: (500, "server_error", "engine_dead"),
    EngineStepError: (500, "server_error", "engine_step_failed"),
    ModelLoadError: (500, "server_error", None),
    EngineError: (500, "server_error", None),
    GrammarError: (500, "server_error", None),  # GrammarConfigError: a server setup fault
    RequestAborted: (503, "server_error", "request_aborted"),
    ServerShuttingDown: (503, "server_error", "shutting_down"),
    ReplicaUnavailable: (503, "server_error", "replica_unavailable"),
}
_INTERNAL: tuple[int, str, str | None] = (500, "server_error", None)
# Exceptions whose `message` and `param` are written for clients.
_CLIENT_SAFE = (ApiError, EngineError, GrammarError, ToolParserError, LoraError)


def error_status(exc: BaseException) -> tuple[int, str, str | None]:
    """(status, type, code) of `exc`: the entry of its nearest class in ERROR_STATUS, else a 500
    (a RequestGrammarError: the entry of its cause)."""
    if isinstance(exc, RequestGrammarError):
        exc = exc.cause
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return _INTERNAL


MAX_ERROR_MESSAGE_CHARS = 1024
MAX_ERROR_PARAM_CHARS = 256
"""Longest `error.message` and `error.param` sent: messages quote client values (an unknown field
name, a model id, a union tag), and a quoted megabyte must not come back as a megabyte (case 037,
response amplification)."""


def bounded(text: str, max_chars: int) -> str:
    """`text` cut to at most `max_chars` characters, the cut marked with how much was left out."""
    if len(text) <= max_chars:
        return text
    marker = f"... ({len(text)} characters, cut)"
    return text[: max(0, max_chars - len(marker))] + marker


def error_body(exc: BaseException) -> ErrorResponse:
    """The OpenAI error object for `exc`; unexpected exceptions get a generic message. `message`
    and `param` are cut to MAX_ERROR_MESSAGE_CHARS and MAX_ERROR_PARAM_CHARS."""
    _, error_type, code = error_status(exc)
    if isinstance(exc, _CLIENT_SAFE):
        message, param = exc.message, exc.param
    else:
        message, param = "internal server error", None
    return ErrorResponse(
        error=ErrorInfo(
            message=bounded(message or error_type, MAX_ERROR_MESSAGE_CHARS),
            type=error_type,
            param=None if param is None else bounded(param, MAX_ERROR_PARAM_CHARS),
            code=code,
        )
    )


ANTHROPIC_ROUTE_PREFIX = "/v1/messages"
OVERLOADED_STATUS = 529
"""Anthropic's status for an overloaded server (its SDK retries it like a 429)."""
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",   # Anthropic sends it with 504; the status stays the other routes' 408
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    OVERLOADED_STATUS: "overloaded_error",
}


def is_anthropic_route(path: str | None) -> bool:
    """Whether `path` is one of Anthropic's routes, whose errors use Anthropic's body."""
    return path is not None and (path == ANTHROPIC_ROUTE_PREFIX or path.startswith(ANTHROPIC_ROUTE_PREFIX + "/"))


def anthropic_error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, body) of `exc` in Anthropic's shape: the ERROR_STATUS status (529 for
    EngineOverloaded), the Anthropic error type of that status (other 4xx: invalid_request_error,
    other 5xx: api_error) and the same client-safe message as the OpenAI body, naming the field
    at fault when the message does not already."""
    status, _, _ = error_status(exc)
    if isinstance(exc, EngineOverloaded):
        status = OVERLOADED_STATUS
    info = error_body(exc).error
    message = info.message
    if info.param and info.param not in message:   # Anthropic's body has no `param`: name it here
        message = f"{message} (at {info.param})"
    return status, anthropic_error_body(status, message)


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}` with the Anthropic error type of `status`."""
    error_type = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": error_type, "message": message}}


def error_response(
    exc: BaseException, headers: dict[str, str] | None = None, path: str | None = None
) -> JSONResponse:
    """A JSONResponse with the status and body of `exc`; Anthropic's shape when `path` (the
    request's) is an Anthropic route."""
    if is_anthropic_route(path):
        status, body = anthropic_error(exc)
        return JSONResponse(body, status_code=status, headers=headers)
    status, _, _ = error_status(exc)
    return JSONResponse(error_body(exc).model_dump(), status_code=status, headers=headers)


RETRY_AFTER_S = 1
"""Seconds sent in Retry-After with 429 (overloaded) and 503 (shutting down): long enough for
running requests to free a slot, short enough that a retry loop behind a router moves on quickly."""


def error_headers(exc: BaseException) -> dict[str, str] | None:
    """Headers that go with the error response of `exc`: WWW-Authenticate for a 401, Retry-After
    (RETRY_AFTER_S seconds) when a retry later may succeed; None when there are none."""
    if isinstance(exc, AuthenticationFailed):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, (EngineOverloaded, ServerShuttingDown, ReplicaUnavailable)):
        return {"Retry-After": str(RETRY_AFTER_S)}
    return None


def _http_error_body(status: int, message: str, path: str) -> dict[str, object]:
    if is_anthropic_route(path):
        return anthropic_error_body(status, message)
    error_type = "invalid_request_error" if status < 500 else "server_error"
    info = ErrorInfo(message=bounded(message, MAX_ERROR_MESSAGE_CHARS), type=error_type)
    return ErrorResponse(error=info).model_dump()


async def _handle_known(request: Request, exc: Exception) -> JSONResponse:
    status, _, _ = error_status(exc)
    if status >= 500:
        logger.error("request %s failed: %s", getattr(request.state, "request_id", "-"), exc)
    return error_response(exc, error_headers(exc), request.url.path)


async def _handle_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(
        _http_error_body(exc.status_code, str(exc.detail), request.url.path),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _handle_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(invalid_request_from_errors(list(exc.errors()), None), path=request.url.path)


def invalid_request_from_errors(errors: list[Any], data: Any) -> ApiError:
    """Turn pydantic validation errors into one InvalidRequest (NotSupported when every error of
    the reported field is a `not_supported` error) whose `param` is the field path, e.g.
    `messages[0].content`. `data` is the parsed JSON body, used to tell field names from the union
    member tags pydantic puts into `loc`; None formats `loc` as is."""
    if not errors:
        return InvalidRequest("invalid request body")
    if errors[0]["type"] == "json_invalid":
        return InvalidRequest(f"the request body is not valid JSON: {errors[0]['msg']}")
    paths = [_param_path(tuple(e["loc"]), data, e.get("type") == "missing") for e in errors]
    # the deepest path is the union member that matched furthest (e.g. the bad part of a list)
    param = max(paths, key=lambda p: (p or "").count(".") + (p or "").count("["))
    group = [e for e, p in zip(errors, paths, strict=True) if p == param]
    first = group[0]
    if param is None and first["type"] == "model_type":
        return InvalidRequest("the request body must be a JSON object")
    if first["type"] == "extra_forbidden":
        return InvalidRequest(f"Unrecognized request argument supplied: {param}", param=param)
    if first["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'", param=param)
    message = " or ".join(dict.fromkeys(str(e["msg"]) for e in group))
    if all(e["type"] == "not_supported" for e in group):
        return NotSupported(message, param=param)
    return InvalidRequest(f"Invalid value for '{param}': {message}" if param else message, param=param)


def _param_path(loc: tuple[Any, ...], data: Any, missing: bool = False) -> str | None:
    """The request-body path of a pydantic error `loc` ("messages[0].content"), keeping only keys
    present in `data`; a last key absent from `data` counts only when the error is `missing`
    (otherwise it is a union member tag such as 'str' for a dict sent where a string belongs)."""
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    parts: list[str] = []
    current = data
    for i, key in enumerate(loc):
        if isinstance(key, int) and (data is None or (isinstance(current, list) and 0 <= key < len(current))):
            parts.append(f"[{key}]")
            current = current[key] if isinstance(current, list) else None
        elif isinstance(key, str) and (data is None or (isinstance(current, dict) and key in current)):
            parts.append(f".{key}" if parts else key)
            current = current.get(key) if isinstance(current, dict) else None
        elif missing and isinstance(key, str) and i == len(loc) - 1 and isinstance(current, dict) and "[" not in key:
            parts.append(f".{key}" if parts else key)  # a missing field ("literal[...]" is a union tag)
        # anything else is a union member tag ('str', 'list[int]', 'user'), not part of the path
    return "".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers: api and engine errors through ERROR_STATUS, HTTP errors (404, 405)
    and FastAPI validation errors as OpenAI bodies. Unexpected exceptions are turned into a 500
    by `api/http/middleware.py`, which also keeps the x-request-id header on them."""
    app.add_exception_handler(ApiError, _handle_known)
    app.add_exception_handler(EngineError, _handle_known)
    app.add_exception_handler(GrammarError, _handle_known)
    app.add_exception_handler(ToolParserError, _handle_known)
    app.add_exception_handler(LoraError, _handle_known)
    app.add_exception_handler(StarletteHTTPException, _handle_http)
    app.add_exception_handler(RequestValidationError, _handle_validation)
