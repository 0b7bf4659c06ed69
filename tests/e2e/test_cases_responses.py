"""Acceptance cases 020 and 022 (../shared/cases) on /v1/responses, end to end on the real server.

020: every output item of a streamed response gets its whole event lifecycle, in order, also an
item that ends with no delta; the terminal response equals the done items and the unstreamed
answer. Read byte-exactly with httpx (`cases_responses.py` checks framing, lifecycle and the SDK's
event types) and through the SDK's own `responses.stream` helper, which refuses events that do
not add up. Its requests go to the server in the shared session fixture `batch`
(tests/e2e/conftest.py; `batch_jobs` lists them).
022: input items the server does not serve, or malformed ones, are 400s naming them (never a 500
or a bare key name) and reach no engine; the served item shapes are 200s.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from tests.e2e.cases_responses import lifecycle_problems, post_typed_sse, sdk_problems, without_ids
from tests.e2e.cases_support import (
    Jobs,
    case_body,
    counters,
    error_problems,
    parallel,
    post,
    responses_url,
    validator,
    wait_idle,
)

pytestmark = pytest.mark.slow

GET_TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {},
                                                                   "additionalProperties": False}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TEXT = {"model": "default", "input": "Name three colours of the rainbow.", "max_output_tokens": 24, "temperature": 0}


def _variants_020() -> dict[str, dict[str, Any]]:
    """The case's request (temperature 0, unstreamed form) and its neighbours, by name."""
    case = {k: v for k, v in case_body("020", temperature=0).items() if k != "stream"}
    weather = case["tools"][0]
    return {
        "case": case,
        "text": TEXT,
        "named": {**case, "tools": [weather, GET_TIME], "input": "What time is it?",
                  "tool_choice": {"type": "function", "name": "get_time"}},
        "parallel": {**case, "parallel_tool_calls": True,
                     "input": "What is the weather in Paris and in Rome? Call the tool once for each city."},
        "auto": {**case, "tool_choice": "auto", "input": "Say that you will check, then call get_weather for Paris."},
        "cut": {**case, "max_output_tokens": 6},
        "json": {**TEXT, "input": "Describe a person as JSON.", "max_output_tokens": 40,
                 "text": {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}},
    }


def _no_delta_job(url: str) -> tuple[Any, Any, str]:
    """A response whose only item gets no delta: stop at the first character of the answer."""
    first = post(url, TEXT).json()["output"][0]["content"][0]["text"]
    body = {**TEXT, "stop": [first[:1]]}
    return post_typed_sse(url, body), post(url, body), first


# started first in the shared batch (the longest Responses outputs): cases_support.collected_batch_jobs
LONG_JOBS = ("020/auto/whole", "020/auto/stream")


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    url = responses_url(server)
    client = server.client(timeout=600)
    jobs: Jobs = {}
    for name, body in _variants_020().items():
        jobs[f"020/{name}/stream"] = lambda b=body: post_typed_sse(url, b)
        jobs[f"020/{name}/whole"] = lambda b=body: post(url, b)

    def sdk_helper():
        with client.responses.stream(**_variants_020()["case"]) as stream:
            types = [event.type for event in stream]
            return types, stream.get_final_response()

    jobs["020/sdk"] = sdk_helper
    jobs["020/no_delta"] = lambda: _no_delta_job(url)
    return jobs


def check_stream_and_whole(stream, whole) -> dict[str, Any]:
    """Framing, lifecycle and SDK shapes of the stream; the terminal response equals the whole
    answer (item ids aside). Returns the terminal response."""
    assert stream.status == 200 and stream.content_type.startswith("text/event-stream"), stream.text[:300]
    assert not stream.problems, stream.problems
    assert not lifecycle_problems(stream.events), lifecycle_problems(stream.events)
    assert not sdk_problems(stream.events), sdk_problems(stream.events)
    response = stream.events[-1]["response"]
    assert whole.status_code == 200, whole.text
    assert (response["status"], without_ids(response["output"])) == \
        (whole.json()["status"], without_ids(whole.json()["output"]))
    return response


def test_case020_forced_call_stream_has_complete_item_lifecycle(batch):
    tool = case_body("020")["tools"][0]
    response = check_stream_and_whole(batch["020/case/stream"], batch["020/case/whole"])
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert calls and response["status"] == "completed", response["output"]
    for call in calls:
        assert call["name"] == "get_weather" and call["call_id"] and call["status"] == "completed", call
        validator(tool["parameters"]).validate(json.loads(call["arguments"]))
    types, final = batch["020/sdk"]      # the SDK's helper accumulated every event without complaint
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert without_ids([item.model_dump(exclude_none=True) for item in final.output]) == \
        without_ids(response["output"])


def test_case020_neighbours_every_output_shape(batch):
    """Text, a named call of a tool without parameters, parallel calls, text then a call (auto),
    a call cut by max_output_tokens, and json_schema text: each item's lifecycle is complete and
    the stream equals the whole answer."""
    failures = {}
    responses = {}
    for name in ("text", "named", "parallel", "auto", "cut", "json"):
        try:
            responses[name] = check_stream_and_whole(batch[f"020/{name}/stream"], batch[f"020/{name}/whole"])
        except AssertionError as exc:
            failures[name] = str(exc)[:600]
    assert not failures, failures
    assert [item["type"] for item in responses["text"]["output"]] == ["message"]
    named = responses["named"]["output"]
    assert [(i["type"], i["name"], json.loads(i["arguments"])) for i in named] == [("function_call", "get_time", {})]
    cut = responses["cut"]
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}, cut
    assert batch["020/cut/stream"].events[-1]["type"] == "response.incomplete"
    assert cut["output"][-1]["status"] == "incomplete", cut["output"]
    if responses["json"]["status"] == "completed":
        validator(PERSON).validate(json.loads(responses["json"]["output"][0]["content"][0]["text"]))


def test_case020_neighbours_item_without_deltas(batch):
    """An answer stopped before its first character still has one message item, with added,
    content_part, text done (empty) and done events, like the unstreamed answer."""
    stream, whole, first = batch["020/no_delta"]
    assert first, "the unconstrained answer was empty"
    response = check_stream_and_whole(stream, whole)
    types = [e["type"] for e in stream.events]
    assert "response.output_text.delta" not in types, types
    assert [(i["type"], i["content"][0]["text"]) for i in response["output"]] == [("message", "")]


# --- 022 -------------------------------------------------------------------------------------------

_RAW = re.compile(r"""['"]?[\w.\[\]-]*['"]?""")
_PATH_PART = re.compile(r"\[(\d+)\]|\.?([A-Za-z_]\w*)")


def param_problems(param: str, body: dict[str, Any], message: str) -> list[str]:
    """`param` must be a path into the body sent (`input`, `input[0].content[1].type`): every part
    present in it, except a last part that the message reports missing."""
    parts = [(int(m[1]) if m[1] else m[2]) for m in _PATH_PART.finditer(param)]
    if "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") != param:
        return [f"param {param!r} is not a path"]
    current: Any = body
    for n, part in enumerate(parts):
        present = part in current if isinstance(part, str) and isinstance(current, dict) else \
            isinstance(part, int) and isinstance(current, list) and part < len(current)
        if not present:
            if n == len(parts) - 1 and message.startswith("Missing required parameter"):
                return []
            return [f"param {param!r} names {part!r}, which the request does not have"]
        current = current[part]
    return []


def _bad_inputs_022() -> list[tuple[Any, str | None]]:
    """(input, a word the error message must contain: the unsupported type or id it is about): the
    case's list, then its neighbours (other unsupported item and part types, malformed items)."""
    case = case_body("022")["input"]
    screenshot = {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"}
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    return [
        (case, "item_reference"),
        ([{"type": "computer_call_output", "call_id": "c1", "output": screenshot}], "computer_call_output"),
        ([{"type": "function_call_output", "output": "sunny"}], None),
        ([{"role": "wizard", "content": "Hi"}], None),
        (42, None),
        *[([{"type": kind, "id": "x_1"}, {"role": "user", "content": "Hi"}], kind)
          for kind in ("mcp_call", "reasoning", "web_search_call", "file_search_call", "image_generation_call",
                       "local_shell_call", "custom_tool_call_output", "mcp_approval_response")],
        ([{"role": "user", "content": [image]}], "input_image"),
        ([{"role": "user", "content": [{"type": "bogus", "text": "x"}]}], "bogus"),
        ([{"type": "function_call_output", "call_id": "call_nope", "output": "x"}], "call_nope"),
        ([{"role": "tool", "content": "x"}], None),
        ([{"type": "message", "role": "user"}], None),
        ([{"role": "user", "content": None}], None),
        ([{"role": "user", "content": {"type": "input_text", "text": "Hi"}}], None),
        ([{"role": "user", "content": [{"type": "input_text"}]}], None),
        ([{"type": "function_call", "call_id": "c1", "arguments": "{}"}], None),
        ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {"a": 1}}], None),
        ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
          {"type": "function_call_output", "call_id": "c1", "output": 5}], None),
        ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
          {"type": "function_call_output", "call_id": "c1", "output": {"temperature": 21}}], None),
        ([{"content": "no role, no type"}], None),
        ([{"type": None, "role": "user", "content": "Hi"}], None),
        (["a bare string"], None), ([None], None), ([["nested"]], None), ([], None),
        ({"role": "user", "content": "Hi"}, None),
    ]


def test_case022_unsupported_input_items_are_400(server):
    url = responses_url(server)
    bad = _bad_inputs_022()
    wait_idle(server.url)
    before = counters(server.url)
    answers = parallel(*[lambda i=i: post(url, {"model": "default", "input": i, "max_output_tokens": 4})
                         for i, _ in bad])
    answers.append(post(url, {**case_body("022"), "stream": True}))   # refused before any event
    failures = {}
    checks = [*bad, (case_body("022")["input"], "item_reference")]
    for n, ((value, word), answer) in enumerate(zip(checks, answers, strict=True)):
        problems = error_problems(answer, 400, "input", word)
        if not problems:
            error = answer.json()["error"]
            problems += param_problems(error["param"], {"input": value}, error["message"])
            if _RAW.fullmatch(error["message"]):
                problems.append(f"the message is a bare key or value: {error['message']!r}")
        if problems:
            failures[f"{n}: {json.dumps(value)[:120]}"] = problems
    assert not failures, failures
    with pytest.raises(openai.BadRequestError) as error:
        server.client(timeout=600).responses.create(**case_body("022"))
    assert error.value.body["param"].startswith("input") and "item_reference" in error.value.message
    wait_idle(server.url)
    after = counters(server.url)
    for key in ("prompt_tokens_total", "generation_tokens_total", "kv_cache_usage_perc"):
        assert after[key] == before[key], f"{key} moved for rejected requests: {before[key]} -> {after[key]}"


def test_case022_supported_inputs_are_200(server):
    """A string, role/content messages (string or text-part content, every role), a function_call
    with its function_call_output (string or text parts), and the output items of an earlier
    response sent back as they came (ids, status, annotations, logprobs)."""
    url = responses_url(server)
    base = {"model": "default", "max_output_tokens": 4, "temperature": 0}
    weather = case_body("020")["tools"][0]
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    earlier = post(url, {**base, "input": "Hi"})
    assert earlier.status_code == 200, earlier.text
    goods = [
        {"input": "Hi"},
        {"input": [{"role": "user", "content": "Hi"}]},
        {"input": [{"role": "system", "content": "Be brief."},
                   {"role": "developer", "content": [{"type": "input_text", "text": "Answer in English."}]},
                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                   {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}]},
        {"input": [{"role": "user", "content": "Weather in Paris?"}, call,
                   {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}], "tools": [weather]},
        {"input": [{"role": "user", "content": "Weather in Paris?"}, call,
                   {"type": "function_call_output", "call_id": "call_1",
                    "output": [{"type": "input_text", "text": "sunny"}]}], "tools": [weather]},
        {"input": [{"role": "user", "content": "Hi"}, *earlier.json()["output"],
                   {"role": "user", "content": "Again?"}]},
    ]
    answers = parallel(*[lambda g=g: post(url, {**base, **g}) for g in goods])
    bad = [(json.dumps(g)[:160], a.status_code, a.text[:200]) for g, a in zip(goods, answers) if a.status_code != 200]
    assert not bad, bad
    client = server.client(timeout=600)
    for good in goods:
        response = client.responses.create(**base, **good)
        assert response.status in ("completed", "incomplete") and response.output, response
