"""Engine TokenLogprobs -> the OpenAI logprob shapes (chat and legacy completions)."""

from __future__ import annotations

import math
from typing import Any

from api.protocol.logprobs import ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs, TopLogprob
from engine import TokenLogprob

# OpenAI's value for a token outside the top alternatives; JSON has no -inf
MIN_LOGPROB = -9999.0


class LogprobFormatter:
    """Formats one response's logprobs; token texts are decoded once per token id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        """The text of one token as the client sees it (may be '\\ufffd' for a partial UTF-8 byte)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._texts[token_id] = text
        return text

    def chat(self, logprobs: list[TokenLogprob] | None) -> ChoiceLogprobs | None:
        """`choices[].logprobs` of a chat completion or chunk (None when none were requested)."""
        if logprobs is None:
            return None
        return ChoiceLogprobs(content=[self._chat_entry(lp) for lp in logprobs])

    def completion(self, logprobs: list[TokenLogprob] | None, text_offset: int) -> CompletionLogprobs | None:
        """`choices[].logprobs` of a text completion; offsets count characters from `text_offset`."""
        if logprobs is None:
            return None
        tokens, offsets = [], []
        for lp in logprobs:
            text = self.token_text(lp.token_id)
            tokens.append(text)
            offsets.append(text_offset)
            text_offset += len(text)
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=[_finite(lp.logprob) for lp in logprobs],
            top_logprobs=[{self.token_text(t): _finite(v) for t, v in lp.top} for lp in logprobs],
            text_offset=offsets,
        )

    def _chat_entry(self, lp: TokenLogprob) -> ChatTokenLogprob:
        text = self.token_text(lp.token_id)
        return ChatTokenLogprob(
            token=text,
            logprob=_finite(lp.logprob),
            bytes=list(text.encode("utf-8")),
            top_logprobs=[self._top(t, v) for t, v in lp.top],
        )

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        text = self.token_text(token_id)
        return TopLogprob(token=text, logprob=_finite(logprob), bytes=list(text.encode("utf-8")))


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else MIN_LOGPROB
