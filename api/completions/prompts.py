"""/v1/completions prompts -> token ids: texts are encoded in a worker thread, id lists taken as
they are (the engine checks them against the vocabulary, `LLMEngine.validate`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from api.errors import InvalidRequest
from api.completions.protocol import Prompt


@dataclass(frozen=True, slots=True)
class PromptInput:
    """One prompt of a completions request: its token ids, and its text as sent (None for a
    prompt of token ids, decoded by `text` with `tokenizer`)."""

    token_ids: list[int]
    sent_text: str | None
    tokenizer: Any = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The prompt as text (for `echo`). Read it once the engine has accepted the request: an
        id outside the vocabulary does not decode."""
        return self.sent_text if self.sent_text is not None else str(self.tokenizer.decode(self.token_ids))


async def tokenize_prompts(tokenizer: Any, prompt: Prompt, add_special_tokens: bool = True) -> list[PromptInput]:
    """Normalize `prompt` (text, texts, ids, lists of ids) into a list of PromptInput.

    Raises InvalidRequest (param `prompt`) for an empty batch.
    """
    batch = _as_batch(prompt)
    if not batch:
        raise InvalidRequest("prompt must not be an empty list", param="prompt")
    return await asyncio.to_thread(_tokenize_batch, tokenizer, batch, add_special_tokens)


def _as_batch(prompt: Prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [[p for p in prompt if isinstance(p, int)]]
    return [p for p in prompt if isinstance(p, (str, list))]


def _tokenize_batch(tokenizer: Any, batch: list[str | list[int]], add_special_tokens: bool) -> list[PromptInput]:
    inputs: list[PromptInput] = []
    for item in batch:
        if isinstance(item, str):
            token_ids = list(tokenizer.encode(item, add_special_tokens=add_special_tokens))
            inputs.append(PromptInput(token_ids, item, tokenizer))
        else:
            inputs.append(PromptInput(list(item), None, tokenizer))
    return inputs
