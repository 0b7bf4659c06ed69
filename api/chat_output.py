"""Engine outputs -> chat.completion (whole) or chat.completion.chunk objects (streamed)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from api.logprobs_output import LogprobFormatter
from api.protocol.chat_response import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    DeltaMessage,
)
from api.protocol.common import Usage
from api.protocol.logprobs import ChoiceLogprobs
from api.response_meta import ResponseMeta
from engine.request import RequestOutput, TokenLogprob

Outputs = AsyncIterator[tuple[int, RequestOutput]]


@dataclass(frozen=True, slots=True)
class ChatOutputOptions:
    """`n` choices; logprobs wanted; usage chunk at the end; running usage on every chunk."""

    n: int = 1
    logprobs: bool = False
    include_usage: bool = False
    continuous_usage: bool = False


def usage_of(out: RequestOutput) -> Usage:
    """Usage from an output's running totals."""
    return Usage.of(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)


async def chat_chunks(
    outputs: Outputs, meta: ResponseMeta, options: ChatOutputOptions, fmt: LogprobFormatter
) -> AsyncIterator[ChatCompletionChunk]:
    """The chunks of a streamed chat completion.

    Per choice: a first chunk with role "assistant" and content "", one chunk per non-empty text
    delta, then a chunk with an empty delta and the finish_reason. With include_usage, one last
    chunk with `choices: []` and the totals.
    """

    def chunk(
        index: int,
        delta: DeltaMessage,
        logprobs: ChoiceLogprobs | None = None,
        finish_reason: str | None = None,
        usage: Usage | None = None,
    ) -> ChatCompletionChunk:
        choice = ChatCompletionChunkChoice(
            index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason
        )
        return ChatCompletionChunk(
            id=meta.id, created=meta.created, model=meta.model, choices=[choice], usage=usage
        )

    for index in range(options.n):
        yield chunk(index, DeltaMessage(role="assistant", content=""))
    last: RequestOutput | None = None
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for _, out in outputs:
            running = usage_of(out) if options.continuous_usage else None
            for delta in out.deltas:
                logprobs = fmt.chat(delta.logprobs) if options.logprobs else None
                if delta.text or (logprobs is not None and logprobs.content):
                    yield chunk(delta.index, DeltaMessage(content=delta.text), logprobs, usage=running)
                if delta.finish_reason is not None:
                    yield chunk(delta.index, DeltaMessage(), finish_reason=delta.finish_reason, usage=running)
            last = out
    if options.include_usage and last is not None:
        yield ChatCompletionChunk(
            id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage_of(last)
        )


async def chat_completion(
    outputs: Outputs, meta: ResponseMeta, options: ChatOutputOptions, fmt: LogprobFormatter
) -> ChatCompletion:
    """Gather every output of a request into one chat.completion object."""
    texts: list[list[str]] = [[] for _ in range(options.n)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(options.n)]
    finish_reasons: list[str | None] = [None] * options.n
    last: RequestOutput | None = None
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for _, out in outputs:
            for delta in out.deltas:
                texts[delta.index].append(delta.text)
                logprobs[delta.index].extend(delta.logprobs or [])
                finish_reasons[delta.index] = delta.finish_reason or finish_reasons[delta.index]
            last = out
    assert last is not None, "a started stream has at least one output"
    choices = [
        ChatCompletionChoice(
            index=i,
            message=ChatCompletionMessage(content="".join(texts[i])),
            logprobs=fmt.chat(logprobs[i]) if options.logprobs else None,
            finish_reason=finish_reasons[i],
        )
        for i in range(options.n)
    ]
    return ChatCompletion(
        id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage_of(last)
    )
