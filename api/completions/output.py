"""Engine outputs -> text_completion objects, whole or streamed (several prompts, n choices each)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from api.completions.prompts import PromptInput
from api.protocol.logprobs_output import LogprobFormatter
from api.protocol.common import Usage
from api.completions.protocol import Completion, CompletionChoice
from api.protocol.logprobs import CompletionLogprobs
from api.protocol.response_meta import ResponseMeta
from engine import RequestOutput, TokenLogprob

Outputs = AsyncIterator[tuple[int, RequestOutput]]


@dataclass(frozen=True, slots=True)
class CompletionOutputOptions:
    """`n` choices per prompt; `echo` the prompt; logprobs wanted; usage chunk; running usage."""

    n: int = 1
    echo: bool = False
    logprobs: bool = False
    include_usage: bool = False
    continuous_usage: bool = False


def total_usage(latest: dict[int, RequestOutput]) -> Usage:
    """Usage summed over the prompts' latest outputs."""
    outs = latest.values()
    return Usage.of(
        sum(o.num_prompt_tokens for o in outs),
        sum(o.num_output_tokens for o in outs),
        sum(o.num_cached_tokens for o in outs),
    )


async def completion_chunks(
    outputs: Outputs,
    meta: ResponseMeta,
    prompts: list[PromptInput],
    options: CompletionOutputOptions,
    fmt: LogprobFormatter,
) -> AsyncIterator[Completion]:
    """The chunks of a streamed completion: with `echo`, first each choice's prompt text; then one
    chunk per delta (the last carries finish_reason); with include_usage, a final `choices: []` chunk.
    Choice index = prompt index * n + choice index."""

    def chunk(
        index: int,
        text: str,
        logprobs: CompletionLogprobs | None = None,
        finish_reason: str | None = None,
        usage: Usage | None = None,
    ) -> Completion:
        choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason)
        return Completion(id=meta.id, created=meta.created, model=meta.model, choices=[choice], usage=usage)

    offsets: dict[int, int] = {}
    if options.echo:
        for p, prompt in enumerate(prompts):
            for j in range(options.n):
                offsets[p * options.n + j] = len(prompt.text)
                yield chunk(p * options.n + j, prompt.text)
    latest: dict[int, RequestOutput] = {}
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for p, out in outputs:
            latest[p] = out
            running = total_usage(latest) if options.continuous_usage else None
            for delta in out.deltas:
                index = p * options.n + delta.index
                offset = offsets.get(index, 0)   # where this delta's first logprob token starts
                logprobs = fmt.completion(delta.logprobs, offset) if options.logprobs else None
                offsets[index] = offset + fmt.text_length(delta.logprobs or [])
                if delta.text or delta.finish_reason or (logprobs is not None and logprobs.tokens):
                    yield chunk(index, delta.text, logprobs, delta.finish_reason, running)
    if options.include_usage and latest:
        yield Completion(
            id=meta.id, created=meta.created, model=meta.model, choices=[], usage=total_usage(latest)
        )


async def completion(
    outputs: Outputs,
    meta: ResponseMeta,
    prompts: list[PromptInput],
    options: CompletionOutputOptions,
    fmt: LogprobFormatter,
) -> Completion:
    """Gather every output into one text_completion object."""
    num_choices = len(prompts) * options.n
    texts: list[list[str]] = [[] for _ in range(num_choices)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(num_choices)]
    finish_reasons: list[str | None] = [None] * num_choices
    latest: dict[int, RequestOutput] = {}
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for p, out in outputs:
            latest[p] = out
            for delta in out.deltas:
                index = p * options.n + delta.index
                texts[index].append(delta.text)
                logprobs[index].extend(delta.logprobs or [])
                finish_reasons[index] = delta.finish_reason or finish_reasons[index]
    choices = []
    for index in range(num_choices):
        prefix = prompts[index // options.n].text if options.echo else ""
        choices.append(
            CompletionChoice(
                index=index,
                text=prefix + "".join(texts[index]),
                logprobs=fmt.completion(logprobs[index], len(prefix)) if options.logprobs else None,
                finish_reason=finish_reasons[index],
            )
        )
    return Completion(
        id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=total_usage(latest)
    )
