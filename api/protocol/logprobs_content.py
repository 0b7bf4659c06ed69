"""With tool calling: the logprob entries of a choice's content only, not of its call markup."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from engine import TokenLogprob


class ContentLogprobs:
    """Keeps the entries whose text is the content the choice's reader returned (api/generation/reader.py).

    Rule (chat and Responses with tools): content logprobs list the tokens of the content up to
    the first tool call. Entries are matched in order against the content bytes; the first entry
    whose bytes are not the next content bytes is where the call markup starts: it is kept with
    its bytes cut to the content part (when it begins with some), and it and everything after it
    (the call's markup and arguments, any text after the call) get no content logprobs. While the
    reader holds text back (a possible call marker), the entries covering it wait.
    `token_bytes`: an entry's bytes (`LogprobFormatter.token_bytes`: its `text_bytes`, or the
    decoded token for entries made without them).
    """

    def __init__(self, token_bytes: Callable[[TokenLogprob], bytes]) -> None:
        self._token_bytes = token_bytes
        self._waiting: list[TokenLogprob] = []
        self._content = b""        # content bytes not yet matched by an entry
        self._ended = False

    def read(self, entries: list[TokenLogprob], content: str, final: bool) -> list[TokenLogprob]:
        """The content entries that `entries` (the engine's, in order) and `content` (the content
        the reader released with them) complete; `final`: the choice ended, decide the rest."""
        if self._ended:
            return []
        self._waiting.extend(entries)
        self._content += content.encode("utf-8")
        out: list[TokenLogprob] = []
        while self._waiting and not self._ended:
            entry = self._waiting[0]
            data = self._token_bytes(entry)
            if self._content.startswith(data):
                out.append(entry)
                self._content = self._content[len(data):]
                self._waiting.pop(0)
            elif data.startswith(self._content) and not final:
                break                              # the content may still grow into this token
            else:
                out.extend(self._cut(entry, data))
                self._ended = True
        if final:
            self._ended = True
        return out

    def _cut(self, entry: TokenLogprob, data: bytes) -> list[TokenLogprob]:
        """`entry` cut to the content bytes it begins with (none: left out)."""
        common = 0
        while common < min(len(data), len(self._content)) and data[common] == self._content[common]:
            common += 1
        if common == 0:
            return []
        return [dataclasses.replace(entry, text_bytes=data[:common])]
