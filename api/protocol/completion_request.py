"""The /v1/completions request body (OpenAI fields verbatim, plus vLLM extensions)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from api.protocol.sampling_fields import SamplingFields

Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt` is one text, a batch of texts, one token-id list or a batch
    of them; each prompt yields `n` choices, indexed prompt_idx * n + choice_idx.

    `best_of` may only equal `n`; `suffix` (insertion) is rejected with a plain 400.
    """

    prompt: Prompt
    best_of: int | None = Field(default=None, ge=1, le=128)
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise PydanticCustomError("not_supported", "'suffix' (text insertion) is not supported")
        return value
