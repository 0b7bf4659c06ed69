"""/v1/completions prompts -> token ids: texts are encoded in a worker thread, id lists checked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from api.errors import InvalidRequest
from api.completions.protocol import Prompt


@dataclass(frozen=True, slots=True)
class PromptInput:
    """One prompt of a completions request: its token ids and its text (for `echo`)."""

    token_ids: list[int]
    text: str


async def tokenize_prompts(
    tokenizer: Any, prompt: Prompt, vocab_size: int, add_special_tokens: bool = True
) -> list[PromptInput]:
    """Normalize `prompt` (text, texts, ids, lists of ids) into a list of PromptInput.

    Raises InvalidRequest (param `prompt`) for an empty batch, an empty prompt or a token id
    outside [0, vocab_size).
    """
    batch = _as_batch(prompt)
    if not batch:
        raise InvalidRequest("prompt must not be an empty list", param="prompt")
    return await asyncio.to_thread(_tokenize_batch, tokenizer, batch, vocab_size, add_special_tokens)


def _as_batch(prompt: Prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [[p for p in prompt if isinstance(p, int)]]
    return [p for p in prompt if isinstance(p, (str, list))]


def _tokenize_batch(
    tokenizer: Any, batch: list[str | list[int]], vocab_size: int, add_special_tokens: bool
) -> list[PromptInput]:
    inputs: list[PromptInput] = []
    for i, item in enumerate(batch):
        param = "prompt" if len(batch) == 1 else f"prompt[{i}]"
        if isinstance(item, str):
            token_ids = list(tokenizer.encode(item, add_special_tokens=add_special_tokens))
            text = item
        else:
            bad = [t for t in item if not 0 <= t < vocab_size]
            if bad:
                raise InvalidRequest(
                    f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})", param=param
                )
            token_ids, text = list(item), tokenizer.decode(item)
        if not token_ids:
            raise InvalidRequest("prompt must not be empty", param=param)
        inputs.append(PromptInput(token_ids=token_ids, text=text))
    return inputs
