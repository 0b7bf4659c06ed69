"""GrammarCompiler: cache (failures included), stats, auto fallback, timeouts, errors, registry."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
import torch

from constrained import (
    AUTO_ORDER,
    GRAMMAR_BACKENDS,
    CompiledGrammar,
    GrammarBackend,
    GrammarCompiler,
    GrammarCompileTimeout,
    GrammarConfig,
    GrammarConfigError,
    GrammarKind,
    GrammarSpec,
    InvalidGrammar,
    Matcher,
    UnknownGrammarBackend,
    UnwritableGrammar,
    get_grammar_backend,
)

K = GrammarKind


class AcceptingMatcher(Matcher):
    """What the compiler's writability check sees of a fake grammar: accepting from the start and
    forcing nothing (the check's only questions); the rest is never called."""

    backend = "fake"

    def accept(self, token_ids: Sequence[int]) -> bool:
        raise AssertionError("the compiler tests never feed tokens")

    def _fill_next(self, bitmask, row: int) -> None:
        raise AssertionError("the compiler tests never fill bitmasks")

    def rollback(self, num_tokens: int) -> None:
        raise AssertionError("the compiler tests never roll back")

    def is_terminated(self) -> bool:
        return False

    def is_accepting(self) -> bool:
        return True

    def forced_tokens(self) -> list[int]:
        return []

    def reset(self) -> None:
        raise AssertionError("the compiler tests never reset a matcher")


class FakeBackend(GrammarBackend):
    """Compiles after `delay_s`; refuses sources containing `refuse`; counts calls."""

    def __init__(self, vocab_info, name: str, refuse: str = "\0", delay_s: float = 0.0) -> None:
        super().__init__(vocab_info)
        self.name, self.refuse, self.delay_s, self.calls = name, refuse, delay_s, 0

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.refuse in spec.source:
            raise InvalidGrammar(f"{self.name} cannot compile {spec.kind.value}: feature {self.refuse!r}")
        return CompiledGrammar(self.name, spec, object(), self.delay_s)

    def new_matcher(self, compiled: CompiledGrammar) -> Matcher:
        return AcceptingMatcher(self.vocab_info)

    def fill_bitmasks(self, matchers: Sequence[tuple[Matcher, int]], bitmask) -> None:
        raise AssertionError("the compiler tests never ask the fake backend for bitmasks")


def fake_compiler(vocab_info, config=None, **refusals) -> GrammarCompiler:
    fakes = {name: FakeBackend(vocab_info, name, refusals.get(name, "\0")) for name in GRAMMAR_BACKENDS}
    return GrammarCompiler(vocab_info, config or GrammarConfig(), backends=fakes)


def test_cache_hits_use_canonical_json(vocab_info):
    compiler = fake_compiler(vocab_info)
    first = compiler.compile(GrammarSpec(K.JSON_SCHEMA, '{"type": "object", "b": 1, "a": 2}'))
    again = compiler.compile(GrammarSpec(K.JSON_SCHEMA, '{"type":"object",\n "b":1,"a":2}'))
    reordered = compiler.compile(GrammarSpec(K.JSON_SCHEMA, '{"type":"object","a":2,"b":1}'))
    assert again is first and reordered is not first  # key order matters to xgrammar's output order
    other_option = compiler.compile(GrammarSpec(K.JSON_SCHEMA, '{"type":"object","b":1,"a":2}', any_whitespace=False))
    assert other_option is not first
    stats = compiler.stats()
    assert (stats.cache_hits, stats.cache_misses, stats.num_compiles, stats.num_failures) == (1, 3, 3, 0)
    assert stats.compile_s_sum >= 0 and stats.compile_s_max >= 0


def test_failures_are_cached(vocab_info):
    compiler = fake_compiler(vocab_info, **{name: "bad" for name in GRAMMAR_BACKENDS})
    spec = GrammarSpec(K.REGEX, "bad(", backend="xgrammar")
    for _ in range(2):
        with pytest.raises(InvalidGrammar, match="feature 'bad'"):
            compiler.compile(spec)
    assert compiler.get_backend("xgrammar").calls == 1
    for _ in range(2):
        with pytest.raises(InvalidGrammar, match="not valid JSON"):
            compiler.compile(GrammarSpec(K.JSON_SCHEMA, "{nope"))
    stats = compiler.stats()
    assert (stats.cache_hits, stats.cache_misses, stats.num_failures) == (2, 2, 2)


def test_auto_falls_back_to_the_other_backend(vocab_info):
    first, second = AUTO_ORDER
    compiler = fake_compiler(vocab_info, **{first: "x-feature"})
    compiled = compiler.compile(GrammarSpec(K.REGEX, "x-feature"))
    assert compiled.backend == second
    assert compiler.compile(GrammarSpec(K.REGEX, "plain")).backend == first
    with pytest.raises(InvalidGrammar, match=f"{first} cannot"):
        compiler.compile(GrammarSpec(K.REGEX, "x-feature", backend=first))


def test_auto_names_every_backend_when_all_fail(vocab_info):
    compiler = fake_compiler(vocab_info, **{name: "zz" for name in GRAMMAR_BACKENDS})
    with pytest.raises(InvalidGrammar) as info:
        compiler.compile(GrammarSpec(K.REGEX, "zz"))
    assert all(f"{name} cannot compile regex" in info.value.message for name in GRAMMAR_BACKENDS)
    assert info.value.param == "regex"


def test_default_backend_from_config(vocab_info):
    compiler = fake_compiler(vocab_info, GrammarConfig(default_backend="xgrammar"), xgrammar="q")
    with pytest.raises(InvalidGrammar, match="xgrammar"):
        compiler.compile(GrammarSpec(K.REGEX, "q"))


def test_timeout_then_late_result_replaces_cache_entry(vocab_info):
    slow = FakeBackend(vocab_info, "xgrammar", delay_s=0.5)
    compiler = GrammarCompiler(vocab_info, GrammarConfig(compile_timeout_s=0.05), backends={"xgrammar": slow})
    spec = GrammarSpec(K.REGEX, "a+", backend="xgrammar")
    with pytest.raises(GrammarCompileTimeout, match="0.05 s"):
        compiler.submit(spec).result(timeout=5)
    assert compiler.stats().num_timeouts == 1
    time.sleep(0.8)
    assert compiler.submit(spec).result(timeout=5).backend == "xgrammar"
    assert slow.calls == 1
    compiler.close()


class SlowBuildBackend(FakeBackend):
    """A backend whose one-time build takes longer than the compile timeout below, as a real one
    reading a 49k-token vocabulary can on a slow or busy machine; its compiles are instant."""

    def __init__(self, vocab_info) -> None:
        time.sleep(0.6)
        super().__init__(vocab_info, "slowbuild")


def test_the_compile_timeout_does_not_count_a_backends_one_time_build(vocab_info, monkeypatch):
    monkeypatch.setitem(GRAMMAR_BACKENDS, "slowbuild", f"{__name__}:SlowBuildBackend")
    compiler = GrammarCompiler(vocab_info, GrammarConfig(compile_timeout_s=0.3))
    compiled = compiler.submit(GrammarSpec(K.REGEX, "a+", backend="slowbuild")).result(timeout=5)
    assert compiled.backend == "slowbuild"
    assert compiler.stats().num_timeouts == 0 and compiler.get_backend("slowbuild").calls == 1
    compiler.close()


def test_lru_bound(vocab_info):
    compiler = fake_compiler(vocab_info, GrammarConfig(max_cache_entries=2))
    specs = [GrammarSpec(K.REGEX, s) for s in ("a", "b", "c")]
    for spec in specs:
        compiler.compile(spec)
    compiler.compile(specs[0])
    assert compiler.stats().cache_misses == 4


def test_unknown_backend_and_bad_config(vocab_info):
    compiler = fake_compiler(vocab_info)
    with pytest.raises(UnknownGrammarBackend, match="xgrammar"):
        compiler.compile(GrammarSpec(K.REGEX, "a", backend="outlines"))
    with pytest.raises(InvalidGrammar):
        get_grammar_backend("outlines")
    for bad in ({"default_backend": "outlines"}, {"compile_timeout_s": 0}, {"max_workers": 0}):
        with pytest.raises(GrammarConfigError):
            GrammarConfig(**bad)


def test_registry_imports_every_entry():
    for name in GRAMMAR_BACKENDS:
        cls = get_grammar_backend(name)
        assert issubclass(cls, GrammarBackend) and cls.name == name


def test_package_import_does_not_import_libraries():
    code = "import sys, constrained; assert not {'xgrammar', 'llguidance'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# Real backends: every failure is InvalidGrammar, never another exception type.
SCHEMA_LOOKBEHIND = json.dumps({"type": "string", "pattern": "(?<=a)b"})
SCHEMA_IF_THEN = json.dumps({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}})
BAD_SPECS = [
    pytest.param(GrammarSpec(K.REGEX, "a(b"), "", id="bad-regex"),
    pytest.param(GrammarSpec(K.JSON_SCHEMA, '{"type":'), "not valid JSON", id="schema-not-json"),
    pytest.param(GrammarSpec(K.JSON_SCHEMA, "[1, 2]"), "object or a boolean", id="schema-not-object"),
    pytest.param(GrammarSpec(K.JSON_SCHEMA, SCHEMA_LOOKBEHIND), "look", id="lookbehind"),
    pytest.param(GrammarSpec(K.GRAMMAR, "root ::= undefined_rule"), "undefined_rule", id="ebnf-undefined-rule"),
    pytest.param(GrammarSpec(K.GRAMMAR, "start: ("), "", id="lark-syntax"),
    pytest.param(GrammarSpec(K.CHOICE, '["a", 1]'), "list of strings", id="choice-not-strings"),
    pytest.param(GrammarSpec(K.STRUCTURAL_TAG, '{"structures": []}'), "triggers", id="tag-no-triggers"),
    pytest.param(GrammarSpec(K.STRUCTURAL_TAG, '{"structures":[{"begin":"<a>","schema":{},"end":""}],'
                                               '"triggers":["<b>"]}'), "no trigger", id="tag-begin-no-trigger"),
]


@pytest.fixture(scope="module")
def real_compiler(vocab_info, backends):
    compiler = GrammarCompiler(vocab_info, GrammarConfig(), backends=backends)
    yield compiler
    compiler.close()


@pytest.mark.parametrize("backend_name", [None, *GRAMMAR_BACKENDS])
@pytest.mark.parametrize(("spec", "needle"), BAD_SPECS)
def test_bad_specs_raise_invalid_grammar(real_compiler, spec, needle, backend_name):
    spec = GrammarSpec(spec.kind, spec.source, backend=backend_name)
    with pytest.raises(InvalidGrammar) as info:
        real_compiler.compile(spec)
    assert needle.lower() in info.value.message.lower()
    assert info.value.param == spec.kind.value


def test_real_auto_fallback_only_to_an_exact_constraint(real_compiler):
    # guidance does not implement format "uri-reference"; xgrammar does, exactly: auto falls back.
    uri_reference = json.dumps({"type": "string", "format": "uri-reference"})
    with pytest.raises(InvalidGrammar, match='format "uri-reference"'):
        real_compiler.compile(GrammarSpec(K.JSON_SCHEMA, uri_reference, backend="guidance"))
    assert real_compiler.compile(GrammarSpec(K.JSON_SCHEMA, uri_reference)).backend == "xgrammar"
    # Neither enforces if/then: auto refuses, naming the keyword for each backend.
    with pytest.raises(InvalidGrammar) as info:
        real_compiler.compile(GrammarSpec(K.JSON_SCHEMA, SCHEMA_IF_THEN))
    for name in AUTO_ORDER:
        assert f'{name} cannot enforce json_schema: "if" at # (not implemented)' in info.value.message


def test_real_matchers_and_batched_fill(real_compiler, encode, vocab_info):
    from constrained import allocate_bitmask, allowed_token_ids

    grammars = [real_compiler.compile(GrammarSpec(K.REGEX, "[0-9]+", backend=name)) for name in GRAMMAR_BACKENDS]
    matchers = [real_compiler.new_matcher(g) for g in grammars]
    assert [m.backend for m in matchers] == list(GRAMMAR_BACKENDS)
    bitmask = allocate_bitmask(len(matchers), vocab_info.vocab_size)
    real_compiler.fill_bitmasks([(m, row) for row, m in enumerate(matchers)], bitmask)
    assert bool((bitmask == bitmask[0]).all())  # both backends allow exactly the same tokens
    assert encode("7")[0] in allowed_token_ids(bitmask, 0, vocab_info.vocab_size)


def test_mixed_batch_rows_without_grammar_allow_all_and_finished_rows_only_eos(real_compiler, encode,
                                                                              vocab_info):
    """The row rule of constrained.backend.fill_settled_row, through the compiler the engine uses:
    a row without a matcher allows every token, a terminated matcher's row only EOS (both backends)."""
    from constrained import allocate_bitmask, allowed_token_ids

    eos = vocab_info.eos_token_ids[0]
    matchers = []
    for name in GRAMMAR_BACKENDS:
        matcher = real_compiler.new_matcher(real_compiler.compile(GrammarSpec(K.REGEX, "[0-9]+", backend=name)))
        assert matcher.accept(encode("42") + [eos]) and matcher.is_terminated()
        matchers.append(matcher)
    live = real_compiler.new_matcher(real_compiler.compile(GrammarSpec(K.REGEX, "[0-9]+", backend="xgrammar")))
    rows = [None, *matchers, live, None]
    bitmask = allocate_bitmask(len(rows), vocab_info.vocab_size)
    bitmask.zero_()
    real_compiler.fill_bitmasks([(m, row) for row, m in enumerate(rows)], bitmask)
    everything = list(range(vocab_info.vocab_size))
    assert allowed_token_ids(bitmask, 0, vocab_info.vocab_size) == everything
    assert allowed_token_ids(bitmask, len(rows) - 1, vocab_info.vocab_size) == everything
    for row in (1, 2):
        assert allowed_token_ids(bitmask, row, vocab_info.vocab_size) == [eos]
        single = allocate_bitmask(1, vocab_info.vocab_size)
        rows[row].fill_bitmask(single, 0)
        assert torch.equal(single[0], bitmask[row])
    allowed = allowed_token_ids(bitmask, 3, vocab_info.vocab_size)
    assert encode("7")[0] in allowed and eos not in allowed


def test_warm_up_builds_the_default_backends(vocab_info, backends):
    compiler = GrammarCompiler(vocab_info, GrammarConfig(default_backend="guidance"), backends={})
    compiler.warm_up()
    built = compiler.get_backend("guidance")
    assert built.name == "guidance" and compiler.get_backend("guidance") is built
    compiler.close()


# SmolLM2's byte-level vocabulary has no token for the byte 0x16 (nor 0x04, 0x06, 0x13, 0x14, 0x1d,
# 0xf1-0xf4): these grammars need text it cannot write (the fuzzer's choice ["\x16"], a 500 before).
@pytest.mark.parametrize("backend_name", ["xgrammar", "guidance"])
@pytest.mark.parametrize("alternatives", [["\x16"], ["a\x16"], ["\x16", "\x16\x16"], ["\x160"], ["\x04a"],
                                          ["\U00040000"]])
def test_a_choice_the_vocabulary_cannot_write_is_refused_when_it_compiles(vocab_info, backend_name, alternatives):
    compiler = GrammarCompiler(vocab_info, GrammarConfig(default_backend=backend_name))
    spec = GrammarSpec(K.CHOICE, json.dumps(alternatives))
    with pytest.raises(UnwritableGrammar, match="cannot be written by this model") as info:
        compiler.compile(spec)
    assert info.value.param == "choice"
    compiler.close()


@pytest.mark.parametrize("backend_name", ["xgrammar", "guidance"])
@pytest.mark.parametrize("unwritable", ["\x16", "\x160", "\U00040000 "])
def test_a_dead_end_after_free_text_is_found_by_the_matcher(vocab_info, encode, backend_name, unwritable):
    """llguidance's bitmask at such a dead end allows one token its matcher refuses (the "0" after
    "\\x16"): is_dead_end tries it, on both backends alike."""
    compiler = GrammarCompiler(vocab_info, GrammarConfig(default_backend=backend_name))
    writable = compiler.compile(GrammarSpec(K.CHOICE, json.dumps([unwritable, "b"])))   # one alternative is enough
    assert not compiler.new_matcher(writable).is_dead_end()
    matcher = compiler.new_matcher(compiler.compile(GrammarSpec(K.REGEX, f"(a|b){re.escape(unwritable)}")))
    assert not matcher.is_dead_end()          # "a" or "b" first: nothing is forced, so it compiles
    assert matcher.accept(encode("a"))
    assert matcher.is_dead_end() and not matcher.is_accepting()
    compiler.close()
