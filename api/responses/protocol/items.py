"""The input items of a /v1/responses request (`input` as a list), OpenAI shapes verbatim.

Served: message items (roles user, system, developer, assistant; `type` may be left out, as the
OpenAI SDK and the agents SDK do for `{"role", "content"}`), `function_call` items (earlier calls
of the model) and `function_call_output` items (their results). Every other item type
(item_reference, reasoning, computer_call_output, mcp_call, ...) is a 400 naming the type, and so
are non-text content parts. Unknown keys inside an item are ignored (clients round-trip
`status`, `annotations`, `logprobs`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import NestedModel
from api.protocol.validators import other_type, type_of

SUPPORTED_ITEM_TYPES = ("message", "function_call", "function_call_output")
_TEXT_PART_TYPES = ("input_text", "output_text")
_MEDIA_PART_TYPES = frozenset({"input_image", "input_file", "input_audio"})


class TextPart(NestedModel):
    """`{"type": "input_text" | "output_text", "text": ...}`."""

    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(NestedModel):
    """`{"type": "refusal", "refusal": ...}` in an earlier assistant message."""

    type: Literal["refusal"]
    refusal: str


class UnsupportedPart(NestedModel):
    """Any other content part type: rejected with a message naming it."""

    type: str = other_type(*_TEXT_PART_TYPES, "refusal")

    @field_validator("type")
    @classmethod
    def _reject(cls, value: str) -> str:
        if value in _MEDIA_PART_TYPES:
            raise PydanticCustomError(
                "not_supported",
                "content part type '{t}' is not supported: this server serves text-only models",
                {"t": value},
            )
        raise PydanticCustomError(
            "invalid_value",
            "unknown content part type '{t}'; expected input_text or output_text",
            {"t": value},
        )


def _part_tag(value: Any) -> str | None:
    part_type = type_of(value)
    if part_type is None:
        return None
    if part_type in _TEXT_PART_TYPES:
        return "text"
    return "refusal" if part_type == "refusal" else "other"


ContentPart = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[RefusalPart, Tag("refusal")]
    | Annotated[UnsupportedPart, Tag("other")],
    Discriminator(
        _part_tag, custom_error_type="invalid_value", custom_error_message="a content part needs a `type`"
    ),
]


class MessageItem(NestedModel):
    """A message; `content` is a string or a list of text parts."""

    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        """The message's text: list content joined by newlines (refusals included as text)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)  # type: ignore[union-attr]


class FunctionCallItem(NestedModel):
    """An earlier tool call of the model: `call_id` pairs it with its function_call_output."""

    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(NestedModel):
    """The result of the call `call_id`: a string, or a list of input_text parts."""

    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]

    def text(self) -> str:
        """The output as text (list parts joined by newlines)."""
        if isinstance(self.output, str):
            return self.output
        return "\n".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.output)  # type: ignore[union-attr]


class UnsupportedItem(NestedModel):
    """Any other item type: rejected with a message naming it."""

    type: str = other_type(*SUPPORTED_ITEM_TYPES)

    @field_validator("type")
    @classmethod
    def _reject(cls, value: str) -> str:
        raise PydanticCustomError(
            "not_supported",
            "input item type '{t}' is not supported by this server; supported: {supported}",
            {"t": value, "supported": ", ".join(SUPPORTED_ITEM_TYPES)},
        )


def _item_tag(value: Any) -> str | None:
    if not isinstance(value, dict):
        return getattr(value, "type", None)
    item_type = value.get("type")
    if item_type is None:
        return "message" if "role" in value else None
    return item_type if item_type in SUPPORTED_ITEM_TYPES else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[UnsupportedItem, Tag("other")],
    Discriminator(
        _item_tag,
        custom_error_type="invalid_value",
        custom_error_message="an input item needs a `type` (message, function_call, function_call_output) "
        "or a `role`",
    ),
]
"""One entry of `input`: a message, function_call or function_call_output item."""
