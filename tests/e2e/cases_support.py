"""Helpers for the acceptance-case e2e tests (tests/e2e/test_cases_*.py).

The cases live in `../shared/cases` beside the repository (one JSON file per public bug report);
these helpers load them, read SSE streams byte-exactly, reassemble streamed tool calls while
checking how they are addressed, check OpenAI error bodies, read /metrics, and run the
generation-heavy requests of every selected case file as one concurrent batch (`run_batch`).
JSON-text checks are in `cases_json.py`.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

def _cases_dir() -> Path:
    """`shared/cases` in the nearest folder above the repository that has one (the repository's
    parent for a checkout beside `shared/`, a further parent for a worktree one level deeper)."""
    root = Path(__file__).resolve().parents[2]
    for folder in root.parents:
        if (folder / "shared" / "cases").is_dir():
            return folder / "shared" / "cases"
    return root.parent / "shared" / "cases"


CASES_DIR = _cases_dir()

# One pooled client for every request of the tests: a fresh httpx client per call costs ~70 ms of
# CPU (TLS context set-up), which on a 2-core box slows the server being measured.
HTTP = httpx.Client(timeout=300.0, limits=httpx.Limits(max_connections=128, max_keepalive_connections=32))


# --- cases -------------------------------------------------------------------------------------

def load_case(number: str) -> dict[str, Any]:
    """The case file `NNN-*.json`; fails the test (not skips) when the folder or file is missing."""
    if not CASES_DIR.is_dir():
        pytest.fail(f"acceptance cases folder {CASES_DIR} is missing (expected ../shared/cases beside the repo)")
    matches = sorted(CASES_DIR.glob(f"{number}-*.json"))
    if len(matches) != 1:
        pytest.fail(f"expected exactly one case file {CASES_DIR}/{number}-*.json, found {matches}")
    return json.loads(matches[0].read_text())


def case_body(number: str, **overrides: Any) -> dict[str, Any]:
    """A deep copy of the case's request body with `overrides` applied (None values are kept)."""
    case = load_case(number)
    return {**copy.deepcopy(case["request"]["body"]), **overrides}


def case_steps(number: str) -> list[dict[str, Any]]:
    """The `steps` of a multi-request case."""
    return copy.deepcopy(load_case(number)["request"]["steps"])


# --- concurrency ------------------------------------------------------------------------------

def parallel(*jobs: Callable[[], Any]) -> list[Any]:
    """Run the callables on a thread pool; their results in order (the first exception is raised)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, len(jobs))) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [f.result() for f in futures]


# --- plain requests ----------------------------------------------------------------------------

def post(url: str, body: Any, timeout: float = 300.0, headers: dict[str, str] | None = None) -> httpx.Response:
    """POST `body` as JSON (or raw bytes/str when it is bytes/str)."""
    if isinstance(body, (bytes, str)):
        return HTTP.post(url, content=body, timeout=timeout,
                         headers={"content-type": "application/json", **(headers or {})})
    return HTTP.post(url, json=body, timeout=timeout, headers=headers)


def error_problems(resp: httpx.Response, status: int = 400, param_prefix: str | None = None,
                   message_contains: str | None = None) -> list[str]:
    """What is wrong with `resp` as an OpenAI error: status, JSON content type, and the body
    `{"error": {"message": str, "type": str, "param": str|None, "code": str|int|None}}`."""
    problems = []
    if resp.status_code != status:
        problems.append(f"status {resp.status_code}, expected {status}: {resp.text[:300]}")
    ctype = resp.headers.get("content-type", "")
    if not ctype.startswith("application/json"):
        problems.append(f"content-type {ctype!r}, expected application/json")
    try:
        body = resp.json()
    except ValueError:
        return [*problems, f"body is not JSON: {resp.text[:200]!r}"]
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return [*problems, f"body is not {{'error': {{...}}}}: {body!r}"]
    err = body["error"]
    missing = {"message", "type", "param", "code"} - set(err)
    if missing:
        problems.append(f"error object lacks {sorted(missing)}: {err}")
    if not isinstance(err.get("message"), str) or not err.get("message"):
        problems.append(f"error.message is not a non-empty string: {err}")
    if not isinstance(err.get("type"), str):
        problems.append(f"error.type is not a string: {err}")
    if status == 400 and err.get("type") != "invalid_request_error":
        problems.append(f"error.type {err.get('type')!r}, expected invalid_request_error")
    if err.get("param") is not None and not isinstance(err.get("param"), str):
        problems.append(f"error.param is neither a string nor null: {err}")
    code = err.get("code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, (str, int))):
        problems.append(f"error.code is not a string, integer or null: {err}")
    if param_prefix is not None and not str(err.get("param") or "").startswith(param_prefix):
        problems.append(f"error.param {err.get('param')!r} does not start with {param_prefix!r}")
    if message_contains is not None and message_contains not in str(err.get("message")):
        problems.append(f"error.message does not mention {message_contains!r}: {err.get('message')!r}")
    return problems


# --- SSE -------------------------------------------------------------------------------------------

@dataclass
class Sse:
    """One streamed response read to its end: status, content type, raw text, the `data:` payloads
    (strings, "[DONE]" included), the JSON objects before [DONE], and framing problems."""

    status: int
    content_type: str
    text: str
    data: list[str] = field(default_factory=list)
    chunks: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    request_id: str | None = None
    finished_at: float = 0.0      # time.monotonic() when the body had been read to its end

    def choice_chunks(self, index: int = 0) -> list[dict[str, Any]]:
        """The `choices[]` entries of choice `index`, in stream order."""
        return [c for chunk in self.chunks for c in chunk.get("choices") or [] if c.get("index") == index]

    def content(self, index: int = 0) -> str:
        """Concatenated delta.content of choice `index`."""
        return "".join((c.get("delta") or {}).get("content") or "" for c in self.choice_chunks(index))

    def finish_reasons(self, index: int = 0) -> list[str]:
        """The non-null finish_reasons of choice `index` in order."""
        return [c["finish_reason"] for c in self.choice_chunks(index) if c.get("finish_reason") is not None]


def parse_sse(text: str, done: bool = True) -> tuple[list[str], list[str]]:
    """(data payloads, framing problems) of an SSE body: every event one `data:` line followed by a
    blank line, `:` comment lines allowed, and (when `done`) `data: [DONE]` last with nothing after."""
    lines = re.split(r"\r\n|\r|\n", text)
    if lines and lines[-1] == "":
        lines.pop()  # the text ends with a line break
    data: list[str] = []
    problems: list[str] = []
    i = 0
    after_comment = False
    while i < len(lines):
        line = lines[i]
        if line.startswith(":"):
            after_comment = True
            i += 1
            continue
        if line == "":
            if not after_comment:
                problems.append(f"line {i}: blank line that ends no event")
            after_comment = False
            i += 1
            continue
        after_comment = False
        if not line.startswith("data:"):
            problems.append(f"line {i}: not a data line: {line[:80]!r}")
            i += 1
            continue
        payload = line[5:]
        data.append(payload.removeprefix(" "))
        if i + 1 >= len(lines) or lines[i + 1] != "":
            problems.append(f"line {i}: data line not followed by a blank line")
            i += 1
        else:
            i += 2
        if data[-1] == "[DONE]" and i < len(lines):
            problems.append(f"{len(lines) - i} line(s) after data: [DONE]: {lines[i:i + 3]!r}")
            break
    if done:
        if not data or data[-1] != "[DONE]":
            problems.append(f"the last event is not data: [DONE] (last: {data[-1][:80] if data else None!r})")
        if "[DONE]" in data[:-1]:
            problems.append("data: [DONE] before the last event")
    return data, problems


def post_sse(url: str, body: dict[str, Any], timeout: float = 300.0, headers: dict[str, str] | None = None,
             done: bool = True, started: threading.Event | None = None) -> Sse:
    """POST a streaming request with httpx and read the whole body; non-2xx answers come back with
    their text and no payloads. `started` is set once the first `data:` event has arrived (and at
    the latest when the request ends, however it ends, so that no waiter hangs)."""
    try:
        with HTTP.stream("POST", url, json=body, timeout=timeout, headers=headers) as r:
            parts = []
            for part in r.iter_bytes():
                parts.append(part)
                if started is not None and not started.is_set() and b"data:" in b"".join(parts):
                    started.set()
            raw = b"".join(parts).decode("utf-8")
            result = Sse(r.status_code, r.headers.get("content-type", ""), raw,
                         request_id=r.headers.get("x-request-id"), finished_at=time.monotonic())
    finally:
        if started is not None:
            started.set()
    if result.status != 200:
        return result
    result.data, result.problems = parse_sse(raw, done=done)
    for n, payload in enumerate(result.data):
        if payload == "[DONE]":
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            result.problems.append(f"event {n} is not JSON: {payload[:80]!r}")
            continue
        if not isinstance(obj, dict):
            result.problems.append(f"event {n} is not a JSON object: {payload[:80]!r}")
            continue
        if "error" in obj:
            result.problems.append(f"event {n} carries an error: {obj['error']}")
        result.chunks.append(obj)
    return result


# --- streamed tool calls ---------------------------------------------------------------------------

def reassemble_tool_calls(chunks: list[dict[str, Any]], choice: int = 0) -> list[dict[str, Any]]:
    """The tool calls of choice `choice` rebuilt by index, asserting the addressing contract:
    every delta has an integer `index` >= 0; calls are numbered 0..N-1 by first appearance; a call's
    first delta carries a non-empty `id` (unique), type "function" and a non-empty name; later
    deltas of the index add only `function.arguments` (no id, type or name)."""
    calls: list[dict[str, Any]] = []
    for n, chunk in enumerate(chunks):
        for entry in chunk.get("choices") or []:
            if entry.get("index") != choice:
                continue
            for d in (entry.get("delta") or {}).get("tool_calls") or []:
                where = f"chunk {n}, tool-call delta {d}"
                assert "index" in d and d["index"] is not None, f"{where}: `index` missing or null"
                index = d["index"]
                assert type(index) is int and index >= 0, f"{where}: `index` is not an integer >= 0"
                fn = d.get("function") or {}
                if index == len(calls):
                    assert isinstance(d.get("id"), str) and d["id"], f"{where}: first delta of a call has no id"
                    assert d.get("type") == "function", f"{where}: first delta of a call has no type function"
                    assert isinstance(fn.get("name"), str) and fn["name"], f"{where}: first delta has no name"
                    calls.append({"index": index, "id": d["id"], "name": fn["name"],
                                  "arguments": fn.get("arguments") or "", "deltas": 1})
                    continue
                assert index < len(calls), f"{where}: index skips ahead (calls so far: {len(calls)})"
                assert d.get("id") is None, f"{where}: a delta with an id reuses index {index} of an earlier call"
                assert d.get("type") is None, f"{where}: a later delta repeats `type`"
                assert fn.get("name") is None, f"{where}: a later delta repeats `function.name`"
                calls[index]["arguments"] += fn.get("arguments") or ""
                calls[index]["deltas"] += 1
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == len(ids), f"tool-call ids repeat within the response: {ids}"
    return calls


def parsed_arguments(arguments: str) -> Any:
    """json.loads of an arguments string, asserting it is one JSON object."""
    value = json.loads(arguments)
    assert isinstance(value, dict), f"arguments are not a JSON object: {arguments!r}"
    return value


# --- metrics and logs ------------------------------------------------------------------------------

def metrics(url: str) -> dict[str, float]:
    """Every `structserve:` sample of one /metrics scrape, by name (counters end in `_total`)."""
    text = HTTP.get(url + "/metrics", timeout=10).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^structserve:([a-z_]+)(?:{[^}]*})? ([0-9.e+-]+)$", text, re.MULTILINE)}


def metric(url: str, name: str) -> float:
    """The value of `structserve:<name>` (counters: `<name>_total`) on /metrics."""
    values = metrics(url)
    assert name in values, f"structserve:{name} missing from /metrics"
    return values[name]


def counters(url: str) -> dict[str, float]:
    """Prompt and generation token counters, running/waiting gauges and KV usage (one scrape)."""
    values = metrics(url)
    names = ("prompt_tokens_total", "generation_tokens_total", "num_requests_running", "num_requests_waiting",
             "kv_cache_usage_perc")
    missing = [n for n in names if n not in values]
    assert not missing, f"missing from /metrics: {missing}"
    return {n: values[n] for n in names}


def wait_idle(url: str, timeout: float = 60.0) -> float:
    """Wait until no request runs or waits; returns the seconds waited (fails after `timeout`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if metric(url, "num_requests_running") == 0 and metric(url, "num_requests_waiting") == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    pytest.fail(f"the server did not become idle within {timeout}s")


def poll_until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> float | None:
    """Seconds until `check()` held (None if it never did within `timeout`)."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(interval)


def log_problems(segment: str) -> list[str]:
    """Lines of a server-log segment that show a failure (tracebacks, ERROR lines, failed streams)."""
    return [line for line in segment.splitlines()
            if "Traceback" in line or " ERROR " in line or "stream failed" in line or "unhandled" in line]


# --- endpoints and client-side views ---------------------------------------------------------------

HELLO = [{"role": "user", "content": "hello"}]


def chat_url(server) -> str:
    return server.url + "/v1/chat/completions"


def completions_url(server) -> str:
    return server.url + "/v1/completions"


def responses_url(server) -> str:
    return server.url + "/v1/responses"


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


def no_content(sse: Sse, choice: int = 0) -> bool:
    """True when no delta of the choice carries non-empty content."""
    return all(not (c.get("delta") or {}).get("content") for c in sse.choice_chunks(choice))


def sdk_stream(client, **kwargs) -> dict[str, Any]:
    """Stream a chat completion through the openai client: per choice content, tool calls rebuilt
    by index (name, arguments text), finish reasons; usage of the final chunk."""
    out: dict[str, Any] = {"content": {}, "calls": {}, "finish": {}, "usage": None}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            i = choice.index
            out["content"][i] = out["content"].get(i, "") + (choice.delta.content or "")
            calls = out["calls"].setdefault(i, {})
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"name": None, "arguments": ""})
                if d.function and d.function.name:
                    call["name"] = d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
            if choice.finish_reason is not None:
                out["finish"].setdefault(i, []).append(choice.finish_reason)
    out["calls"] = {i: [calls[k] for k in sorted(calls)] for i, calls in out["calls"].items()}
    return out


def straddling_stop(tokens: list[str]) -> str:
    """A substring of "".join(tokens) that starts after the first character of one token and ends
    before the last character of a later one, occurring first where it starts."""
    text = "".join(tokens)
    starts = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    for i in range(1, len(tokens) - 2):
        j = i + 2
        if len(tokens[i]) >= 2 and len(tokens[j]) >= 2:
            stop = text[starts[i] + 1: starts[j] + 1]
            if text.index(stop) == starts[i] + 1:
                return stop
    raise AssertionError(f"no token pair to straddle in {tokens}")


def message_calls(message) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of a whole message's tool calls (SDK object)."""
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


# --- the concurrent batch ----------------------------------------------------------------------------

Jobs = dict[str, Callable[[], Any]]


class Batch:
    """Results of the generation-heavy requests of the selected case files, sent together (the
    engine batches them, which on a 2-core CPU costs far less than one test at a time), and the
    server log written meanwhile. `batch[name]` re-raises the exception a job raised."""

    def __init__(self, results: dict[str, tuple[Any, BaseException | None]], log: str,
                 seconds: dict[str, float]) -> None:
        self.results = results
        self.log = log
        self.seconds = seconds

    def __getitem__(self, name: str) -> Any:
        value, exc = self.results[name]
        if exc is not None:
            raise exc
        return value

    def error(self, name: str) -> BaseException | None:
        """The exception job `name` raised (None when it returned)."""
        return self.results[name][1]


def collected_batch_jobs(items: list[pytest.Item], server) -> Jobs:
    """The jobs of every module among `items` that defines `batch_jobs(server) -> Jobs`, in
    collection order (job names are prefixed by their case number, so they never clash), except
    that the jobs each module names in `LONG_JOBS` (a tuple of job names) come first.

    `run_batch` starts jobs in this order, 24 at a time. The long ones (hundreds of tokens, or n
    choices of many) started last would run on alone at the end, on 1-3 rows a step, after the
    short ones have finished; started first, they share the steps with the short ones throughout
    (the batch took 98 s with them started at 20 s, measured on the 2-core box).
    Raises ValueError when `LONG_JOBS` names a job its module does not define."""
    jobs: Jobs = {}
    long_names: list[str] = []
    seen: set[str] = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ in seen:
            continue
        seen.add(module.__name__)
        make = getattr(module, "batch_jobs", None)
        if make is not None:
            made = make(server)
            unknown = set(getattr(module, "LONG_JOBS", ())) - set(made)
            if unknown:
                raise ValueError(f"{module.__name__}.LONG_JOBS names jobs it does not define: {sorted(unknown)}")
            long_names += getattr(module, "LONG_JOBS", ())
            jobs.update(made)
    return {**{name: jobs[name] for name in long_names}, **jobs}


def run_batch(server, jobs: Jobs) -> Batch:
    """Run `jobs` 24 at a time on an otherwise idle server; wait until it is idle again."""
    wait_idle(server.url)
    offset = len(server.log())
    results: dict[str, tuple[Any, BaseException | None]] = {}
    seconds: dict[str, float] = {}

    def timed(name: str, job: Callable[[], Any]) -> Any:
        start = time.monotonic()
        try:
            return job()
        finally:
            seconds[name] = time.monotonic() - start

    with concurrent.futures.ThreadPoolExecutor(24) as pool:   # 24 at a time: KV room without preemption
        futures = {name: pool.submit(timed, name, job) for name, job in jobs.items()}
        for name, future in futures.items():
            try:
                results[name] = (future.result(), None)
            except Exception as exc:  # noqa: BLE001 - the test that reads this job raises it
                results[name] = (None, exc)
    wait_idle(server.url)
    time.sleep(0.3)
    return Batch(results, server.log()[offset:], seconds)
