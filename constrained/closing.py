"""GrammarCloser: a short token sequence that takes a matcher from where it is to an accepting end.

Used when max_tokens is about to cut a constrained output (a tool call, or JSON whose request asked
for it): instead of stopping mid-string, the engine appends such a completion, so the output still
parses and validates. The search is greedy over the grammar's own bitmask, so it works for every
backend and grammar kind:

1. stop as soon as the matcher is accepting (EOS allowed);
2. take the tokens the grammar forces (jump-forward), when there are any;
3. else take the first allowed token of a preference list of closers and minimal JSON values:
   when most of the vocabulary is allowed (inside a string) a closing quote first (`"}`, `"`),
   else brackets first (`}`, `]`, then `,`, `:`, then `""`, `0`, `false`, ...);
4. else the allowed token with the shortest text (whitespace-only and partial-UTF-8 tokens last),
   e.g. the first character of a required key or of an enum value.

Greedy choices never loop forever: the plan is abandoned (None) beyond `limit` tokens. The plan's
text is then re-tokenized when that gives fewer tokens the grammar still accepts. Plans are short
in practice (a string close and its brackets: 2 to 6 tokens), not provably shortest.
"""

from __future__ import annotations

import numpy as np

from constrained.backend import Matcher
from constrained.bitmask import allocate_bitmask, allowed_mask
from constrained.vocab import VocabInfo

# Preference lists, by where the matcher stands. Inside a string (or free text) nearly every token
# is allowed and a bracket is only more content, so a closing quote comes first (with the brackets
# after it when they fit). At a structural position a quote would open a new string, so brackets
# come first, then the separators a required key or item still needs (allowed together with a digit
# only after a number, which more digits would not end), then the cheapest JSON values.
IN_TEXT_TEXTS: tuple[str, ...] = ('"}}', '"}', '"]', '"')
STRUCTURAL_TEXTS: tuple[str, ...] = (
    '}}', ']}', '}', ']', ',', ':', '""', '0', '[]', '{}', 'false', 'null', 'true', '"')


SEARCH_TOKENS = 256
"""The longest step-by-step search `plan` makes before giving up (about 0.1 ms per step)."""


class GrammarCloser:
    """Plans closing tokens for matchers over one vocabulary (built once per engine).

    Construction decodes every token id once (about 0.5 s for a 49k vocabulary). Not thread-safe:
    it owns one bitmask row; call `plan` from the engine thread only.
    """

    def __init__(self, vocab_info: VocabInfo) -> None:
        self.vocab_size = vocab_info.vocab_size
        self.tokenizer = tokenizer = vocab_info.tokenizer
        num_text = min(len(tokenizer), self.vocab_size)
        texts = tokenizer.batch_decode([[i] for i in range(num_text)])
        texts += [""] * (self.vocab_size - num_text)
        eos = set(vocab_info.eos_token_ids)
        specials = vocab_info.special_token_texts
        by_text = {text: i for i, text in reversed(list(enumerate(texts))) if i not in eos}
        self._in_text = np.array([by_text[t] for t in IN_TEXT_TEXTS + STRUCTURAL_TEXTS if t in by_text], dtype=np.int64)
        self._structural = np.array([by_text[t] for t in STRUCTURAL_TEXTS if t in by_text], dtype=np.int64)

        def rank(i: int) -> tuple[int, int]:
            text = texts[i]
            if i in eos or not text or text in specials:
                return (3, i)                       # never picked as filler (EOS ends the plan itself)
            if "\ufffd" in text or not text.strip():
                return (2, len(text))               # partial UTF-8 or whitespace: last resort
            return (1, len(text))

        ranks = [rank(i) for i in range(self.vocab_size)]
        order = sorted(range(self.vocab_size), key=lambda i: ranks[i])
        self._fallback = np.array([i for i in order if ranks[i][0] < 3], dtype=np.int64)
        self._bitmask = allocate_bitmask(1, self.vocab_size)

    def _allowed(self, matcher: Matcher) -> np.ndarray:
        """bool [vocab_size]: the tokens `matcher` allows next."""
        matcher.fill_bitmask(self._bitmask, 0)
        return allowed_mask(self._bitmask, 0, self.vocab_size)

    def _pick(self, matcher: Matcher) -> int | None:
        allowed = self._allowed(matcher)
        preferred = self._in_text if 2 * int(allowed.sum()) > self.vocab_size else self._structural
        for ids in (preferred, self._fallback):
            hits = ids[allowed[ids]]
            if hits.size:
                return int(hits[0])
        return None

    def plan(self, matcher: Matcher, limit: int) -> list[int] | None:
        """Token ids (EOS not included) after which `matcher` is accepting; [] when it already is.

        None when the matcher is terminated, or when no completion of at most `limit` tokens was
        found (the search itself may take up to SEARCH_TOKENS steps before re-tokenizing).
        The matcher's state is the same afterwards (every token tried is rolled back).
        """
        if matcher.is_terminated():
            return None
        tokens: list[int] = []
        try:
            while not matcher.is_accepting():
                step = matcher.forced_tokens()
                if not step:
                    token = self._pick(matcher)
                    if token is None:
                        return None
                    step = [token]
                step = step[: SEARCH_TOKENS - len(tokens)]
                if not step or not matcher.accept(step):
                    return None
                tokens.extend(step)
        finally:
            matcher.rollback(len(tokens))
        tokens = self._shorter(matcher, tokens)
        return tokens if len(tokens) <= limit else None

    def _shorter(self, matcher: Matcher, tokens: list[int]) -> list[int]:
        """`tokens` re-tokenized when that is shorter and the grammar accepts it to an accepting end.

        Step by step the plan is often one character per token (where the grammar allows whitespace
        between JSON tokens it forces `,` and `"` separately); the tokenizer joins `","points":[{"`
        into a few tokens.
        """
        if len(tokens) < 2:
            return tokens
        joined = self.tokenizer.encode(self.tokenizer.decode(tokens), add_special_tokens=False)
        if len(joined) >= len(tokens) or not matcher.accept(joined):
            return tokens
        accepting = matcher.is_accepting()
        matcher.rollback(len(joined))
        return joined if accepting else tokens
