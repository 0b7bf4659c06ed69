"""/tokenize with messages + tools (+ tool_choice) counts exactly the prompt chat sends (SmolLM2's
tokenizer and template, whose template ignores tools: the server renders the shipped hermes tool
template instead, for chat and /tokenize alike)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_support import FakeEngine

from api.app import create_app
from api.config import ServerConfig

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


async def test_tokenize_counts_the_prompt_chat_sends(smollm2_tokenizer: Any) -> None:
    engine = FakeEngine(script="ok", max_model_len=8192)
    engine.tokenizer = smollm2_tokenizer
    engine.vocab_size = 49152
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0))
    counts: dict[str, int] = {}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            for label, fields in {
                "no tools": {},
                "tools": {"tools": TOOLS},
                "none": {"tools": TOOLS, "tool_choice": "none"},
                "required": {"tools": TOOLS, "tool_choice": "required"},
            }.items():
                chat = await client.post(
                    "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **fields}
                )
                assert chat.status_code == 200, chat.text
                sent = engine.requests[-1].prompt_token_ids
                tokenized = await client.post("/tokenize", json={"messages": MESSAGES, **fields})
                assert tokenized.status_code == 200, tokenized.text
                body = tokenized.json()
                assert body["tokens"] == sent, label
                assert body["count"] == len(sent), label
                counts[label] = body["count"]
    finally:
        app.state.responses.store.close()
    # the tool list is in the prompt unless tool_choice is "none", which renders as if no tools were sent
    assert counts["tools"] == counts["required"] > counts["no tools"]
    assert counts["none"] == counts["no tools"]
    text = smollm2_tokenizer.decode(engine.requests[1].prompt_token_ids)
    assert '"name": "get_weather"' in text and "<tool_call>" in text


async def test_tokenize_refuses_tool_choice_without_tools(client: httpx.AsyncClient) -> None:
    r = await client.post("/tokenize", json={"messages": MESSAGES, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
