"""The POST /v1/responses request body: OpenAI fields verbatim, plus `stop`, `seed` and `cache_salt` (vLLM).

Served: model, input, instructions, tools (function), tool_choice, parallel_tool_calls,
text.format, max_output_tokens, temperature, top_p, metadata, store, previous_response_id,
stream, background, user, top_logprobs and include's "message.output_text.logprobs" (either one
asks for logprobs on output_text). Accepted and ignored (no effect on a self-hosted text model):
the other include values, truncation, reasoning, service_tier, prompt_cache_*, safety_identifier,
stream_options, text.verbosity. A 400 naming the field: unknown fields, non-function tools and tool
choices, and, when set, conversation, prompt, context_management and max_tool_calls.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import NestedModel, RequestModel
from api.protocol.sampling_fields import SEED_SCHEMA, TEMPERATURE_SCHEMA
from api.protocol.validators import Stop, other_type, reject_type, reject_when_set, type_of
from api.responses.protocol.items import InputItem
from engine import MAX_LOGPROBS

_MAX_METADATA_PAIRS = 16


class FunctionTool(NestedModel):
    """`{"type": "function", "name", "description", "parameters", "strict"}`."""

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class UnsupportedTool(NestedModel):
    """A hosted or non-function tool (web_search, file_search, computer_use_preview, mcp, ...)."""

    type: str = other_type("function")

    _reject = field_validator("type")(
        reject_type("tool type '{t}' is not supported by this server; only 'function' tools are")
    )


def _type_tag(value: Any) -> str | None:
    tag = type_of(value)
    if tag is None:
        return None
    return "function" if tag == "function" else "other"


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[UnsupportedTool, Tag("other")],
    Discriminator(_type_tag, custom_error_type="invalid_value", custom_error_message="a tool needs a `type`"),
]


class FunctionToolChoice(NestedModel):
    """`{"type": "function", "name": ...}`: this function must be called."""

    type: Literal["function"]
    name: str = Field(min_length=1)


class UnsupportedToolChoice(NestedModel):
    """A tool choice naming a hosted tool, allowed_tools, mcp, custom, ...: rejected."""

    type: str = other_type("function")

    _reject = field_validator("type")(
        reject_type("tool_choice type '{t}' is not supported; send none, auto, required or a function")
    )


def _choice_tag(value: Any) -> str | None:
    return "mode" if isinstance(value, str) else _type_tag(value)


ResponsesToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("mode")]
    | Annotated[FunctionToolChoice, Tag("function")]
    | Annotated[UnsupportedToolChoice, Tag("other")],
    Discriminator(
        _choice_tag, custom_error_type="invalid_value", custom_error_message="tool_choice needs a `type`"
    ),
]


class TextFormatText(NestedModel):
    """`{"type": "text"}`: no constraint."""

    type: Literal["text"]


class TextFormatJsonObject(NestedModel):
    """`{"type": "json_object"}`: any JSON object."""

    type: Literal["json_object"]


class TextFormatJsonSchema(NestedModel):
    """`{"type": "json_schema", "name", "schema", "description", "strict"}` (flat, unlike chat)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(min_length=1)
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(NestedModel):
    """`text`: the output `format`; `verbosity` is accepted and ignored."""

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(RequestModel):
    """POST /v1/responses (see the module docstring for what is served, ignored and refused)."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, json_schema_extra={"minimum": 1})
    temperature: float | None = Field(default=None, json_schema_extra=TEMPERATURE_SCHEMA)
    top_p: float | None = Field(default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
    metadata: dict[str, str] | None = None
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, min_length=1)
    stream: bool | None = None
    background: bool | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    top_logprobs: int | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": MAX_LOGPROBS})
    max_tool_calls: int | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    context_management: list[Any] | None = None
    # vLLM extensions
    stop: Stop = None
    seed: int | None = Field(default=None, json_schema_extra=SEED_SCHEMA)
    cache_salt: str | None = Field(default=None, min_length=1)   # see engine/block_hash.py

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and len(value) > _MAX_METADATA_PAIRS:
            raise PydanticCustomError("invalid_value", "metadata holds at most 16 key-value pairs")
        return value

    _unsupported = field_validator("max_tool_calls", "conversation", "prompt", "context_management")(
        reject_when_set
    )

    def logprobs(self) -> int | None:
        """Alternatives per output_text token (`top_logprobs`, default 0) when logprobs are asked
        for, by include "message.output_text.logprobs" or by top_logprobs > 0; else None."""
        if "message.output_text.logprobs" in (self.include or []) or self.top_logprobs:
            return self.top_logprobs or 0
        return None

    def stop_list(self) -> tuple[str, ...]:
        """`stop` as a tuple (a single string becomes one element)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
