"""Exceptions raised by the engine; `api/errors.py` maps each to an HTTP status."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every engine exception. `param` names the request field at fault, if any."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidSamplingParams(EngineError):
    """A sampling parameter is out of range or inconsistent (HTTP 400)."""


class ContextLengthExceeded(EngineError):
    """Prompt tokens + max_tokens exceed max_model_len (HTTP 400)."""


class ModelLoadError(EngineError):
    """The model file or folder cannot be found, read or is of an unsupported architecture."""


class EngineDeadError(EngineError):
    """The engine thread has stopped; no request can be served (HTTP 500)."""


class EngineOverloaded(EngineError):
    """Too many requests are waiting (HTTP 429)."""


class RequestTimedOut(EngineError):
    """The request ran longer than the engine's `request_timeout_s`; it was aborted and its KV
    blocks freed (HTTP 408)."""


class EngineStepError(EngineError):
    """A step failed while this request was in the batch; the request ends, the engine goes on (HTTP 500)."""
