"""Matcher contract on both backends: atomic accept, rollback, EOS handling, forced tokens, bitmask."""

from __future__ import annotations

import json

import pytest
import torch

from constrained import (
    GrammarKind,
    GrammarSpec,
    VocabInfo,
    allocate_bitmask,
    allowed_token_ids,
    get_grammar_backend,
)

K = GrammarKind
REGEX = GrammarSpec(K.REGEX, r"\d{3}-[a-z]+")
PERSON = GrammarSpec(
    K.JSON_SCHEMA,
    json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
    any_whitespace=False,
)


def mask_of(matcher, vocab_size: int) -> torch.Tensor:
    bitmask = allocate_bitmask(2, vocab_size)
    bitmask.zero_()
    matcher.fill_bitmask(bitmask, 1)
    assert int(bitmask[0].abs().sum()) == 0, "fill_bitmask wrote outside its row"
    return bitmask[1].clone()


def test_accept_is_atomic(backend, encode):
    matcher = backend.new_matcher(backend.compile(REGEX))
    assert not matcher.accept(encode("12") + encode("x"))
    assert not matcher.accept([-1]) and not matcher.accept([10**9])
    assert matcher.accept(encode("123-abc"))
    assert matcher.accept([])


def test_rollback_restores_state(backend, encode, vocab_info):
    matcher = backend.new_matcher(backend.compile(PERSON))
    eos = vocab_info.eos_token_ids[0]
    ids = encode('{"name":"Ann"}')
    assert matcher.accept(ids[:2])
    before = mask_of(matcher, vocab_info.vocab_size)
    assert matcher.accept(ids[2:])
    assert not torch.equal(before, mask_of(matcher, vocab_info.vocab_size))
    matcher.rollback(len(ids) - 2)
    assert torch.equal(before, mask_of(matcher, vocab_info.vocab_size))
    assert matcher.accept(ids[2:]) and matcher.accept([eos]) and matcher.is_terminated()
    matcher.rollback(1)
    assert not matcher.is_terminated() and matcher.is_accepting()
    assert matcher.accept([eos]) and matcher.is_terminated()
    matcher.rollback(len(ids) + 1)
    assert not matcher.is_accepting()
    assert matcher.accept(ids + [eos])
    with pytest.raises(ValueError):
        matcher.rollback(len(ids) + 2)
    with pytest.raises(ValueError):
        matcher.rollback(-1)


def test_eos_only_at_accepting_state(backend, encode, vocab_info):
    matcher = backend.new_matcher(backend.compile(REGEX))
    eos, vocab_size = vocab_info.eos_token_ids[0], vocab_info.vocab_size
    assert eos not in allowed_token_ids(mask_of(matcher, vocab_size).unsqueeze(0), 0, vocab_size)
    assert not matcher.accept([eos]) and not matcher.is_terminated()
    assert matcher.accept(encode("123-ab"))
    allowed = allowed_token_ids(mask_of(matcher, vocab_size).unsqueeze(0), 0, vocab_size)
    assert eos in allowed and encode("c")[0] in allowed and encode("1")[0] not in allowed
    assert matcher.is_accepting()
    assert matcher.accept([eos]) and matcher.is_terminated() and not matcher.is_accepting()
    assert not matcher.accept(encode("c")) and not matcher.accept([eos])
    assert allowed_token_ids(mask_of(matcher, vocab_size).unsqueeze(0), 0, vocab_size) == [eos]
    assert matcher.forced_tokens() == []


def test_eos_inside_a_batch_of_tokens(backend, encode, vocab_info):
    matcher = backend.new_matcher(backend.compile(REGEX))
    eos = vocab_info.eos_token_ids[0]
    assert not matcher.accept(encode("123-ab") + [eos] + encode("c"))
    assert not matcher.accept(encode("123-") + [eos])
    assert matcher.accept(encode("123-ab") + [eos]) and matcher.is_terminated()


def test_forced_tokens(backend, tokenizer):
    matcher = backend.new_matcher(backend.compile(PERSON))
    forced = matcher.forced_tokens()
    text = tokenizer.decode(forced)
    assert forced and '{"name":"'.startswith(text), text
    assert matcher.accept(forced)
    free = backend.new_matcher(backend.compile(GrammarSpec(K.REGEX, "[a-z]+")))
    assert free.forced_tokens() == []


def test_reset(backend, encode, vocab_info):
    matcher = backend.new_matcher(backend.compile(REGEX))
    initial = mask_of(matcher, vocab_info.vocab_size)
    assert matcher.accept(encode("123-ab") + [vocab_info.eos_token_ids[0]])
    matcher.reset()
    assert not matcher.is_terminated()
    assert torch.equal(initial, mask_of(matcher, vocab_info.vocab_size))
    assert matcher.accept(encode("999-z"))


def test_fill_bitmask_checks_layout(backend, vocab_info):
    matcher = backend.new_matcher(backend.compile(REGEX))
    width = (vocab_info.vocab_size + 31) // 32
    for bad, row in [(torch.zeros(1, width, dtype=torch.int64), 0), (torch.zeros(1, width - 1, dtype=torch.int32), 0),
                     (torch.zeros(1, width, dtype=torch.int32), 1), (torch.zeros(width, 2, dtype=torch.int32).t(), 0)]:
        with pytest.raises(ValueError):
            matcher.fill_bitmask(bad, row)


def test_batched_fill_equals_single_fills(backend, encode, vocab_info):
    compiled = backend.compile(PERSON)
    matchers = [backend.new_matcher(compiled) for _ in range(3)]
    assert matchers[1].accept(encode('{"name":"A'))
    assert matchers[2].accept(encode('{"name":"A"}') + [vocab_info.eos_token_ids[0]])
    batched = allocate_bitmask(4, vocab_info.vocab_size)
    backend.fill_bitmasks([(m, row) for row, m in zip((3, 0, 1), matchers)], batched)
    assert torch.equal(batched[2], torch.full_like(batched[2], -1))  # untouched row
    for row, m in zip((3, 0, 1), matchers):
        assert torch.equal(batched[row], mask_of(m, vocab_info.vocab_size))


def test_padded_vocab_never_allows_padding_tokens(backends, tokenizer, encode):
    padded = VocabInfo.from_huggingface(tokenizer, vocab_size=49152 + 40)
    for name in backends:
        backend = get_grammar_backend(name)(padded)
        matcher = backend.new_matcher(backend.compile(GrammarSpec(K.JSON_OBJECT, "")))
        bitmask = allocate_bitmask(1, padded.vocab_size)
        assert bitmask.shape == (1, 1538)
        for text in ("{", '"a"'):
            matcher.fill_bitmask(bitmask, 0)
            allowed = allowed_token_ids(bitmask, 0, padded.vocab_size)
            assert allowed and max(allowed) < 49152, name
            assert not matcher.accept([49152 + 5])
            assert matcher.accept(encode(text))
