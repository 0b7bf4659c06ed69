"""The admin endpoints' shapes: /tokenize and /detokenize (vLLM), /v1/models, the LoRA
adapter load/unload bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import RequestModel, ResponseModel
from api.protocol.messages import ChatMessage, Tool, ToolChoice



class TokenizeRequest(RequestModel):
    """Either `prompt` (text, `add_special_tokens` default True) or `messages` (rendered with the
    chat template, `add_generation_prompt` default True), not both. With `messages`, `tools` and
    `tool_choice` mean what they mean in a chat request, so the count is the prompt chat sends."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
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


class ModelCard(ResponseModel):
    """One served model; `root` is the model path, `parent` the base model of an adapter."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "structserve"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(ResponseModel):
    """`{"object": "list", "data": [...]}`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoraAdapterRequest(RequestModel):
    """Load the PEFT adapter in folder `lora_path` (on the server) under `lora_name`;
    `load_inplace` replaces an adapter already loaded under that name."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoraAdapterRequest(RequestModel):
    """Unload the adapter `lora_name` (`lora_int_id` is accepted for vLLM clients and ignored)."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None
