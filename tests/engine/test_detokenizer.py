"""Incremental detokenizer: streamed text equals the whole decode; stop strings never leak."""

import pytest

from engine.detokenizer import REPLACEMENT_CHAR as REPLACEMENT
from engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Héllo wörld — naïve café, Ελληνικά, русский, 日本語のテキスト, 中文, 한국어.",
    "Emoji: 🎉🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 then text again 🙂.",
    "code:\n\tdef f(x):\n\t    return x ** 2  # comment\n\n",
]


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], str | None]:
    pieces = []
    for token_id in ids:
        delta, stop = detok.add_tokens([token_id])
        pieces.append(delta)
        if stop is not None:
            return pieces, stop
    delta, stop = detok.flush()
    pieces.append(delta)
    return pieces, stop


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_whole_decode(smollm2_tokenizer, text):
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    pieces, stop = stream(IncrementalDetokenizer(smollm2_tokenizer), ids)
    assert stop is None
    assert "".join(pieces) == smollm2_tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces), "no broken character is ever sent"


@pytest.mark.parametrize("stop", ["brown fox", "fox jumps", "lazy", "g."])
def test_stop_string_across_tokens_is_cut_and_never_leaks(smollm2_tokenizer, stop):
    text = TEXTS[0]
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    pieces, matched = stream(IncrementalDetokenizer(smollm2_tokenizer, stop=(stop, "never-there")), ids)
    assert matched == stop
    assert "".join(pieces) == text[: text.index(stop)]


def test_include_stop_str_in_output(smollm2_tokenizer):
    text = TEXTS[0]
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    pieces, matched = stream(IncrementalDetokenizer(smollm2_tokenizer, stop=("fox",), include_stop_str_in_output=True), ids)
    assert "".join(pieces) == "Hello, world! The quick brown fox"


def test_stop_string_inside_multibyte_text(smollm2_tokenizer):
    text = TEXTS[1]
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    pieces, matched = stream(IncrementalDetokenizer(smollm2_tokenizer, stop=("日本",)), ids)
    assert matched == "日本"
    assert "".join(pieces) == text[: text.index("日本")]


def window_path(detok: IncrementalDetokenizer) -> IncrementalDetokenizer:
    """The same detokenizer forced onto the Python window decode (no DecodeStream)."""
    detok.stream = None
    return detok


@pytest.mark.parametrize("text", TEXTS)
def test_decode_stream_path_equals_the_window_path(smollm2_tokenizer, text):
    """The fast tokenizer takes the DecodeStream path; it streams the same text as the window
    decode, also when the output ends inside a multi-byte character (flushed as U+FFFD)."""
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert IncrementalDetokenizer(smollm2_tokenizer).stream is not None
    for cut in (len(ids), len(ids) - 1, len(ids) // 2 + 1):
        fast, _ = stream(IncrementalDetokenizer(smollm2_tokenizer), ids[:cut])
        slow, _ = stream(window_path(IncrementalDetokenizer(smollm2_tokenizer)), ids[:cut])
        assert "".join(fast) == "".join(slow), (text, cut)
        assert all(REPLACEMENT not in p for p in fast[:-1])


@pytest.mark.parametrize("fast", [True, False])
def test_flush_matches_a_stop_string_its_replacement_character_completes(smollm2_tokenizer, fast):
    """An output cut inside a character flushes it as U+FFFD; a stop string ending in U+FFFD then
    matches there (the text cut before it, the string returned), as in any other text."""
    text = "Emoji: 🎉 done"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    cut = next(k for k in range(1, len(ids)) if smollm2_tokenizer.decode(ids[:k]).endswith(REPLACEMENT))
    for stop, expected in ((": " + REPLACEMENT, ("Emoji", ": " + REPLACEMENT)), ("never", (None, None))):
        detok = IncrementalDetokenizer(smollm2_tokenizer, stop=(stop,))
        pieces, matched = stream(detok if fast else window_path(detok), ids[:cut])
        if expected[0] is None:
            assert matched is None and "".join(pieces) == "Emoji: " + REPLACEMENT
        else:
            assert ("".join(pieces), matched) == expected


def test_special_tokens_skipped_or_kept_alike(smollm2_tokenizer):
    ids = [*smollm2_tokenizer.encode("Hi there", add_special_tokens=False), smollm2_tokenizer.eos_token_id]
    for skip in (True, False):
        fast, _ = stream(IncrementalDetokenizer(smollm2_tokenizer, skip_special_tokens=skip), ids)
        slow, _ = stream(window_path(IncrementalDetokenizer(smollm2_tokenizer, skip_special_tokens=skip)), ids)
        assert "".join(fast) == "".join(slow)


@pytest.mark.parametrize("fast", [True, False])
def test_stop_strings_never_start_where_stops_are_not_allowed(smollm2_tokenizer, fast):
    """Tokens added with stop_allowed=False (a constrained region) release their text whole; a
    stop string starting there is skipped, the next occurrence where stops are allowed matches."""
    text = "say fox; then fox again and fox"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    starts = [len(smollm2_tokenizer.decode(ids[:i])) for i in range(len(ids))]
    region_end = text.index(" again")
    detok = IncrementalDetokenizer(smollm2_tokenizer, stop=("fox",))
    if not fast:
        detok = window_path(detok)
    pieces, matched = [], None
    for i, token_id in enumerate(ids):
        delta, matched = detok.add_tokens([token_id], stop_allowed=not 3 <= starts[i] < region_end)
        pieces.append(delta)
        if matched is not None:
            break
    assert matched == "fox"
    assert "".join(pieces) == text[: text.rindex("fox")], "the first two foxes lie where stops are not allowed"
