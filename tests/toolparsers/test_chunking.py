"""The chunking test (STYLE §9): for any split of a sample output, merged feed() + finish() == parse().

Also the streaming rules of an open call (toolparsers/base.py): every argument fragment but a call's
last leaves a prefix that partial-json-parser reads (so a client parsing each prefix never fails),
and the fragments of a call concatenate to its arguments.
"""

from __future__ import annotations

import json
import time

import pytest
from partial_json_parser import Allow
from partial_json_parser import loads as partial_loads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolparsers import ToolParser, ToolSpec, get_tool_parser

WEATHER = ToolSpec(
    "get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)
H_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Dublin"}}\n</tool_call>'
Q_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nDublin\n</parameter>\n</function>\n</tool_call>"
)

SAMPLES: dict[str, list[str]] = {
    "hermes": [
        "",
        "Just text, no calls. a < b and <tool> tags.",
        "Let me check." + H_CALL,
        "Let me check.\n" + H_CALL + "\nIt is sunny.",
        H_CALL + "\n" + H_CALL.replace("Dublin", "Zürich 🌞"),
        '<tool_call>{"name": "f", "arguments": {"s": "quote \\" brace } </tool_call-ish \\u00e9\\n"}}'
        "</tool_call>",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call> and '
        '<tool_call>{"name": "g"}</tool_call>',
        "Broken: <tool_call>{not json}</tool_call> then " + H_CALL,
        "Unclosed: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Dub",
        'No end marker:\n<tool_call>\n{"name": "get_time", "arguments": {}}\n',
        "Ends on a partial marker <tool_ca",
        "<tool_call><tool_call>" + H_CALL[len("<tool_call>"):] + "  \n\n  ",
        '<tool_call>{"name": "f", "arguments": {"t": "a </tool_call> b"}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call> then ' + H_CALL,
        # streamed then broken (the header went out): the model's text stays the arguments
        '<tool_call>{"name": "f", "arguments": {"s": "\\ud83d\\ude00 \\u00e9", "n": 12, "b": tru}}</tool_call>x',
        '<tool_call>{"name": "f", "arguments": {"s": "open string',
    ],
    "llama3_json": [
        "",
        "Plain text with {braces} and {\"json\": true}.",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Dublin"}}',
        'Let me check. {"name": "get_weather", "parameters": {"city": "Dublin"}} Done.',
        '{"name": "a", "parameters": {"x": [1, {"y": "}"}]}}; {"name": "b", "parameters": {}};',
        '{"type": "function", "name": "f", "parameters": {"s": "ünï \\"q\\" \\\\ \\u2603"}}',
        '{"name": "f", "parameters": {"x": 1} oops',
        '{"name": 42, "parameters": {}} not a call',
        "trailing {  \"na",
        "<|python_ta",
    ],
    "mistral": [
        "",
        "No calls [here] at all [TOOL_",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}]',
        'Sure. [TOOL_CALLS] [{"name": "a", "arguments": {"s": "] }"}}, {"name": "b", "arguments": {}}] ok',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}[TOOL_CALLS]b[CALL_ID]abc123XYZ[ARGS]{}',
        "[TOOL_CALLS] nope, no call here. [TOOL_CALLS][{\"name\": \"x\"}]",
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}',
        "[TOOL_CALLS]get_weather[AR",
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [1, }}] tail',
    ],
    "pythonic": [
        "",
        "Plain text [with brackets] and [f(x)] calls-ish.",
        '[get_weather(city="Dublin", days=3)]',
        'Let me check. [get_weather(city="Dublin"), get_time()] Done.',
        "[f(s='it\\'s ] )', t=\"\"\"tri]ple\"\"\", n=None, b=True, l=(1, 2), d={'k': [1.5]})]",
        '[f(s="ünï 🌞 \\u2603")]',
        "[f(1, 2)] positional is not a call",
        "[f(x=set())] and [g(a=1",
        "trailing [ get_w",
        "[f(a=1, b='x, y'), g(c=[1, 2], d=oops)] after",
    ],
    "qwen3_coder": [
        "",
        "Text only with <function=x> mention.",
        "Let me check." + Q_CALL,
        Q_CALL + "\n" + Q_CALL.replace("Dublin", "Zürich").replace(
            "</function>", "<parameter=days>\n3\n</parameter>\n</function>"
        ),
        "<tool_call><function=f><parameter=code>if (a < b) {\n  x = \"</param\";\n}</parameter></function>"
        "</tool_call>",
        "<tool_call>\n<function=get_weather>\nno parameters here\n</function>\n</tool_call> after",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nDub",
        "<tool_call>\n<function=get_time>\n</function>\n",
        "<tool_call><function=f><parameter=xml>\n<tool_call></tool_call>\n</parameter></function></tool_call>",
    ],
}

CASES = [(name, text) for name, texts in SAMPLES.items() for text in texts]


def _new(name: str) -> ToolParser:
    return get_tool_parser(name)([WEATHER])


def _reference(name: str, text: str) -> tuple[str, list[tuple[str, str]]]:
    result = _new(name).parse(text)
    assert [c.name for c in result.tool_calls] == [d.name for d in result.deltas if d.name is not None]
    calls = [(c.name, c.arguments) for c in result.tool_calls]
    assert _stream(name, [text]) == (result.content, calls), "parse() deltas reassemble to its calls"
    return result.content, calls


def _stream(name: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Feed pieces, check the delta addressing rules, and reassemble content and calls by index."""
    parser = _new(name)
    results = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    content = "".join(r.content for r in results)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    ids: set[str] = set()
    fragments: dict[int, list[str]] = {}
    for delta in (d for r in results for d in r.deltas):
        if delta.index not in names:
            assert delta.index == len(names), "calls are numbered 0..N-1 in order"
            assert delta.id and delta.id.startswith("call_") and len(delta.id) == 29 and delta.id not in ids
            assert delta.name
            ids.add(delta.id)
            names[delta.index] = delta.name
            arguments[delta.index] = ""
        else:
            assert delta.id is None and delta.name is None
        arguments[delta.index] += delta.arguments_delta
        if delta.arguments_delta:
            fragments.setdefault(delta.index, []).append(arguments[delta.index])
    for prefixes in fragments.values():
        step = max(1, len(prefixes) // 50)  # a long call: 50 of its prefixes (the check is quadratic)
        for prefix in prefixes[:-1:step]:
            assert isinstance(partial_loads(prefix, Allow.ALL), dict), prefix
    calls = [(names[i], arguments[i]) for i in range(len(names))]
    return content, calls


@pytest.mark.parametrize(("name", "text"), CASES)
def test_every_split_point(name: str, text: str) -> None:
    expected = _reference(name, text)
    assert _stream(name, [text]) == expected
    assert _stream(name, list(text)) == expected
    for cut in range(1, len(text)):
        assert _stream(name, [text[:cut], text[cut:]]) == expected, cut


@pytest.mark.parametrize("name", sorted(SAMPLES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_multi_splits(name: str, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(SAMPLES[name]))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert _stream(name, pieces) == _reference(name, text)


FRAGMENTS = list('<>[]{}()"\\;=_ ,:\nabé') + [
    "<tool_call>", "</tool_call>", '{"name": "f"', ', "arguments": ', ', "parameters": ', "{}", "}",
    "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<function=f>", "<parameter=city>", "</parameter>",
    "</function>", "[f(", "a=1)",
]


@pytest.mark.parametrize("name", sorted(SAMPLES))
@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=30))
def test_arbitrary_text_never_raises_and_streams_equal(name: str, parts: list[str]) -> None:
    text = "".join(parts)
    expected = _reference(name, text)
    assert _stream(name, list(text)) == expected
    assert _stream(name, parts) == expected


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_long_call_streams_in_linear_time(name: str) -> None:
    """A held-back call is not rescanned from its start on every delta (a 20 kB write_file argument)."""
    code = "".join(f'def f{i}(x):\n    return "{{[(x)]}}" + \'q\'\n' for i in range(450))
    args = json.dumps({"text": code})
    text = {
        "hermes": f'<tool_call>\n{{"name": "w", "arguments": {args}}}\n</tool_call>',
        "llama3_json": f'{{"name": "w", "parameters": {args}}}',
        "mistral": f'[TOOL_CALLS][{{"name": "w", "arguments": {args}}}]',
        "pythonic": f"[w(text={code!r})]",
        "qwen3_coder": f"<tool_call>\n<function=w>\n<parameter=text>\n{code}\n</parameter>\n</function>\n"
        "</tool_call>",
    }[name]
    parser = _new(name)
    started = time.perf_counter()
    results = [parser.feed(text[i:i + 4]) for i in range(0, len(text), 4)] + [parser.finish()]
    assert time.perf_counter() - started < 3.0
    arguments = "".join(d.arguments_delta for r in results for d in r.deltas)
    assert "".join(r.content for r in results) == "" and json.loads(arguments) == {"text": code}
    if name in ("hermes", "llama3_json", "mistral"):   # JSON on the wire: the argument streams as written
        assert sum(len(r.deltas) for r in results) > 1000
