"""Issue 4 end to end: grammar-guaranteed tool calls on SmolLM2 via the `openai` client and agent SDKs."""

from __future__ import annotations

import concurrent.futures
import json
import os

import jsonschema
import pytest

from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
CONVERT = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount between currencies.", "strict": True,
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
        "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 10}},
        "required": ["amount", "from", "to", "days"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "get_time", "description": "The current time."}}
TOOLS = [WEATHER, CONVERT, NOW]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Hanoi", "Accra", "Bern"]
TEMPLATES = ["What's the weather like in {c}?", "Should I take an umbrella in {c} today?",
             "Convert 120 dollars to euros for my trip to {c}.", "How hot is it in {c} in fahrenheit?",
             "I am flying to {c}; what time is it and how is the weather?"]
PROMPTS = [t.format(c=c) for c in CITIES for t in TEMPLATES]   # 50 varied prompts
MAX_TOKENS = 96


def collect_stream(chunks) -> tuple[str, list[dict], str | None]:
    """Content, calls and finish_reason of a stream; a last call whose arguments are not JSON in an
    output that used all its tokens (usage, when sent) is marked "cut": max_tokens cut it after its
    header and first fragments streamed (the whole answer leaves such a call out)."""
    content, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] = d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
            finish = choice.finish_reason or finish
    ordered = [calls[i] for i in sorted(calls)]
    if ordered and usage is not None and usage.completion_tokens >= MAX_TOKENS:
        try:
            json.loads(ordered[-1]["arguments"])
        except ValueError:
            ordered[-1]["cut"] = True
    return content, ordered, finish


def valid_call(name: str, arguments: str) -> bool:
    try:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    except (ValueError, jsonschema.ValidationError, KeyError):
        return False
    return True


def run_choice(client, prompt: str, tool_choice, stream: bool):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                  tool_choice=tool_choice, temperature=0.7, max_tokens=MAX_TOKENS)
    if stream:
        return collect_stream(client.chat.completions.create(**kwargs, stream=True,
                                                             stream_options={"include_usage": True}))
    out = client.chat.completions.create(**kwargs)
    msg = out.choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in msg.tool_calls or []]
    return msg.content, calls, out.choices[0].finish_reason


def test_required_and_named_calls_always_validate(server):
    client = server.client()
    named = {"type": "function", "function": {"name": "convert_currency"}}
    # 5 cities x the 5 templates: each template gets required and named, streamed and whole (the
    # parity of i = 5 * city + template flips with the city); was all 50 prompts, 100 jobs
    prompts = PROMPTS[:5 * len(TEMPLATES)]
    jobs = [(p, "required", i % 2 == 0) for i, p in enumerate(prompts)]
    jobs += [(p, named, i % 2 == 1) for i, p in enumerate(prompts)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda j: (j, run_choice(client, *j)), jobs))
    bad = []
    for (prompt, choice, stream), (content, calls, finish) in results:
        whole_calls = [c for c in calls if not c.get("cut")]
        ok = bool(whole_calls) and finish == "tool_calls"
        ok = ok and all(valid_call(c["name"], c["arguments"]) for c in whole_calls)
        ok = ok and all(c["id"] and c["id"].startswith("call_") for c in calls)
        if choice != "required":
            ok = ok and all(c["name"] == "convert_currency" for c in calls)
        if not ok:
            bad.append((prompt, choice, stream, content, calls, finish))
    assert not bad, f"{len(bad)}/{len(jobs)} invalid: {bad[:3]}"


def test_auto_never_returns_an_invalid_call(server):
    client = server.client()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:     # all 16 at once: one batch
        results = list(pool.map(lambda p: run_choice(client, p, "auto", True), PROMPTS[:16]))
    for content, calls, finish in results:
        assert "<tool_call>" not in (content or "")
        for call in calls:
            assert call.get("cut") or valid_call(call["name"], call["arguments"]), call
        # issue 14's rule: "tool_calls" when the calls are complete, "length" when max_tokens cut the last
        if calls:
            assert finish == ("length" if calls[-1].get("cut") else "tool_calls"), (calls, finish)


def test_parallel_tool_calls_false_gives_one_call(server):
    client = server.client()
    out = client.chat.completions.create(model=MODEL, tools=TOOLS, tool_choice="required", temperature=0.7,
                                         parallel_tool_calls=False, max_tokens=150,
                                         messages=[{"role": "user", "content": "Weather in Paris and Rome?"}])
    assert len(out.choices[0].message.tool_calls) == 1


def test_multi_turn_tool_loop_completes(server):
    client = server.client()
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=100)
    call = first.choices[0].message.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "clear"})})
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=60)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason in ("stop", "length")


def test_call_about_to_be_cut_by_max_tokens_is_closed_valid(server):
    """Greedy SmolLM2 loops inside this query string until max_tokens; the server closes the call
    instead (--close-tool-calls, on by default): whole and streamed, a call that validates, within
    max_tokens, counted by grammar_closed_outputs."""
    import httpx

    def closed_total() -> float:
        text = httpx.get(server.url + "/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("structserve:grammar_closed_outputs_total"))
        return float(line.rsplit(" ", 1)[1])

    search = {"type": "function", "function": {"name": "search_web", "description": "Search the web.",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                             "required": ["query"], "additionalProperties": False}}}
    client = server.client()
    before = closed_total()
    body = dict(model=MODEL, tools=[search], tool_choice="required", temperature=0, max_tokens=40,
                messages=[{"role": "user", "content": "Look up who won the 2018 football world cup."}])
    whole = client.chat.completions.create(**body)
    (call,) = whole.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), search["function"]["parameters"])
    assert whole.choices[0].finish_reason == "tool_calls" and whole.usage.completion_tokens <= 40
    _, calls, finish = collect_stream(client.chat.completions.create(**body, stream=True))
    assert [(c["name"], c["arguments"]) for c in calls] == [("search_web", call.function.arguments)]
    assert finish == "tool_calls"
    assert closed_total() - before == 2


def test_named_unknown_tool_is_400(server):
    import openai

    client = server.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, tools=TOOLS, max_tokens=10,
                                       messages=[{"role": "user", "content": "hi"}],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"].startswith("tool_choice")


def test_openai_agents_sdk_tool_loop(server):
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"Sunny and 21C in {city}."

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(
        base_url=server.url + "/v1", api_key="x", max_retries=0))
    agent = Agent(name="weather", instructions="Answer with the tool.", model=model, tools=[get_weather],
                  model_settings=ModelSettings(tool_choice="required", max_tokens=80, temperature=0),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "What is the weather in Paris?")
    assert calls and "Sunny" in str(result.final_output)


def test_langchain_bind_tools_and_structured_output(server):
    os.environ["LANGSMITH_TRACING"] = "false"
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return "sunny"

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="x", model=MODEL, temperature=0, max_tokens=80,
                     max_retries=0)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Oslo?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"]["city"], str)

    class Person(BaseModel):
        name: str
        age: int

    person = llm.with_structured_output(Person).invoke("Invent a person.")
    assert isinstance(person, Person)
    by_tool = llm.with_structured_output(Person, method="function_calling").invoke("Invent a person.")
    assert isinstance(by_tool, Person)


def _forced_weather(client, stream: bool, **fields):
    """(content, calls, finish_reason) of a required get_weather call, greedy (issue 14's faults)."""
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
                  tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, temperature=0, **fields)
    if stream:
        content, calls, finish = collect_stream(client.chat.completions.create(**kwargs, stream=True))
        return content or "", [(c["name"], c["arguments"]) for c in calls], finish
    choice = client.chat.completions.create(**kwargs).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content or "", calls, choice.finish_reason


def test_stop_strings_inside_a_forced_call_are_not_matched(server):
    """Issue 14's fault: a stop string inside a forced call returned finish_reason "stop" and the
    call markup as content. Stops are not matched inside a constrained call, so the answer is the
    same whole call as without them (whole and streamed)."""
    client = server.client()
    plain = _forced_weather(client, False, max_tokens=60)
    (name, arguments), = plain[1]
    assert plain[0] == "" and plain[2] == "tool_calls" and valid_call(name, arguments)
    stops = {"stop": ["Paris", '"city"', "name"]}
    assert _forced_weather(client, False, max_tokens=60, **stops) == plain
    assert _forced_weather(client, True, max_tokens=60, **stops) == plain


def test_max_tokens_inside_a_forced_call_is_length_without_markup(server):
    """A budget too small for the call (the closing cannot fit): finish_reason "length", no call and
    no markup as content, whole and streamed; Responses says "incomplete", Anthropic "max_tokens"."""
    import anthropic

    client = server.client()
    cut = _forced_weather(client, False, max_tokens=4)
    assert cut == ("", [], "length") and _forced_weather(client, True, max_tokens=4) == cut
    response = client.responses.create(model=MODEL, input="What's the weather like in Paris?", tools=[
        {"type": "function", **WEATHER["function"]}], tool_choice="required", temperature=0, max_output_tokens=4)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert not any(item.type == "function_call" for item in response.output) and not response.output_text
    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=600) as messages:
        message = messages.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
            tools=[{"name": "get_weather", "description": "Current weather for a city.",
                    "input_schema": WEATHER["function"]["parameters"]}], tool_choice={"type": "any"})
    assert message.stop_reason == "max_tokens" and message.content == []
