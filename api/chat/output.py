"""Engine outputs -> chat.completion (whole) or chat.completion.chunk objects (streamed)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from api.protocol.logprobs_content import ContentLogprobs
from api.protocol.logprobs_output import LogprobFormatter
from api.chat.protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    DeltaMessage,
)
from api.protocol.common import Usage
from api.protocol.logprobs import ChoiceLogprobs
from api.protocol.response_meta import ResponseMeta
from api.chat.tool_deltas import ToolCallDeltas
from api.generation.constraints import ToolCalling
from api.generation.reader import OutputReader, ToolCallObserver
from api.protocol.messages import FunctionCall, ToolCall
from engine import CompletionDelta, RequestOutput, TokenLogprob

Outputs = AsyncIterator[tuple[int, RequestOutput]]


@dataclass(frozen=True, slots=True)
class ChatOutputOptions:
    """`n` choices; logprobs wanted; usage chunk at the end; running usage on every chunk;
    `tool_calling`: parse each choice's text into content and tool calls (None: all content);
    `on_tool_calls`: sees the parsed calls (metrics)."""

    n: int = 1
    logprobs: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    tool_calling: ToolCalling | None = None
    on_tool_calls: ToolCallObserver | None = None


def usage_of(out: RequestOutput) -> Usage:
    """Usage from an output's running totals."""
    return Usage.of(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)


async def chat_chunks(
    outputs: Outputs, meta: ResponseMeta, options: ChatOutputOptions, fmt: LogprobFormatter
) -> AsyncIterator[ChatCompletionChunk]:
    """The chunks of a streamed chat completion.

    Per choice: a first chunk with role "assistant" and content "", one chunk per non-empty text
    delta, then a chunk with an empty delta and the finish_reason. With include_usage, one last
    chunk with `choices: []` and the totals. With tool calling, text deltas go through one
    `OutputReader` per choice (content, call headers and argument fragments as generated, shaped
    by `ToolCallDeltas`; finish_reason "tool_calls" after calls).
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
    tool_calling = options.tool_calling
    streams = (
        [ToolCallDeltas(OutputReader(tool_calling, options.on_tool_calls)) for _ in range(options.n)]
        if tool_calling
        else None
    )
    contents = None
    if tool_calling and options.logprobs:
        contents = [ContentLogprobs(fmt.token_bytes) for _ in range(options.n)]
    last: RequestOutput | None = None
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for _, out in outputs:
            running = usage_of(out) if options.continuous_usage else None
            for delta in out.deltas:
                stream = streams[delta.index] if streams is not None else None
                messages = _delta_messages(stream, delta)
                logprobs = None
                if options.logprobs:
                    entries = delta.logprobs or []
                    if contents is not None:
                        text = "".join(m.content or "" for m in messages)
                        final = delta.finish_reason is not None
                        entries = contents[delta.index].read(entries, text, final)
                    logprobs = fmt.chat(entries)
                if not messages and logprobs is not None and logprobs.content:
                    messages = [DeltaMessage(content="")]    # the entries of text released earlier
                for i, message in enumerate(messages):
                    yield chunk(delta.index, message, logprobs if i == 0 else None, usage=running)
                if delta.finish_reason is not None:
                    reason = delta.finish_reason
                    if stream is not None:
                        reason = stream.reader.finish_reason
                    yield chunk(delta.index, DeltaMessage(), finish_reason=reason, usage=running)
            last = out
    if options.include_usage and last is not None:
        yield ChatCompletionChunk(
            id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage_of(last)
        )


def _delta_messages(stream: ToolCallDeltas | None, delta: CompletionDelta) -> list[DeltaMessage]:
    """The deltas to send for one engine delta."""
    if stream is not None:
        return stream.deltas(delta.text, delta.finish_reason)
    return [DeltaMessage(content=delta.text)] if delta.text else []


async def chat_completion(
    outputs: Outputs, meta: ResponseMeta, options: ChatOutputOptions, fmt: LogprobFormatter
) -> ChatCompletion:
    """Gather every output of a request into one chat.completion object."""
    texts: list[list[str]] = [[] for _ in range(options.n)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(options.n)]
    finals: list[CompletionDelta | None] = [None] * options.n
    last: RequestOutput | None = None
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for _, out in outputs:
            for delta in out.deltas:
                texts[delta.index].append(delta.text)
                logprobs[delta.index].extend(delta.logprobs or [])
                if delta.finish_reason is not None:
                    finals[delta.index] = delta
            last = out
    assert last is not None, "a started stream has at least one output"
    choices = [_whole_choice(i, "".join(texts[i]), finals[i], options) for i in range(options.n)]
    if options.logprobs:
        choices = [
            c.model_copy(update={"logprobs": fmt.chat(_content_entries(options, fmt, logprobs[c.index], c))})
            for c in choices
        ]
    return ChatCompletion(
        id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage_of(last)
    )


def _content_entries(
    options: ChatOutputOptions, fmt: LogprobFormatter, entries: list[TokenLogprob],
    choice: ChatCompletionChoice,
) -> list[TokenLogprob]:
    """A whole choice's logprob entries: all of them, or with tool calling those of its content only."""
    if options.tool_calling is None:
        return entries
    return ContentLogprobs(fmt.token_bytes).read(entries, choice.message.content or "", final=True)


def _whole_choice(
    index: int, text: str, final: CompletionDelta | None, options: ChatOutputOptions
) -> ChatCompletionChoice:
    """One choice of a whole answer (`final`: its last engine delta, with the finish_reason); with
    tool calling, `text` split into content and tool calls and the finish_reason decided by the
    reader."""
    tool_calling = options.tool_calling
    finish_reason = final.finish_reason if final is not None else None
    if tool_calling is None or final is None or final.finish_reason is None:
        message = ChatCompletionMessage(content=text)
    else:
        reader = OutputReader(tool_calling, options.on_tool_calls)
        read = reader.read_whole(text, final.finish_reason)
        calls = [
            ToolCall(
                id=call.id, type="function", function=FunctionCall(name=call.name, arguments=call.arguments)
            )
            for call in read.tool_calls
        ]
        # content is None when calls were made and no other text was written
        content = read.content if read.content or not calls else None
        message = ChatCompletionMessage(content=content, tool_calls=calls or None)
        finish_reason = reader.finish_reason
    return ChatCompletionChoice(index=index, message=message, finish_reason=finish_reason)
