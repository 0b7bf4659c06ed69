"""Incremental detokenizer: streamed text equals the whole decode; stop strings never leak."""

import pytest

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
    pieces.append(detok.flush())
    return pieces, None


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
