"""Exceptions raised by lora/; `api/errors.py` maps each to an HTTP status."""

from __future__ import annotations


class LoraError(Exception):
    """Base of every LoRA exception. `param` names the request field at fault, if any."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidLoraAdapter(LoraError):
    """An adapter folder is missing, unreadable, of an unsupported kind, or does not fit the base
    model (shapes, layers, rank above --max-lora-rank) (HTTP 400)."""


class LoraAdapterNotFound(LoraError):
    """No loaded adapter has this name (HTTP 404, code model_not_found)."""


class LoraAdapterExists(LoraError):
    """An adapter of this name is already loaded and no in-place reload was asked for (HTTP 400)."""


class LoraNotEnabled(LoraError):
    """LoRA is off (no --enable-lora) or run-time loading is off (no --allow-runtime-lora) (HTTP 400)."""
