"""GrammarCloser: a short token sequence that takes a matcher from where it is to an accepting end.

Used when max_tokens is about to cut a constrained output (a tool call, or JSON whose request asked
for it): instead of stopping mid-string, the engine appends such a completion, so the output still
parses and validates. The search is greedy over the grammar's own bitmask, so it works for every
backend and grammar kind:

1. stop as soon as the matcher is accepting (EOS allowed);
2. take the tokens the grammar forces (jump-forward), when there are any;
3. else, when most of the vocabulary is allowed (inside a string or a free-text value), the first
   closer of a preference list that the grammar takes whole and that leaves the text (the matcher
   is then accepting or allows at most half the vocabulary): a JSON string's closing quote (`"}}`,
   `"}`, `"`) or a Qwen XML value's `</parameter>` (qwen3_coder's style "qwen_xml"; first the rest
   of that tag when the value ends in its beginning, `</`), so that in each format the closer of its
   own values wins although the other's is allowed as plain text;
4. else the first closer or minimal value the grammar takes: at a structural position brackets
   first (`}`, `]`, then `</parameter>`, `</function>`, then `,`, `:`, then `""`, `0`, `false`,
   ...), in text (a string that must grow first) one of their single tokens as more text;
5. else the allowed token with the shortest text (whitespace-only and partial-UTF-8 tokens last),
   e.g. the first character of a required key or of an enum value.

A closer is a text, one token or several (`</parameter>` is 3 SmolLM2 tokens); several are tried
with `accept` and rolled back.

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
# after it when they fit), or the end tag of a Qwen XML value. At a structural position a quote
# would open a new string, so brackets come first, then the end tags of the XML format (after an
# XML value that is a number, more digits would not end it), then the separators a required key or
# item still needs (allowed together with a digit only after a number, which more digits would not
# end), then the cheapest JSON values.
XML_VALUE_END = "</parameter>"
IN_TEXT_TEXTS: tuple[str, ...] = ('"}}', '"}', '"]', '"')
LEAVING_TEXTS: tuple[str, ...] = (
    *IN_TEXT_TEXTS,
    # the rest of an XML end tag the value already began (`\n</` + `parameter>`), then the whole tag
    *(XML_VALUE_END[i:] for i in range(1, len(XML_VALUE_END))), XML_VALUE_END)
STRUCTURAL_TEXTS: tuple[str, ...] = (
    '}}', ']}', '}', ']', XML_VALUE_END, "\n</function>", "</function>", ',', ':', '""', '0', '[]', '{}',
    'false', 'null', 'true', '"')


TEXT_PROBES: tuple[str, ...] = ("e", "a")
"""Tokens that only text takes: a closer leaves the text when the grammar then takes none of them
(JSON after a string or an XML value allows no letter; an accepting matcher has left it too)."""

SEARCH_TOKENS = 256
"""The longest step-by-step search `plan` makes before giving up (about 0.1 ms per step)."""

MAX_ENDING_BRANCHES = 8
"""`must_end` looks at most this many ways on (besides EOS) from an accepting state; with more (free
text) the output can end anywhere, so it never has to end early."""


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
        self._eos = eos
        specials = vocab_info.special_token_texts
        by_text = {text: i for i, text in reversed(list(enumerate(texts))) if i not in eos}

        def ids(text: str) -> tuple[int, ...]:   # one token where the vocabulary has it, else encoded
            if text in by_text:
                return (by_text[text],)
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        self._leaving = [ids(t) for t in LEAVING_TEXTS]
        self._probes = [by_text[t] for t in TEXT_PROBES if t in by_text]
        # text that stays text: filler of one token each, the shortest way on to a closer
        self._in_text = [(by_text[t],) for t in IN_TEXT_TEXTS + STRUCTURAL_TEXTS if t in by_text]
        self._structural = [ids(t) for t in STRUCTURAL_TEXTS]

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

    def _pick(self, matcher: Matcher) -> list[int] | None:
        """The next step of the plan (module docstring, steps 3 to 5); None when nothing is allowed."""
        allowed = self._allowed(matcher)
        in_text = 2 * int(allowed.sum()) > self.vocab_size   # inside a string or a free-text value
        if in_text:
            for closer in self._leaving:
                if allowed[closer[0]] and self._takes(matcher, closer, leave_text=True):
                    return list(closer)
        for closer in self._in_text if in_text else self._structural:
            if allowed[closer[0]] and self._takes(matcher, closer, leave_text=False):
                return list(closer)
        hits = self._fallback[allowed[self._fallback]]
        return [int(hits[0])] if hits.size else None

    def _takes(self, matcher: Matcher, closer: tuple[int, ...], leave_text: bool) -> bool:
        """Whether the grammar takes all of `closer` (its first token is known to be allowed) and,
        with `leave_text`, is then out of the text (`TEXT_PROBES`); the matcher is left as it was."""
        if len(closer) == 1 and not leave_text:
            return True
        if not matcher.accept(list(closer)):
            return False
        try:
            if not leave_text or matcher.is_accepting():
                return True
            return not any(self._probe(matcher, token_id) for token_id in self._probes)
        finally:
            matcher.rollback(len(closer))

    @staticmethod
    def _probe(matcher: Matcher, token_id: int) -> bool:
        """Whether the grammar takes `token_id` next (rolled back)."""
        if not matcher.accept([token_id]):
            return False
        matcher.rollback(1)
        return True

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
                step = matcher.forced_tokens() or self._pick(matcher)
                if step is None:
                    return None
                step = step[: SEARCH_TOKENS - len(tokens)]
                if not step or not matcher.accept(step):
                    return None
                tokens.extend(step)
        finally:
            matcher.rollback(len(tokens))
        tokens = self._shorter(matcher, tokens)
        return tokens if len(tokens) <= limit else None

    def must_end(self, matcher: Matcher, budget: int) -> bool:
        """At an accepting state: True when no way on but EOS can be closed within `budget - 1`
        more tokens (a forced call list whose next call could only be cut by max_tokens), so the
        output should end here. False when the grammar allows none or more than
        MAX_ENDING_BRANCHES other tokens (free text, which can end anywhere). State unchanged.
        """
        branches = [int(t) for t in np.flatnonzero(self._allowed(matcher)) if int(t) not in self._eos]
        if not branches or len(branches) > MAX_ENDING_BRANCHES:
            return False
        for token_id in branches:
            if not matcher.accept([token_id]):
                continue
            try:
                if self.plan(matcher, budget - 1) is not None:
                    return False
            finally:
                matcher.rollback(1)
        return True

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
