"""api/generation/render.py: messages -> template dicts -> prompt ids."""

from __future__ import annotations

import pytest
from api_support import FakeTokenizer

from api.chat.protocol import ChatCompletionRequest
from api.config import ServerConfig
from api.errors import InvalidRequest
from api.generation.inputs import GenerationInputs, RenderOptions
from api.generation.render import ChatPrompt, render_prompt, template_dict
from api.protocol.conversation import conversation
from engine import SamplingParams


def messages(*raw: dict) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": list(raw)})


async def render_chat_prompt(
    tokenizer, request: ChatCompletionRequest, options: RenderOptions, chat_template: str | None = None
) -> ChatPrompt:
    """The prompt of `request`'s messages (no tools) as chat renders it."""
    inputs = GenerationInputs(conversation(request.messages), SamplingParams(), render=options)
    return await render_prompt(tokenizer, ServerConfig(chat_template=chat_template), inputs)


def test_template_dicts() -> None:
    request = messages(
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "hi", "name": "bob"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [{"id": "d", "function": {"name": "g", "arguments": "not json"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "1"},
    )
    dicts = [template_dict(m) for m in conversation(request.messages)]
    assert dicts[0] == {"role": "system", "content": "a\nb"}
    assert dicts[1] == {"role": "user", "content": "hi", "name": "bob"}
    assert dicts[2]["content"] == "" and dicts[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert dicts[3]["tool_calls"][0]["function"]["arguments"] == "not json"
    assert dicts[4] == {"role": "tool", "content": "1", "tool_call_id": "c"}


@pytest.mark.anyio
async def test_render_errors() -> None:
    tokenizer = FakeTokenizer()
    request = messages({"role": "user", "content": "hi"})
    with pytest.raises(InvalidRequest, match="continue_final_message"):
        await render_chat_prompt(
            tokenizer, request, RenderOptions(add_generation_prompt=False, continue_final_message=True)
        )
    with pytest.raises(InvalidRequest, match="rejected"):
        await render_chat_prompt(tokenizer, request, RenderOptions(), chat_template="{{ raise_undefined_call() }}")
    tokenizer.chat_template = None
    with pytest.raises(InvalidRequest, match="no chat template"):
        await render_chat_prompt(tokenizer, request, RenderOptions())


@pytest.mark.anyio
async def test_override_template_and_kwargs() -> None:
    request = messages({"role": "user", "content": "hi"})
    options = RenderOptions(chat_template_kwargs={"flavour": "x", "tokenize": True})
    prompt = await render_chat_prompt(
        FakeTokenizer(), request, options, chat_template="[{{ messages[0].content }}|{{ flavour }}]"
    )
    assert prompt.text == "[hi|x]" and prompt.token_ids == list(b"[hi|x]")


@pytest.mark.slow
@pytest.mark.anyio
async def test_smollm2_template_has_one_bos(smollm2_tokenizer) -> None:
    tokenizer = smollm2_tokenizer
    request = messages({"role": "user", "content": "Hi"})
    prompt = await render_chat_prompt(tokenizer, request, RenderOptions())
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert prompt.token_ids[0] == im_start and prompt.token_ids[1] != im_start
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(prompt.token_ids) == prompt.text
