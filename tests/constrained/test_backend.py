"""Must-pass / must-fail tables for every grammar kind, on both backends, with the SmolLM2 tokenizer.

Each text is tokenized, fed token by token, then EOS: a must-pass text ends terminated, a
must-fail text has some token (possibly the EOS) rejected and leaves the matcher unterminated.
"""

from __future__ import annotations

import json

import pytest

from constrained import GrammarKind, GrammarSpec, StructuralTag, structural_tag_spec
from constrained.spec import MAX_JSON_WHITESPACE

K = GrammarKind
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name"],
}
ARGS_F = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
ARGS_G = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
TOOLS = structural_tag_spec(
    [
        StructuralTag('<tool_call>{"name":"f","arguments":', ARGS_F, "}</tool_call>"),
        StructuralTag('<tool_call>{"name":"g","arguments":', ARGS_G, "}</tool_call>"),
    ],
    ["<tool_call>"],
)
CALL_F = '<tool_call>{"name":"f","arguments":{"x":1}}</tool_call>'
CALL_G = '<tool_call>{"name":"g","arguments":{"q":"hi"}}</tool_call>'
PARENS_EBNF = 'root ::= "(" num ("," num)* ")"\nnum ::= [0-9]+'
PARENS_LARK = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/'
PARENS_PASS = ["(1)", "(12,3)", "(0,0,7)"]
PARENS_FAIL = ["()", "(1,)", "1", "(1))", "(a)"]

# (case id, spec, must pass, must fail)
CASES = [
    ("json_schema", GrammarSpec(K.JSON_SCHEMA, json.dumps(PERSON)),
     ['{"name":"Ann"}', '{"name":"Ann","age":3}', '{ "name" : "Ann" }', '{"name":"Ann","extra":[true]}'],
     ["{}", '{"name":1}', '{"age":3}', '{"name":"Ann"', '{"name":"Ann"}}', "[]", '{"name":"Ann","age":1.5}']),
    ("json_schema_bounded_whitespace", GrammarSpec(K.JSON_SCHEMA, json.dumps(PERSON)),
     ['{\n  "name": "Ann",\n  "age": 3\n}', '{"name":' + " " * MAX_JSON_WHITESPACE + '"Ann"}'],
     ['{"name":' + " " * (MAX_JSON_WHITESPACE + 1) + '"Ann"}', "{" + "\n" * (MAX_JSON_WHITESPACE + 1) + '"name":"Ann"}']),
    ("json_schema_compact_closed",
     GrammarSpec(K.JSON_SCHEMA, json.dumps(PERSON), any_whitespace=False, additional_properties=False),
     ['{"name":"Ann"}', '{"name":"Ann","age":3}'],
     ['{ "name":"Ann"}', '{"name": "Ann"}', '{"name":"Ann","extra":true}']),
    ("json_schema_array_enum",
     GrammarSpec(K.JSON_SCHEMA, json.dumps({"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1})),
     ['["a"]', '["a","b","a"]'],
     ["[]", '["c"]', '["a",]', '"a"']),
    ("json_object", GrammarSpec(K.JSON_OBJECT, ""),
     ["{}", '{"a":[1,{"b":null}],"c":"d"}', '{"x": "y"}'],
     ["[]", '"s"', "1", '{"a":}', "{"]),
    ("regex", GrammarSpec(K.REGEX, r"\d{3}-[a-z]+"),
     ["123-abc", "000-z"],
     ["12-abc", "123-", "123-abc!", "1234-a"]),
    ("choice", GrammarSpec(K.CHOICE, json.dumps(["yes", "no", 'say "hi"', "café", "two\nlines"])),
     ["yes", "no", 'say "hi"', "café", "two\nlines"],
     ["ye", "yesno", "Yes", "", "cafe"]),
    ("grammar_ebnf", GrammarSpec(K.GRAMMAR, PARENS_EBNF), PARENS_PASS, PARENS_FAIL),
    ("grammar_lark", GrammarSpec(K.GRAMMAR, PARENS_LARK), PARENS_PASS, PARENS_FAIL),
    ("structural_tag", TOOLS,
     ["", "plain text only", f"Sure. {CALL_F}", f"{CALL_F}\n{CALL_G} done", f"a {CALL_G}"],
     ['<tool_call>{"name":"h"', '<tool_call>{"name":"f","arguments":{"x":"no"}}</tool_call>',
      '<tool_call>{"name":"f","arguments":{"x":1}}', 'x <tool_call>{"name":"g","arguments":{"x":1}}</tool_call>']),
]
PASS_ROWS = [pytest.param(spec, text, id=f"{cid}-{i}") for cid, spec, ok, _ in CASES for i, text in enumerate(ok)]
FAIL_ROWS = [pytest.param(spec, text, id=f"{cid}-{i}") for cid, spec, _, bad in CASES for i, text in enumerate(bad)]


@pytest.mark.parametrize(("spec", "text"), PASS_ROWS)
def test_must_pass(backend, run_text, spec, text):
    rejected_at, matcher = run_text(backend, spec, text)
    assert rejected_at is None, f"{backend.name} rejected token {rejected_at} of {text!r}"
    assert matcher.is_terminated()
    assert not matcher.accept([0]) and matcher.is_terminated()


@pytest.mark.parametrize(("spec", "text"), FAIL_ROWS)
def test_must_fail(backend, run_text, encode, spec, text):
    rejected_at, matcher = run_text(backend, spec, text)
    assert rejected_at is not None, f"{backend.name} accepted {text!r}"
    assert rejected_at <= len(encode(text))
    assert not matcher.is_terminated()


def test_compiled_grammar_records_backend(backend):
    compiled = backend.compile(GrammarSpec(K.REGEX, "a+"))
    assert compiled.backend == backend.name
    assert compiled.compile_s >= 0
    assert backend.new_matcher(compiled).backend == backend.name


def test_new_matcher_rejects_other_backend(backends):
    compiled = backends["xgrammar"].compile(GrammarSpec(K.REGEX, "a+"))
    with pytest.raises(ValueError):
        backends["guidance"].new_matcher(compiled)


def test_xgrammar_reads_each_tokens_bytes_as_xgrammar_decodes_them(backends):
    """The backend reads xgrammar's decoded vocabulary from one FFI call (its serialized JSON); the
    bytes must be exactly the public property's, token for token (SmolLM2: byte-level BPE, special
    tokens as text, multi-byte characters and lone bytes of them)."""
    from constrained.xgrammar_backend import _decoded_vocab

    info = backends["xgrammar"]._tokenizer_info
    read = _decoded_vocab(info)
    assert read == [bytes(token) for token in info.decoded_vocab]
    assert all(type(token) is bytes for token in read) and len(read) >= 49152
    assert read[2] == b"<|im_end|>" and b" the" in read
    assert "\u00e9".encode() in read and b"\xc3" in read     # a whole UTF-8 character and a lone byte


def test_xgrammar_vocabulary_read_does_not_wait_on_a_busy_python_thread(backends):
    """Beside a thread busy in Python (an engine stepping while the first grammar compiles), the
    read finishes in about its idle time: per-token FFI calls each gave up the GIL and waited a
    switch interval to retake it, and the read took over 20 s (0.1 s idle), past the 30 s compile
    timeout on a slower machine. The bound, 5 s, is 50x the read's idle time."""
    import threading
    import time

    from constrained.xgrammar_backend import _decoded_vocab

    info = backends["xgrammar"]._tokenizer_info
    done, running = threading.Event(), threading.Event()

    def spin() -> None:
        running.set()
        while not done.is_set():
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    running.wait()
    try:
        start = time.perf_counter()
        read = _decoded_vocab(info)
        seconds = time.perf_counter() - start
    finally:
        done.set()
        thread.join()
    assert len(read) >= 49152 and seconds < 5.0, seconds
