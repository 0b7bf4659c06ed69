"""The /v1/messages and /v1/messages/count_tokens request bodies, Anthropic's field names verbatim
(https://docs.anthropic.com/en/api/messages; the anthropic SDK's `MessageCreateParams`).

Served content blocks: text, tool_use (earlier calls of the model) and tool_result (their
results, string or text-block content). image, document and the server-tool blocks are a 400
naming the type. Unknown top-level fields are a 400; unknown keys inside blocks and tools are
ignored (clients round-trip `cache_control`, `citations`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import NestedModel, RequestModel
from api.protocol.validators import not_supported, other_type, reject_type, type_of

SERVED_BLOCK_TYPES = ("text", "tool_use", "tool_result")
_MEDIA_BLOCK_TYPES = frozenset({"image", "document", "search_result", "container_upload"})


class TextBlock(NestedModel):
    """`{"type": "text", "text": ...}`."""

    type: Literal["text"]
    text: str


class ToolUseBlock(NestedModel):
    """`{"type": "tool_use", "id", "name", "input"}`: a call the model made earlier."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(NestedModel):
    """`{"type": "tool_result", "tool_use_id", "content", "is_error"}`: the result of a call."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None


class UnsupportedBlock(NestedModel):
    """Any other block type: rejected with a message naming it."""

    type: str = other_type(*SERVED_BLOCK_TYPES)

    @field_validator("type")
    @classmethod
    def _reject(cls, value: str) -> str:
        if value in _MEDIA_BLOCK_TYPES:
            raise PydanticCustomError(
                "not_supported",
                "content block type '{t}' is not supported: this server serves text-only models",
                {"t": value},
            )
        raise PydanticCustomError(
            "not_supported",
            "content block type '{t}' is not supported; send text, tool_use or tool_result blocks",
            {"t": value},
        )


def _block_tag(value: Any) -> str | None:
    tag = type_of(value)
    if tag is None:
        return None
    return tag if tag in SERVED_BLOCK_TYPES else "other"


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[UnsupportedBlock, Tag("other")],
    Discriminator(_block_tag, custom_error_type="invalid_value", custom_error_message="a block needs a `type`"),
]


class InputMessage(NestedModel):
    """One turn of `messages`: content is a string or a list of blocks."""

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class CustomTool(NestedModel):
    """A client tool: name, description and the JSON schema of its `input` object."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class UnsupportedTool(NestedModel):
    """A server tool (web_search, bash, code_execution, ...): rejected naming its type."""

    type: str = other_type("custom")

    _reject = field_validator("type")(
        reject_type("tool type '{t}' is not supported by this server; only client tools with an input_schema are")
    )


def _tool_tag(value: Any) -> str:
    tag = type_of(value)
    return "custom" if tag in (None, "custom") else "other"


ToolDefinition = Annotated[
    Annotated[CustomTool, Tag("custom")] | Annotated[UnsupportedTool, Tag("other")],
    Discriminator(_tool_tag),
]


class ToolChoiceAuto(NestedModel):
    """`{"type": "auto"}`: the model decides."""

    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(NestedModel):
    """`{"type": "any"}`: the model must call some tool."""

    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(NestedModel):
    """`{"type": "tool", "name"}`: the model must call this tool."""

    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(NestedModel):
    """`{"type": "none"}`: no tool calls."""

    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class JsonOutputFormat(NestedModel):
    """`output_config.format`: `{"type": "json_schema", "schema": {...}}` (structured outputs)."""

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(NestedModel):
    """`output_config`: the output format (`effort` is accepted and has no effect here)."""

    format: JsonOutputFormat | None = None
    effort: str | None = None


class ThinkingConfig(NestedModel):
    """`thinking`: only `{"type": "disabled"}` is served (the served models do not think)."""

    type: str

    @field_validator("type")
    @classmethod
    def _disabled_only(cls, value: str) -> str:
        if value != "disabled":
            raise not_supported("thinking")
        return value


class CountTokensRequest(RequestModel):
    """POST /v1/messages/count_tokens: the conversation, system prompt, tools and format of a
    Messages request (no max_tokens, no sampling). `cache_control` is accepted (prefix caching is
    automatic here)."""

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: ThinkingConfig | None = None
    cache_control: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages. `metadata` and `service_tier` are accepted and have no effect;
    temperature is 0..1 and top_k >= 1 as on Anthropic's API: those narrower ranges are this
    protocol's and stay pydantic constraints; the engine's ranges (max_tokens >= 1, top_p in
    (0, 1], non-empty stop_sequences) are SamplingParams' to check."""

    max_tokens: int = Field(json_schema_extra={"minimum": 1})
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
    top_k: int | None = Field(default=None, ge=1)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
