"""Pieces shared by the request and response models: base configs, stream options, usage, errors.

Request policy (documented in the README): unknown top-level fields are rejected with 400 naming
the field, as OpenAI does; unknown keys inside nested objects (messages, tools, parts) are ignored,
because agent frameworks round-trip provider-specific keys there (`reasoning_content`, `annotations`).
Explicit null on an optional field means "use the default".
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class RequestModel(BaseModel):
    """Base of top-level request bodies: unknown fields are a 400."""

    model_config = ConfigDict(extra="forbid")


class NestedModel(BaseModel):
    """Base of objects nested in a request body: unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")


class ResponseModel(BaseModel):
    """Base of response objects."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(NestedModel):
    """`stream_options`: `include_usage` adds one final usage chunk with empty choices;
    `continuous_usage_stats` (vLLM) puts running usage on every chunk."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False
    include_obfuscation: bool | None = None


class PromptTokensDetails(ResponseModel):
    """Prompt token breakdown; `cached_tokens` were served by the prefix cache."""

    cached_tokens: int = 0


class Usage(ResponseModel):
    """Token counts of one response (all choices together for completion tokens)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, num_prompt_tokens: int, num_output_tokens: int, num_cached_tokens: int) -> Usage:
        """Build a Usage whose total is prompt + completion."""
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_output_tokens,
            total_tokens=num_prompt_tokens + num_output_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached_tokens),
        )


class ErrorInfo(ResponseModel):
    """The inner OpenAI error object; `code` is a string or null, never the HTTP status."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    """`{"error": {...}}`, the body of every non-2xx response and of an in-stream failure."""

    error: ErrorInfo


class SparseResponseModel(ResponseModel):
    """A response object whose null fields are left out (chunk deltas, optional message keys)."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}
