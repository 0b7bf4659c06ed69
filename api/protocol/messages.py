"""Chat messages, tools, tool_choice and response_format as OpenAI sends them.

Only text content is served: other content part types are a 400 that says so.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import NestedModel

_MEDIA_PART_TYPES = frozenset({"image_url", "input_image", "input_audio", "audio_url", "video_url", "file"})


class ContentPart(NestedModel):
    """One part of a list-valued message `content`; only `{"type": "text", "text": ...}` is served."""

    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _only_text(cls, value: str) -> str:
        if value == "text":
            return value
        if value in _MEDIA_PART_TYPES:
            raise PydanticCustomError(
                "not_supported",
                "content part type '{part_type}' is not supported: this server serves text-only models",
                {"part_type": value},
            )
        raise PydanticCustomError(
            "invalid_value", "unknown content part type '{part_type}'; expected 'text'", {"part_type": value}
        )

    @model_validator(mode="after")
    def _text_present(self) -> ContentPart:
        if self.text is None:
            raise PydanticCustomError("missing", "a content part of type 'text' needs a 'text' string")
        return self


MessageContent = str | list[ContentPart]


class SystemMessage(NestedModel):
    """`role: system`."""

    role: Literal["system"]
    content: MessageContent
    name: str | None = None


class DeveloperMessage(NestedModel):
    """`role: developer` (rendered as system: chat templates do not know the role)."""

    role: Literal["developer"]
    content: MessageContent
    name: str | None = None


class UserMessage(NestedModel):
    """`role: user`."""

    role: Literal["user"]
    content: MessageContent
    name: str | None = None


class FunctionCall(NestedModel):
    """A function call as the assistant made it; `arguments` is JSON text."""

    name: str
    arguments: str


class ToolCall(NestedModel):
    """One tool call of an assistant message (request history and responses alike)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(NestedModel):
    """`role: assistant`: earlier model output, with content and/or tool calls."""

    role: Literal["assistant"]
    content: MessageContent | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class ToolMessage(NestedModel):
    """`role: tool`: the result of the tool call `tool_call_id`."""

    role: Literal["tool"]
    content: MessageContent
    tool_call_id: str


ChatMessage = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]


class FunctionDefinition(NestedModel):
    """A callable function: name, description, JSON-schema `parameters`, `strict`."""

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(NestedModel):
    """An entry of `tools`; only `type: function` tools exist here."""

    type: str
    function: FunctionDefinition

    @field_validator("type")
    @classmethod
    def _only_function(cls, value: str) -> str:
        if value == "function":
            return value
        if value == "custom":
            raise PydanticCustomError("not_supported", "custom tools are not supported; use function tools")
        raise PydanticCustomError(
            "invalid_value", "unknown tool type '{t}'; expected 'function'", {"t": value}
        )


class NamedFunction(NestedModel):
    """`{"name": ...}` inside a named tool choice."""

    name: str


class NamedToolChoice(NestedModel):
    """`{"type": "function", "function": {"name": ...}}`: this function must be called."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ResponseFormatText(NestedModel):
    """`{"type": "text"}`: no constraint."""

    type: Literal["text"]


class ResponseFormatJsonObject(NestedModel):
    """`{"type": "json_object"}`: any JSON object."""

    type: Literal["json_object"]


class JsonSchemaFormat(NestedModel):
    """The `json_schema` object of a json_schema response format."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatJsonSchema(NestedModel):
    """`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
    Field(discriminator="type"),
]
