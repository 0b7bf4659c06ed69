"""The /v1/completions shapes: the request body and the text_completion objects (whole and
streamed alike)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import ResponseModel, Usage
from api.protocol.logprobs import CompletionLogprobs
from api.protocol.sampling_fields import SamplingFields
from engine import MAX_LOGPROBS, MAX_N



Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt` is one text, a batch of texts, one token-id list or a batch
    of them; each prompt yields `n` choices, indexed prompt_idx * n + choice_idx.

    `best_of` may only equal `n` (so n's range, checked by SamplingParams, is its range); `suffix`
    (insertion) is rejected with a plain 400.
    """

    prompt: Prompt
    best_of: int | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": MAX_N})
    echo: bool | None = False
    logprobs: int | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": MAX_LOGPROBS})
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise PydanticCustomError("not_supported", "'suffix' (text insertion) is not supported")
        return value


class CompletionChoice(ResponseModel):
    """One choice: index prompt_idx * n + choice_idx; in a stream, `text` is the new fragment."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(ResponseModel):
    """A whole completion, or one streamed chunk of it (same object type; chunks may have usage null)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
