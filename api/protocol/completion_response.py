"""Completion response objects (`object: "text_completion"`, whole and streamed alike)."""

from __future__ import annotations

from typing import Literal

from api.protocol.common import ResponseModel, Usage
from api.protocol.logprobs import CompletionLogprobs


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
