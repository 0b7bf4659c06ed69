"""Issue 7 soak, end to end on loopback: 160 requests mixing chat (whole and streamed),
json_schema, tools (required and auto), two LoRA adapters contending for one slot, /v1/responses
(whole and streamed) and /v1/completions, 32 at a time, with 30% of the clients leaving at a random
point (a stream closed after k events, or a request cancelled after a random delay).

Afterwards nothing is leaked: no request runs or waits, every KV block is free, at most
--max-loras adapters are resident and the slot is free to change hands (both adapters still run,
one after the other), a grammar still compiles and constrains, /health is 200, and greedy requests
(base model and an adapter) answer exactly as they did on the fresh server before the soak.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL, start_server, stop_server

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)

SEED = 20240607
# 16 requests of each of the 10 kinds, 48 of them leaving: five waves of 32 at a time, so every kind,
# both adapters and the disconnects overlap throughout. (300 requests took 157-290 s on the 2-core
# dev machine; the suite's time limit wants fewer, and 160 still mix everything.)
NUM_REQUESTS = 160
CONCURRENCY = 32
DISCONNECT_FRACTION = 0.3
REQUEST_TIMEOUT_S = 180.0
SOAK_TIMEOUT_S = 420.0
MAX_LORAS = 1
MAX_TOKENS = 24         # most a request asks for (at least 8)
TOOL_MAX_TOKENS = 40    # a whole hermes call to get_weather takes about 30 tokens
# served name: the acceptance cases' adapter (session fixture `case_adapters`, tests/e2e/cases_lora.py)
ADAPTERS = {"soak-a": "adapter-a", "soak-b": "adapter-b"}
MODELS = [MODEL, MODEL, "soak-a", "soak-b"]

GREEDY = {"messages": [{"role": "user", "content": "Write one sentence about the sea."}], "max_tokens": 24,
          "temperature": 0}
PROMPTS = [GREEDY["messages"][0]["content"], "What is the capital of France?", "List three fruits.",
           "Tell me a short joke.", "Explain rain to a child.", "Give me a name for a cat.",
           "Continue: once upon a time", "What is 2 + 2?"]
DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["n"], "additionalProperties": False}
COLOUR = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The current time.",
                                           "parameters": {"type": "object", "properties": {}}}}]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
KINDS = ["chat", "chat_stream", "json", "json_stream", "tools_required", "tools_auto_stream", "responses",
         "responses_stream", "completions", "completions_stream"]
FINISHED = ("stop", "length", "tool_calls")


@dataclass(frozen=True)
class Job:
    """One soak request: what to send and, for a leaving client, when to leave.

    `leave_after_events`: close a stream after this many SSE data events (0: right after the
    headers); `leave_after_s`: cancel the whole exchange after this many seconds.
    """

    index: int
    kind: str
    path: str
    body: dict[str, Any]
    schema: dict[str, Any] | None = None
    leave_after_events: int | None = None
    leave_after_s: float | None = None

    @property
    def request_id(self) -> str:
        return f"soak-{self.index}"

    @property
    def leaves(self) -> bool:
        return self.leave_after_events is not None or self.leave_after_s is not None


@dataclass
class Outcome:
    """What the client saw: `left` when it actually disconnected before the answer was complete."""

    job: Job
    status: int | None = None
    left: bool = False
    problem: str | None = None
    finish_reason: str | None = None


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    health_bad: list[int] = field(default_factory=list)


# --- adapters and server --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def soak_server(tmp_path_factory, case_adapters):
    """Two adapters for SmolLM2's shapes (peft, random A and B at scale 0.1: the adapted model still
    writes text, yet answers differently): rank 8 on q/v/o, rank 16 rsLoRA on six modules."""
    tmp = tmp_path_factory.mktemp("soak")
    modules = [f"{name}={case_adapters[case_name]}" for name, case_name in ADAPTERS.items()]
    srv = start_server(tmp, "--enable-lora", "--lora-modules", *modules, "--max-loras", str(MAX_LORAS),
                       "--max-lora-rank", "16", "--allow-runtime-lora",
                       "--responses-db", str(tmp / "responses.db"),
                       "--quantization", "none")   # the float32 path: greedy answers do not depend on the batch
    yield srv
    stop_server(srv)


# --- the mix ----------------------------------------------------------------------------------------------

def make_jobs(rng: random.Random) -> list[Job]:
    """NUM_REQUESTS jobs, kinds round-robin over KINDS (shuffled), DISCONNECT_FRACTION of them leaving."""
    kinds = [KINDS[i % len(KINDS)] for i in range(NUM_REQUESTS)]
    rng.shuffle(kinds)
    leaving = set(rng.sample(range(NUM_REQUESTS), round(NUM_REQUESTS * DISCONNECT_FRACTION)))
    jobs = []
    for index, kind in enumerate(kinds):
        path, body, schema = make_body(rng, index, kind)
        leave: dict[str, Any] = {}
        if index in leaving:
            if body.get("stream") and rng.random() < 0.7:
                leave["leave_after_events"] = rng.randint(0, 6)
            else:
                leave["leave_after_s"] = rng.uniform(0.02, 4.0)
        jobs.append(Job(index, kind, path, body, schema, **leave))
    return jobs


def make_body(rng: random.Random, index: int, kind: str) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """(path, JSON body, schema the answer must satisfy when it stops) of one job."""
    model, prompt = rng.choice(MODELS), rng.choice(PROMPTS)
    stream = kind.endswith("_stream")
    sampling = {"model": model, "temperature": rng.choice([0, 0.7, 1.0]), "seed": index}
    if kind.startswith("completions"):
        return "/v1/completions", {**sampling, "prompt": prompt, "max_tokens": rng.randint(8, MAX_TOKENS),
                                   "stream": stream}, None
    if kind.startswith("responses"):
        body = {**sampling, "input": prompt, "max_output_tokens": rng.randint(8, MAX_TOKENS),
                "stream": stream, "store": rng.random() < 0.5}
        return "/v1/responses", body, None
    body = {**sampling, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": rng.randint(8, MAX_TOKENS), "stream": stream}
    if kind.startswith("json"):
        schema = rng.choice([DIGIT, COLOUR, fresh_schema(index)])
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        return "/v1/chat/completions", body, schema
    if kind.startswith("tools"):
        body.update(tools=TOOLS, tool_choice="required" if kind == "tools_required" else "auto",
                    max_tokens=TOOL_MAX_TOKENS)
    return "/v1/chat/completions", body, None


def fresh_schema(index: int) -> dict[str, Any]:
    """A schema no other request uses: a compile that misses the cache (and may be abandoned)."""
    key = f"k{index}"
    return {"type": "object", "properties": {key: {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": [key], "additionalProperties": False}


# --- checking one answer ----------------------------------------------------------------------------------

def check_answer(outcome: Outcome, whole: dict[str, Any] | None, events: list[dict[str, Any]]) -> None:
    """Set `outcome.problem` unless the answer (a JSON body, or the streamed events) is a valid,
    finished one; `outcome.validated` names what was checked against a schema."""
    job = outcome.job
    if job.path == "/v1/responses":
        outcome.problem = check_response(whole if whole is not None else streamed_response(events))
        return
    choice = whole["choices"][0] if whole is not None else merge_chunks(events)
    if whole is not None and whole.get("model") != job.body["model"]:
        outcome.problem = f"model {whole.get('model')!r}"
        return
    outcome.finish_reason = choice.get("finish_reason")
    if outcome.finish_reason not in FINISHED:
        outcome.problem = f"finish_reason {outcome.finish_reason!r}"
    elif job.path == "/v1/completions":
        outcome.problem = None if isinstance(choice.get("text"), str) else "no text"
    else:
        outcome.problem = check_message(job, choice.get("message") or {}, outcome.finish_reason)


def check_message(job: Job, message: dict[str, Any], finish: str) -> str | None:
    """None when a chat message is valid: JSON that satisfies the schema when it stopped, tool
    calls whose arguments satisfy their tool's parameters."""
    content, calls = message.get("content"), message.get("tool_calls") or []
    if job.schema is not None and finish == "stop":
        try:
            jsonschema.validate(json.loads(content), job.schema)
        except (ValueError, TypeError, jsonschema.ValidationError) as error:
            return f"json_schema output {content!r}: {error}"
    if job.kind == "tools_required" and finish == "stop":
        return "tool_choice required stopped without a call"
    if finish == "tool_calls" and not calls:
        return "finish_reason tool_calls without calls"
    for call in calls if finish == "tool_calls" else []:
        function = call["function"]
        try:
            jsonschema.validate(json.loads(function["arguments"]), TOOL_SCHEMAS[function["name"]])
        except (ValueError, KeyError, jsonschema.ValidationError) as error:
            return f"tool call {function}: {error!r}"
    return None


def merge_chunks(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One choice from chat/completion chunks: text/content joined, tool call deltas merged."""
    text, content, calls, finish = "", "", {}, None
    for event in events:
        for choice in event.get("choices", []):
            text += choice.get("text") or ""
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for d in delta.get("tool_calls") or []:
                call = calls.setdefault(d["index"], {"function": {"name": "", "arguments": ""}})
                fn = d.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message = {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}
    return {"text": text, "message": message, "finish_reason": finish}


def streamed_response(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The final response object of a Responses stream (or {} when it never came)."""
    last = events[-1] if events else {}
    if last.get("type") not in ("response.completed", "response.incomplete"):
        return {"status": f"stream ended with {last.get('type')!r}"}
    return last["response"]


def check_response(response: dict[str, Any]) -> str | None:
    status = response.get("status")
    if status not in ("completed", "incomplete"):
        return f"response status {status!r}"
    texts = [part.get("text") for item in response.get("output", []) if item.get("type") == "message"
             for part in item.get("content", [])]
    return None if texts and all(isinstance(t, str) for t in texts) else f"no output text: {response}"


# --- driving the soak -------------------------------------------------------------------------------------

async def run_job(url: str, job: Job) -> Outcome:
    """Send one job on its own connection (so leaving really closes the socket) and check it."""
    outcome = Outcome(job)
    headers = {"x-request-id": job.request_id}
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        exchange = exchange_stream(client, job, headers, outcome) if job.body.get("stream") else \
            exchange_whole(client, job, headers, outcome)
        try:
            if job.leave_after_s is not None:
                await asyncio.wait_for(exchange, job.leave_after_s)
            else:
                await exchange
        except asyncio.TimeoutError:
            outcome.left = True
        except httpx.HTTPError as error:
            outcome.problem = f"{type(error).__name__}: {error}"
    return outcome


async def exchange_whole(client: httpx.AsyncClient, job: Job, headers: dict[str, str],
                         outcome: Outcome) -> None:
    response = await client.post(job.path, json=job.body, headers=headers)
    outcome.status = response.status_code
    if response.status_code != 200:
        outcome.problem = f"HTTP {response.status_code}: {response.text[:300]}"
        return
    check_answer(outcome, response.json(), [])


async def exchange_stream(client: httpx.AsyncClient, job: Job, headers: dict[str, str],
                          outcome: Outcome) -> None:
    async with client.stream("POST", job.path, json=job.body, headers=headers) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            outcome.problem = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            return
        events: list[dict[str, Any]] = []
        done = False
        async for line in response.aiter_lines():
            if job.leave_after_events is not None and len(events) >= job.leave_after_events:
                outcome.left = True
                return                       # leaving the `async with` closes the connection
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event or event.get("type") == "error":
                outcome.problem = f"error event {event['error']}"
                return
            events.append(event)
    if job.path != "/v1/responses" and not done:
        outcome.problem = "stream ended without data: [DONE]"
        return
    check_answer(outcome, None, events)


async def watch_health(url: str, tally: Tally, stop: asyncio.Event) -> None:
    """Poll /health every 0.25 s while the soak runs, recording latency and any non-200."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while not stop.is_set():
            start = time.monotonic()
            response = await client.get("/health")
            tally.health_ms.append((time.monotonic() - start) * 1000)
            if response.status_code != 200:
                tally.health_bad.append(response.status_code)
            await asyncio.sleep(0.25)


async def soak(url: str, jobs: list[Job]) -> Tally:
    tally = Tally()
    limit = asyncio.Semaphore(CONCURRENCY)
    stop = asyncio.Event()

    async def bounded(job: Job) -> Outcome:
        async with limit:
            return await run_job(url, job)

    health = asyncio.create_task(watch_health(url, tally, stop))
    try:
        tally.outcomes = await asyncio.wait_for(asyncio.gather(*(bounded(j) for j in jobs)), SOAK_TIMEOUT_S)
    finally:
        stop.set()
        await health
    return tally


# --- after the soak ---------------------------------------------------------------------------------------

def scrape(url: str) -> dict[str, float]:
    """/metrics samples by name (histogram buckets dropped)."""
    response = httpx.get(url + "/metrics", timeout=30)
    assert response.status_code == 200
    return {s.name: s.value for family in text_string_to_metric_families(response.text)
            for s in family.samples if "le" not in s.labels and len(s.labels) == 1}


def wait_drained(url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The /metrics samples once nothing runs, waits or holds a KV block (or the last seen)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        busy = [samples["structserve:" + name] for name in
                ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")]
        if not any(busy) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def greedy(url: str, model: str) -> str:
    response = httpx.post(url + "/v1/chat/completions", json={**GREEDY, "model": model}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def request_log_lines(log: str) -> dict[str, dict[str, str]]:
    """request_id -> fields of its `request done` line, for the soak's requests."""
    lines = {}
    for line in log.splitlines():
        match = re.search(r"request done (request_id=(soak-\d+) .*)", line)
        if match:
            lines[match.group(2)] = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', match.group(1)))
    return lines


def wait_log_lines(server, num: int, timeout_s: float = 10.0) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + timeout_s
    while True:
        lines = request_log_lines(server.log())
        if len(lines) >= num or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def test_soak_leaves_nothing_behind(soak_server) -> None:
    url = soak_server.url
    fresh = {model: greedy(url, model) for model in (MODEL, "soak-a")}
    assert fresh[MODEL] != fresh["soak-a"]
    started = time.monotonic()
    httpx_logger = logging.getLogger("httpx")
    level = httpx_logger.level
    httpx_logger.setLevel(logging.WARNING)        # one INFO line per request and /health poll otherwise
    try:
        tally = asyncio.run(soak(url, make_jobs(random.Random(SEED))))
    finally:
        httpx_logger.setLevel(level)
    soak_s = time.monotonic() - started
    num_json_checked, num_calls_checked = check_answers(tally)
    check_nothing_held(url)
    check_request_log(soak_server, tally.outcomes)
    check_still_serving(url, fresh)
    health = sorted(tally.health_ms)
    p99 = health[min(len(health) - 1, int(0.99 * len(health)))]
    logger.info("soak: %d requests in %.1f s, %d clients left, %d json_schema outputs and %d tool-call "
                "answers validated, /health p99 %.0f ms over %d polls", NUM_REQUESTS, soak_s,
                sum(o.left for o in tally.outcomes), num_json_checked, num_calls_checked, p99, len(health))


def check_answers(tally: Tally) -> tuple[int, int]:
    """Every client that stayed got a 200 and a valid answer; enough clients left; /health never
    failed. Returns (json_schema outputs validated, tool-call answers validated)."""
    outcomes = tally.outcomes
    problems = [f"{o.job.request_id} {o.job.kind} {o.job.body['model']}: {o.problem}"
                for o in outcomes if o.problem is not None]
    assert not problems, f"{len(problems)} bad answers:\n" + "\n".join(problems[:20])
    assert all(o.status == 200 for o in outcomes if not o.left)
    num_left = sum(o.left for o in outcomes)
    assert num_left >= 0.2 * NUM_REQUESTS, f"only {num_left} clients actually left"
    finished = [(o.job.kind, o.finish_reason) for o in outcomes if not o.left]
    num_json_checked = sum(kind.startswith("json") and reason == "stop" for kind, reason in finished)
    num_calls_checked = sum(kind.startswith("tools") and reason == "tool_calls" for kind, reason in finished)
    assert num_json_checked >= 5 and num_calls_checked >= 5, (num_json_checked, num_calls_checked)
    assert not tally.health_bad, f"/health answered {tally.health_bad} during the soak"
    return num_json_checked, num_calls_checked


def check_nothing_held(url: str) -> None:
    """/metrics: nothing runs or waits, no KV block is held, at most MAX_LORAS adapters resident."""
    samples = wait_drained(url)
    names = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "lora_adapters_resident")
    state = {name: samples["structserve:" + name] for name in names}
    assert state["num_requests_running"] == 0 and state["num_requests_waiting"] == 0, state
    assert state["kv_cache_usage_perc"] == 0, state
    assert 1 <= state["lora_adapters_resident"] <= MAX_LORAS, state


def check_request_log(server, outcomes: list[Outcome]) -> None:
    """Every request the server answered logged its end (a client that left before its headers
    came back may have left before the server read the request at all): no 5xx, `ok` for every
    client that stayed, and no traceback anywhere in the log."""
    answered = [o for o in outcomes if o.status is not None]
    lines = wait_log_lines(server, len(answered))
    unlogged = [o.job.request_id for o in answered if o.job.request_id not in lines]
    assert not unlogged, f"requests that never logged their end: {unlogged}"
    server_errors = {rid: f for rid, f in lines.items() if f["status"].startswith("5")}
    assert not server_errors, server_errors
    for outcome in outcomes:
        if not outcome.left:
            fields = lines[outcome.job.request_id]
            assert (fields["status"], fields["outcome"]) == ("200", "ok"), fields
    log = server.log()
    assert "Traceback" not in log, log[max(0, log.index("Traceback") - 2000):][:6000]


def check_still_serving(url: str, fresh: dict[str, str]) -> None:
    """/health is 200; the single slot still changes hands (no leaked slot reference) and the
    weights it held are intact: greedy text as on the fresh server, though the soak filled the
    prefix cache; a grammar still constrains; each adapter sequence was unpinned (an unload
    answers only once no sequence uses the adapter)."""
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    after = {model: greedy(url, model) for model in ("soak-b", "soak-a", MODEL)}
    assert after["soak-a"] == fresh["soak-a"] and after[MODEL] == fresh[MODEL]
    response_format = {"type": "json_schema", "json_schema": {"name": "d", "schema": DIGIT}}
    digit = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "A digit as JSON."}], "max_tokens": 24,
        "temperature": 0, "response_format": response_format})
    assert digit.status_code == 200
    jsonschema.validate(json.loads(digit.json()["choices"][0]["message"]["content"]), DIGIT)
    unload = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "soak-b"}, timeout=10)
    assert unload.status_code == 200, unload.text
