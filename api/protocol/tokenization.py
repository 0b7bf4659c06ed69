"""/tokenize and /detokenize bodies (vLLM shapes)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import RequestModel, ResponseModel
from api.protocol.messages import ChatMessage, Tool


class TokenizeRequest(RequestModel):
    """Either `prompt` (text, `add_special_tokens` default True) or `messages` (rendered with the
    chat template, `add_generation_prompt` default True), not both."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError("invalid_value", "give exactly one of 'prompt' or 'messages'")
        return self


class TokenizeResponse(ResponseModel):
    """Token ids of the input, their count and the context limit."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(RequestModel):
    """Token ids to turn back into text."""

    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


class DetokenizeResponse(ResponseModel):
    """The decoded text."""

    prompt: str
