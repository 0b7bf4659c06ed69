"""The OpenAI logprob shapes from engine entries (api/protocol/logprobs_output.py) and the content-only
rule with tool calls (api/protocol/logprobs_content.py)."""

from __future__ import annotations

import json

from api.protocol.logprobs_content import ContentLogprobs
from api.protocol.logprobs_output import LogprobFormatter
from engine import TokenLogprob
from tests.byte_tokenizer import ByteTokenizer

NAN, NEG_INF = float("nan"), float("-inf")
BYTES = LogprobFormatter(ByteTokenizer()).token_bytes


def entry(data: bytes, logprob: float = -0.5, top: list[tuple[int, float]] | None = None) -> TokenLogprob:
    top = top or []
    return TokenLogprob(data[0] if data else 0, logprob, top, data, tuple(bytes([t]) for t, _ in top))


def test_masked_alternatives_are_omitted_and_the_json_stays_valid():
    fmt = LogprobFormatter(ByteTokenizer())
    lp = entry(b"a", NAN, [(ord("a"), -0.1), (ord("b"), NEG_INF), (ord("c"), -3.0)])
    chat = fmt.chat([lp])
    assert chat is not None and chat.content is not None
    [only] = chat.content
    assert only.logprob == -9999.0
    assert [(t.token, t.logprob) for t in only.top_logprobs] == [("a", -0.1), ("c", -3.0)]
    json.loads(chat.model_dump_json())                   # no NaN / Infinity in the body
    completion = fmt.completion([lp], 0)
    assert completion is not None and completion.top_logprobs == [{"a": -0.1, "c": -3.0}]


def test_partial_characters_keep_their_bytes_and_offsets_count_characters():
    fmt = LogprobFormatter(ByteTokenizer())
    entries = [entry(b"h\xc3"), entry(b"\xa9"), entry(b" \xf0\x9f\x98"), entry(b"\x8a!")]
    chat = fmt.chat(entries)
    assert chat is not None and chat.content is not None
    assert [c.token for c in chat.content] == ["h\\xc3", "\\xa9", " \\xf0\\x9f\\x98", "\\x8a!"]
    assert bytes(b for c in chat.content for b in c.bytes or []).decode() == "hé 😊!"
    completion = fmt.completion(entries, 5)
    assert completion is not None and completion.text_offset == [5, 6, 7, 8]
    assert fmt.text_length(entries) == len("hé 😊!")


def test_content_logprobs_stop_where_the_call_markup_starts():
    """Content "Sure. " then a call whose first token " <" straddles the content's end: the
    content keeps " " of it; the markup and argument tokens get none, whole or fed in pieces."""
    pieces = [b"Sure", b".", b" <", b"tool", b"_call", b">", b'{"a"']
    entries = [entry(p) for p in pieces]
    whole = ContentLogprobs(BYTES).read(entries, "Sure. ", final=True)
    assert [e.text_bytes for e in whole] == [b"Sure", b".", b" "]
    streamed, reader = [], ContentLogprobs(BYTES)
    for i, (e, text) in enumerate(zip(entries, ["Sure", ".", "", "", "", "", ""])):
        streamed += reader.read([e], text, final=False)
    streamed += reader.read([], " ", final=True)       # the parser releases the held " " at the end
    assert [e.text_bytes for e in streamed] == [e.text_bytes for e in whole]
    assert ContentLogprobs(BYTES).read(entries[:2], "Sure.", final=True) == entries[:2]
