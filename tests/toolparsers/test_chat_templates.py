"""toolparsers/templates: the Hermes-style ChatML template renders tools, calls and tool results."""

from __future__ import annotations

import pytest

from toolparsers.hermes import HermesParser
from toolparsers.templates import template_names, template_path

render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "parameters": WEATHER_SCHEMA}}]


def _render(messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> str:
    """Render as tokenizer.apply_chat_template(messages, tools=..., chat_template=...) does."""
    text = template_path("hermes_tools").read_text()
    rendered, _ = render_jinja_template(
        [messages], tools=tools, chat_template=text, add_generation_prompt=add_generation_prompt
    )
    return rendered[0]


def test_template_lookup() -> None:
    assert "hermes_tools" in template_names()
    assert template_path("hermes_tools.jinja") == template_path("hermes_tools")
    with pytest.raises(FileNotFoundError, match="hermes_tools"):
        template_path("nope")


def test_without_tools_it_is_plain_chatml() -> None:
    text = _render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<tools>" not in text
    no_prompt = _render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert no_prompt.endswith("<|im_start|>user\nHi<|im_end|>\n")
    assert no_prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_tools_are_listed_in_the_system_turn() -> None:
    text = _render([{"role": "user", "content": "Weather in Dublin?"}], tools=TOOLS)
    system = text.split("<|im_end|>")[0]
    assert '"name": "get_weather"' in system and "<tools>" in system and "<tool_call>" in system
    assert text.endswith("<|im_start|>user\nWeather in Dublin?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("arguments", ['{"city": "Dublin"}', {"city": "Dublin"}])
def test_multi_turn_tool_loop(arguments: object) -> None:
    messages = [
        {"role": "user", "content": "Weather in Dublin and Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": arguments}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
        {"role": "assistant", "content": "12C and rain."},
        {"role": "user", "content": "Thanks"},
    ]
    text = _render(messages, tools=TOOLS)
    turns = text.split("<|im_start|>")
    assistant_calls = turns[3]
    assert assistant_calls.startswith("assistant\n<tool_call>\n")
    parsed = HermesParser().parse(assistant_calls[len("assistant"):].removesuffix("<|im_end|>\n"))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", '{"city": "Dublin"}')] * 2
    assert turns[4] == (
        "user\n<tool_response>\n12C\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
    )
    assert turns[5] == "assistant\n12C and rain.<|im_end|>\n"
    assert turns[-1] == "assistant\n"
