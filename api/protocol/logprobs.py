"""Logprob shapes: chat (`content` list of token entries) and legacy completions (parallel lists)."""

from __future__ import annotations

from api.protocol.common import ResponseModel


class TopLogprob(ResponseModel):
    """One alternative token: its text, logprob and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ResponseModel):
    """The sampled token with its logprob, bytes and the `top_logprobs` alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ResponseModel):
    """`choices[].logprobs` of a chat completion or chunk."""

    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(ResponseModel):
    """`choices[].logprobs` of a text completion: parallel lists, one entry per token.

    `text_offset` is the character offset of each token in the choice's `text`.
    """

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]
