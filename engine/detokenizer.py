"""Incremental detokenizer with stop-string detection for one sequence."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

try:
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers without DecodeStream (< 0.21): every tokenizer takes the window path
    Tokenizer = DecodeStream = None  # type: ignore[assignment,misc]

REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True)
class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas that are safe to send.

    Decodes a small window of recent tokens (prefix/read offsets, as in Hugging Face TGI's
    `decode_token`) so a step costs O(window), and holds text back while the window ends in an
    incomplete UTF-8 character (U+FFFD). Stop strings: the released text withholds the last
    `max(len(stop)) - 1` characters until it is known that no stop string starts there, so a stop
    string split across tokens never leaks. `text` is everything decoded so far; `released`
    counts the characters already handed out.

    With a Hugging Face fast tokenizer (a Rust `tokenizers.Tokenizer` behind it), the text comes
    from `tokenizers.decoders.DecodeStream` instead (the same windowed decode in Rust, ~1 us per
    token instead of two Python-level decodes, ~15-30 us); `stream_start` is then the first
    token whose text it has not yet returned (an incomplete character), decoded at `flush`.

    Stop strings inside a grammar-constrained region: `add_tokens(ids, stop_allowed=False)` marks
    the text of those tokens as a place where no stop string may start (the engine passes False
    while the request's grammar could not end the output, e.g. inside a forced tool call; see
    `LLMEngine._stop_allowed`). A stop string starting there is not a match, and the text goes out
    as usual. `stop_gates` holds the offsets into `text` where that permission changes (sorted,
    alternating, starting from "allowed"), so it stays a few entries long.
    """

    tokenizer: Any
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    released: int = 0
    prefix_offset: int = 0
    read_offset: int = 0
    stream: Any = None
    stream_start: int = 0
    stop_gates: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if DecodeStream is not None and isinstance(backend, Tokenizer):
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add_tokens(self, new_token_ids: list[int], stop_allowed: bool = True) -> tuple[str, str | None]:
        """Append tokens; returns (text delta to send, matched stop string or None).

        After a stop string matches, the delta ends where the stop string starts (or after it
        with include_stop_str_in_output) and the caller must finish the sequence. `stop_allowed`
        False: no stop string may start in the text of these tokens (see the class docstring).
        """
        if self.stop and stop_allowed != self._stop_allowed_at(len(self.text)):
            self.stop_gates.append(len(self.text))
        if self.stream is not None:
            backend = self.tokenizer._tokenizer
            for token_id in new_token_ids:
                self.token_ids.append(token_id)
                chunk = self.stream.step(backend, token_id)
                if chunk is not None:
                    self.text += chunk
                    self.stream_start = len(self.token_ids)
            return self._release(final=False)
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
            new_text = self._decode(self.token_ids[self.prefix_offset:])
            if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
                self.text += new_text[len(prefix_text):]
                self.prefix_offset = self.read_offset
                self.read_offset = len(self.token_ids)
        return self._release(final=False)

    def flush(self) -> tuple[str, str | None]:
        """Release everything still held back (the sequence ended without a stop string so far),
        including a trailing incomplete character as U+FFFD; returns (text delta, matched stop
        string or None) as `add_tokens` does.

        The U+FFFD decoded here is text the client gets, so a stop string it completes (one ending
        in U+FFFD) matches like any other: the delta ends where it starts and the caller ends the
        sequence as stopped by it.
        """
        if self.stream is not None:
            if self.stream_start < len(self.token_ids):
                self.text += self._decode(self.token_ids[self.stream_start:])
                self.stream_start = len(self.token_ids)
            return self._release(final=True)
        tail = self._decode(self.token_ids[self.prefix_offset:])
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        if len(tail) > len(prefix_text):
            self.text += tail[len(prefix_text):]
            self.prefix_offset = self.read_offset = len(self.token_ids)
        return self._release(final=True)

    def _stop_allowed_at(self, pos: int) -> bool:
        """Whether a stop string may start at character `pos` of `text` (an even number of gates
        at or before it: every gate flips the permission, which starts as allowed)."""
        return bisect_right(self.stop_gates, pos) % 2 == 0

    def _find_stop(self, stop: str, start: int) -> int:
        """The first position >= `start` where `stop` starts and may end the output, or -1."""
        pos = self.text.find(stop, start)
        while pos != -1 and not self._stop_allowed_at(pos):
            pos = self.text.find(stop, pos + 1)
        return pos

    def _release(self, final: bool) -> tuple[str, str | None]:
        if self.stop:
            search_from = max(0, self.released - max(len(s) for s in self.stop) + 1)
            best: tuple[int, str] | None = None
            for stop in self.stop:
                pos = self._find_stop(stop, search_from)
                if pos != -1 and (best is None or pos < best[0]):
                    best = (pos, stop)
            if best is not None:
                pos, stop = best
                end = pos + len(stop) if self.include_stop_str_in_output else pos
                delta = self.text[self.released:end] if end > self.released else ""
                self.text = self.text[:end]
                self.released = max(self.released, end)
                return delta, stop
            hold = 0 if final else max(len(s) for s in self.stop) - 1
        else:
            hold = 0
        end = max(self.released, len(self.text) - hold)
        delta = self.text[self.released:end]
        self.released = end
        return delta, None
