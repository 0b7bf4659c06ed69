"""Logprobs list exactly the returned text's tokens (engine/output_logprobs.py, engine/token_bytes.py):
on a tiny random Llama through LLMEngine (EOS and stop-string tokens left out, the token in which a
stop string starts cut to its returned part, n > 1), and the bytes of tokens: SmolLM2's that hold
part of a character, GPT-2's byte-level alphabet, SentencePiece byte fallback, the fallback to
the decoded text."""

from __future__ import annotations

import pytest

from engine.llm_engine import LLMEngine
from engine.output_logprobs import LogprobAligner
from engine.request import EngineRequest, TokenLogprob
from engine.sampling_params import SamplingParams
from engine.token_bytes import TokenBytes, byte_level_alphabet
from tests.byte_tokenizer import ByteTokenizer
from tiny_engine import EOS, load_tiny_folder, make_engine

WORDS = ["Hel", "lo W", "orld", "!"]     # ids 256..259 of the byte tokenizer below
NON_ASCII = {t: -100.0 for t in range(128, 256)}


Choice = tuple[str, list[TokenLogprob], list[int], str | None]


def run(engine: LLMEngine, request: EngineRequest) -> list[Choice]:
    """Each choice's (text, logprob entries, token ids, finish_reason), gathered from the deltas."""
    engine.add_request(request)
    n = request.sampling_params.n
    texts, entries, ids, reasons = [""] * n, [[] for _ in range(n)], [[] for _ in range(n)], [None] * n
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            for d in out.deltas:
                texts[d.index] += d.text
                entries[d.index] += d.logprobs or []
                ids[d.index] += d.token_ids
                reasons[d.index] = d.finish_reason or reasons[d.index]
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    return list(zip(texts, entries, ids, reasons))


@pytest.fixture
def words_engine(tiny_model_dir) -> LLMEngine:
    """A tiny Llama over a byte tokenizer whose ids 256.. are the multi-character tokens WORDS."""
    folder, _ = tiny_model_dir("LlamaForCausalLM", vocab_size=256 + len(WORDS))
    return make_engine(load_tiny_folder(folder), tokenizer=ByteTokenizer(WORDS, eos_token_id=EOS))


def words_params(**fields) -> SamplingParams:
    """Greedy over WORDS only (every other token biased away), their text kept (not special-skipped)."""
    bias = {t: -100.0 for t in range(256)}
    return SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2, logit_bias=bias,
                          skip_special_tokens=False, **fields)


def joined(entries: list[TokenLogprob]) -> bytes:
    return b"".join(e.text_bytes for e in entries)


def test_entries_are_the_text_tokens_with_their_bytes(tiny_model_dir):
    """Every output token has its entry, bytes joined = the text, and two alternatives with their bytes."""
    folder, _ = tiny_model_dir("LlamaForCausalLM")
    engine = make_engine(load_tiny_folder(folder))
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=12, n=2, logprobs=2, logit_bias=NON_ASCII)
    for text, entries, ids, reason in run(engine, EngineRequest("r", list(range(40, 60)), params)):
        assert reason == "length"
        assert [e.token_id for e in entries] == ids
        assert joined(entries) == text.encode()
        for e in entries:
            assert len(e.top) == 2 and e.top_bytes == tuple(bytes([t]) for t, _ in e.top)


def test_eos_has_no_entry(tiny_model_dir):
    """The EOS token ends the text without adding to it, so it has no logprob entry."""
    folder, _ = tiny_model_dir("LlamaForCausalLM")
    engine = make_engine(load_tiny_folder(folder))
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3, logprobs=0,
                            logit_bias={**NON_ASCII, EOS: 100.0})
    [(text, entries, ids, reason)] = run(engine, EngineRequest("r", list(range(40, 60)), params))
    assert reason == "stop" and ids[-1] == EOS and len(ids) == 4
    assert [e.token_id for e in entries] == ids[:3]
    assert joined(entries) == text.encode() and len(text) == 3


@pytest.mark.parametrize("include_stop", [False, True])
def test_stop_string_inside_tokens_cuts_the_last_entry(words_engine, include_stop):
    """Rule: the token in which the returned text ends keeps its entry (its logprob unchanged) with
    `text_bytes` cut to its returned part; tokens wholly inside or past the stop string have none."""
    prompt = list(range(40, 60))
    [(free_text, free, free_ids, _)] = run(words_engine, EngineRequest("free", prompt, words_params()))
    assert joined(free) == free_text.encode() and [e.token_id for e in free] == free_ids
    lengths = [len(WORDS[t - 256]) for t in free_ids]
    i = next(i for i, n in enumerate(lengths) if n > 1 and i + 1 < len(lengths))
    start = sum(lengths[:i]) + 1                 # the stop string starts inside token i ...
    stop = free_text[start:start + lengths[i]]   # ... and ends inside (or at the end of) the next
    assert free_text.find(stop) == start, free_text
    cut = start + (len(stop) if include_stop else 0)
    params = words_params(stop=(stop,), include_stop_str_in_output=include_stop)
    [(text, entries, _, reason)] = run(words_engine, EngineRequest("cut", prompt, params))
    assert reason == "stop" and text == free_text[:cut]
    assert joined(entries) == text.encode()
    kept = len(entries)
    assert [e.token_id for e in entries] == free_ids[:kept]
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in free[:kept]])
    ends = [len(joined(free[:i])) for i in (kept - 1, kept)]
    assert ends[0] < cut <= ends[1]        # the last entry is the token the text ends in


def test_a_character_split_over_tokens_keeps_each_tokens_bytes(smollm2_tokenizer):
    """SmolLM2 writes " 😊" as two tokens; each entry carries its own vocabulary bytes, which join
    to the text."""
    token_bytes = TokenBytes(smollm2_tokenizer)
    text = "héllo 😊 world"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(token_bytes.bytes_of(t) for t in ids) == text.encode()
    first, second = smollm2_tokenizer.encode(" 😊", add_special_tokens=False)
    aligner = LogprobAligner(token_bytes)
    aligner.add(TokenLogprob(first, -0.5), "")          # an incomplete character: no text yet
    assert aligner.release("") == []
    aligner.add(TokenLogprob(second, -0.1), " 😊")
    out = aligner.release(" 😊")
    assert [e.text_bytes for e in out] == [b" \xf0\x9f\x98", b"\x8a"]


def test_byte_level_alphabet_is_gpt2s():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert byte_level_alphabet() == {ch: b for b, ch in bytes_to_unicode().items()}


def test_sentencepiece_byte_fallback_tokens():
    """A SentencePiece-style vocabulary (Llama 2, Mistral): `<0xNN>` is that byte, U+2581 a space."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<0xE2>": 1, "<0x82>": 2, "<0xAC>": 3, "\u2581hi": 4, "there": 5}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    token_bytes = TokenBytes(PreTrainedTokenizerFast(tokenizer_object=backend))
    assert [token_bytes.bytes_of(t) for t in range(1, 6)] == [b"\xe2", b"\x82", b"\xac", b" hi", b"there"]


def test_unknown_vocabularies_fall_back_to_the_decoded_text():
    token_bytes = TokenBytes(ByteTokenizer(WORDS))
    assert token_bytes.bytes_of(ord("a")) == b"a" and token_bytes.bytes_of(257) == b"lo W"
    assert token_bytes.bytes_of(0xC3) == "\ufffd".encode()
