"""Engine TokenLogprobs -> the OpenAI logprob shapes (chat, legacy completions, Responses).

Each entry's `token` is its part of the returned text (`TokenLogprob.text_bytes`) and `bytes` those
UTF-8 bytes, so the entries' bytes joined equal the returned text; a token holding part of a
multi-byte character reads as its bytes escaped (`"\\xf0\\x9f"`, as DeepSeek and OpenAI write it).
Alternatives the sampler saw at -inf (masked by the grammar, banned by logit_bias or min_tokens)
are omitted, not clamped: they were not possible tokens, so `top_logprobs` can hold fewer than
asked. A non-finite sampled logprob (never expected: a sampled token is allowed) is clamped to
OpenAI's -9999.0 so the JSON stays valid.
"""

from __future__ import annotations

import math
from typing import Any

from api.protocol.logprobs import ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs, TopLogprob
from engine import TokenLogprob

# OpenAI's value for a very unlikely token; JSON has no -inf
MIN_LOGPROB = -9999.0


def token_string(data: bytes) -> str:
    """The `token` string of `data`: its UTF-8 text, undecodable bytes escaped as `\\xNN`."""
    return data.decode("utf-8", errors="backslashreplace")


class LogprobFormatter:
    """Formats one response's logprobs. Entries the engine released carry their bytes; one
    without (`text_bytes` None: made by hand, as the api tests' fake engine does) falls back to
    the tokenizer's decoding of its id, decoded once per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._bytes: dict[int, bytes] = {}

    def token_bytes(self, lp: TokenLogprob) -> bytes:
        """The sampled token's part of the returned text, in UTF-8."""
        return lp.text_bytes if lp.text_bytes is not None else self._decoded(lp.token_id)

    def text_length(self, logprobs: list[TokenLogprob]) -> int:
        """Characters of the text the entries carry (their bytes joined; a partial character at the
        end does not count)."""
        return len(b"".join(self.token_bytes(lp) for lp in logprobs).decode("utf-8", errors="ignore"))

    def chat(self, logprobs: list[TokenLogprob] | None) -> ChoiceLogprobs | None:
        """`choices[].logprobs` of a chat completion or chunk (None when none were requested)."""
        if logprobs is None:
            return None
        return ChoiceLogprobs(content=self.chat_entries(logprobs))

    def chat_entries(self, logprobs: list[TokenLogprob]) -> list[ChatTokenLogprob]:
        """One `{token, logprob, bytes, top_logprobs}` per entry (chat's `content` list, and the
        Responses output_text `logprobs` list, which has the same shape)."""
        return [self._chat_entry(lp) for lp in logprobs]

    def completion(self, logprobs: list[TokenLogprob] | None, text_offset: int) -> CompletionLogprobs | None:
        """`choices[].logprobs` of a text completion; `text_offset` is the character offset in the
        choice's text where the first entry's text starts."""
        if logprobs is None:
            return None
        tokens, offsets = [], []
        joined = b""
        for lp in logprobs:
            data = self.token_bytes(lp)
            tokens.append(token_string(data))
            offsets.append(text_offset + len(joined.decode("utf-8", errors="ignore")))
            joined += data
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=[_finite(lp.logprob) for lp in logprobs],
            top_logprobs=[{token_string(data): value for data, value in self._tops(lp)} for lp in logprobs],
            text_offset=offsets,
        )

    def _chat_entry(self, lp: TokenLogprob) -> ChatTokenLogprob:
        data = self.token_bytes(lp)
        return ChatTokenLogprob(
            token=token_string(data),
            logprob=_finite(lp.logprob),
            bytes=list(data),
            top_logprobs=[TopLogprob(token=token_string(d), logprob=v, bytes=list(d))
                          for d, v in self._tops(lp)],
        )

    def _tops(self, lp: TokenLogprob) -> list[tuple[bytes, float]]:
        """(bytes, logprob) of each finite alternative, best first."""
        tops = []
        for i, (token_id, value) in enumerate(lp.top):
            if not math.isfinite(value):
                continue
            data = lp.top_bytes[i] if i < len(lp.top_bytes) else self._decoded(token_id)
            tops.append((data, value))
        return tops

    def _decoded(self, token_id: int) -> bytes:
        data = self._bytes.get(token_id)
        if data is None:
            data = self._tokenizer.decode([token_id]).encode("utf-8")
            self._bytes[token_id] = data
        return data


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else MIN_LOGPROB
