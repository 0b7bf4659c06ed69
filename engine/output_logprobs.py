"""Logprobs that list exactly the returned text's tokens: each entry released with its text."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.request import TokenLogprob
from engine.token_bytes import TokenBytes


@dataclass(slots=True)
class _Held:
    """A token's entry waiting for release: `start` is the byte offset of its text in the choice's
    text, `data` its bytes there (None: not decoded yet, part of an incomplete character)."""

    entry: TokenLogprob
    start: int = 0
    data: bytes | None = None


@dataclass(slots=True)
class LogprobAligner:
    """Holds one choice's logprob entries until the text they produced is released to the client.

    The engine calls `add` for every output token whose text may reach the output (never for EOS
    or a stop_token_id, whose text never does), `add_text` with what a final `flush` decoded,
    `release` with each piece of text it hands out and `finish` with the last one. The entries
    returned, joined, carry exactly the bytes of the released text (`TokenLogprob.text_bytes`),
    in order, streamed or whole:

    - an entry goes out once all of its token's text is released (text held back for a possible
      stop string or an incomplete UTF-8 character holds its entry back too);
    - the tokens of one character split over several tokens get their own vocabulary bytes
      (`TokenBytes`) when these join to the decoded text, else the last one carries it all;
    - at the end (a stop string, max_tokens), the token in which the returned text ends keeps its
      logprob with `text_bytes` cut to its returned part; tokens past the end (inside the stop
      string, or after it) are left out.
    """

    token_bytes: TokenBytes
    _held: deque[_Held] = field(default_factory=deque)
    _num_text_bytes: int = 0     # bytes of decoded text given to entries so far
    _num_released: int = 0       # bytes of text released so far

    def add(self, entry: TokenLogprob, new_text: str) -> None:
        """`entry` of the token just appended; `new_text`: what the detokenizer's whole text gained
        with it ("" while its character is incomplete, or when a stop string cut the text)."""
        self._held.append(_Held(entry))
        self.add_text(new_text)

    def add_text(self, new_text: str) -> None:
        """Give `new_text` (decoded text not yet attributed) to the entries still waiting for theirs."""
        if not new_text:
            return
        if not self._held or self._held[-1].data is not None:
            return
        waiting = [h for h in self._held if h.data is None]     # a trailing run (one character)
        data = new_text.encode("utf-8")
        for held, part in zip(waiting, self._split(data, [h.entry.token_id for h in waiting])):
            held.start, held.data = self._num_text_bytes, part
            self._num_text_bytes += len(part)

    def release(self, text: str) -> list[TokenLogprob]:
        """The entries whose whole text is released once `text` (the next released piece) is."""
        self._num_released += len(text.encode("utf-8"))
        out: list[TokenLogprob] = []
        while self._held:
            held = self._held[0]
            if held.data is None or held.start + len(held.data) > self._num_released:
                break
            out.append(self._entry(held.entry, held.data))
            self._held.popleft()
        return out

    def finish(self, text: str) -> list[TokenLogprob]:
        """The last entries, `text` being the last released piece (see the class docstring)."""
        out = self.release(text)
        for held in self._held:
            if held.data is None or held.start >= self._num_released:
                continue
            out.append(self._entry(held.entry, held.data[:self._num_released - held.start]))
        self._held.clear()
        return out

    def _split(self, data: bytes, token_ids: list[int]) -> list[bytes]:
        """`data` (the text of `token_ids` together) shared out per token."""
        if len(token_ids) == 1:
            return [data]
        parts = [self.token_bytes.bytes_of(t) for t in token_ids]
        if b"".join(parts) == data:
            return parts
        return [b""] * (len(token_ids) - 1) + [data]

    def _entry(self, entry: TokenLogprob, data: bytes) -> TokenLogprob:
        top_bytes = tuple(self.token_bytes.bytes_of(t) for t, _ in entry.top)
        return TokenLogprob(entry.token_id, entry.logprob, entry.top, data, top_bytes)
