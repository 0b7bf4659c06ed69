"""Rendering tools and multi-turn tool conversations: the shipped hermes template for SmolLM2,
whose own template ignores tools (real tokenizer: marked slow)."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import FakeTokenizer

from api.chat.protocol import ChatCompletionRequest
from api.config import ServerConfig
from api.generation.inputs import GenerationInputs
from api.generation.render import ChatPrompt, render_prompt
from api.generation.template_select import conversation_uses_tools, pick_chat_template, template_mentions_tools
from api.protocol.conversation import conversation, tool_inputs
from engine import SamplingParams
from toolparsers import get_tool_parser
from toolparsers.templates import template_path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
LOOP = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "rain"}]},
    {"role": "assistant", "content": "Paris: sunny. Oslo: rain."},
    {"role": "user", "content": "Thanks"},
]
EXPECTED_TAIL = (
    "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nParis: sunny. Oslo: rain.<|im_end|>\n"
    "<|im_start|>user\nThanks<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def request(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": messages, "tools": tools})


async def render_chat_prompt(tokenizer: Any, body: ChatCompletionRequest) -> ChatPrompt:
    """The prompt chat renders for `body` on a server with the hermes tool-call format."""
    tools = tool_inputs(body.tools, body.tool_choice, body.parallel_tool_calls)
    inputs = GenerationInputs(conversation(body.messages), SamplingParams(), tools=tools)
    return await render_prompt(tokenizer, ServerConfig(tool_call_parser="hermes"), inputs)


def test_template_choice_rules() -> None:
    hermes = template_path("hermes_tools").read_text(encoding="utf-8")
    plain = "{{ messages }}"
    assert pick_chat_template(plain, None, True, "hermes") == hermes
    assert pick_chat_template(plain, None, False, "hermes") is None
    assert pick_chat_template("{{ tools }}", None, True, "hermes") is None
    assert pick_chat_template({"default": plain, "tool_use": "{{ tools }}"}, None, True, "hermes") is None
    assert pick_chat_template(plain, "OVERRIDE", True, "hermes") == "OVERRIDE"
    assert pick_chat_template(plain, None, True, "mistral") is None
    assert not template_mentions_tools(None)
    assert conversation_uses_tools(conversation(request(LOOP).messages))
    assert not conversation_uses_tools(conversation(request(LOOP[:2]).messages))


@pytest.mark.anyio
async def test_multi_turn_loop_with_the_fake_tokenizer() -> None:
    tokenizer = FakeTokenizer()
    tokenizer.chat_template = "{{ messages }}"  # ignores tools
    body = request(LOOP, TOOLS)
    prompt = await render_chat_prompt(tokenizer, body)
    assert prompt.text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert prompt.text.endswith(EXPECTED_TAIL)


@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer) -> Any:
    return smollm2_tokenizer


@pytest.mark.slow
@pytest.mark.anyio
async def test_smollm2_multi_turn_tool_loop(smollm2: Any) -> None:
    assert not template_mentions_tools(smollm2.chat_template)
    body = request(LOOP, TOOLS)
    prompt = await render_chat_prompt(smollm2, body)
    assert prompt.text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "get_weather"' in prompt.text
    assert prompt.text.endswith(EXPECTED_TAIL)
    assert smollm2.decode(prompt.token_ids) == prompt.text
    im_start = smollm2.convert_tokens_to_ids("<|im_start|>")
    assert prompt.token_ids[0] == im_start and prompt.token_ids.count(im_start) == prompt.text.count(
        "<|im_start|>"
    )
    # what the model would write back in this format parses into the same calls
    call_text = EXPECTED_TAIL.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = get_tool_parser("hermes")().parse(smollm2.decode(smollm2.encode(call_text)))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_weather", '{"city": "Oslo"}'),
    ]
    # no tools anywhere: SmolLM2's own template, unchanged
    plain = request([{"role": "user", "content": "Hi"}])
    own = await render_chat_prompt(smollm2, plain)
    assert own.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
