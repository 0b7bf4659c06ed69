"""Acceptance case 018 (../shared/cases): loading and unloading LoRA adapters while generations run
never crashes the server, never fails or switches the weights of a running stream, and answers
bad loads with clean 400s; end to end on a real server (`lora_runtime_server` in conftest.py,
shared with case 040: `cases_lora.py` adapters, one torch thread, --max-loras 2, run-time loading on).

The streams of the case run with `ignore_eos` so that they really last their 256 tokens (the base
model otherwise stops after a few) and the adapter operations happen while they are in flight.
Each neighbour test loads adapters under its own names, so the tests do not depend on each other.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import httpx
import pytest

from tests.e2e.cases_lora import broken_adapters
from tests.e2e.cases_support import (
    HTTP,
    Sse,
    case_steps,
    error_problems,
    log_problems,
    parallel,
    post,
    post_sse,
)
from tests.e2e.conftest import MODEL, Server

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COUNT = [{"role": "user", "content": "Count slowly from one to fifty in words."}]


def stream_body(model: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": COUNT}


def load(srv: Server, name: str, path: Any, inplace: bool = False) -> httpx.Response:
    return post(srv.url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path), "load_inplace": inplace})


def unload(srv: Server, name: str) -> httpx.Response:
    return post(srv.url + "/v1/unload_lora_adapter", {"lora_name": name}, timeout=600)


def model_ids(srv: Server) -> list[str]:
    return [m["id"] for m in HTTP.get(srv.url + "/v1/models", timeout=10).json()["data"]]


def start_streams(pool: concurrent.futures.Executor, srv: Server,
                  bodies: list[dict[str, Any]]) -> list[concurrent.futures.Future[Sse]]:
    """Submit the streams and return once each has sent its first event (fails after 120 s)."""
    events = [threading.Event() for _ in bodies]
    futures = [pool.submit(post_sse, srv.url + CHAT, body, started=event) for body, event in zip(bodies, events)]
    assert all(event.wait(120) for event in events), "a stream did not start within 120 s"
    return futures


def check_stream(sse: Sse, body: dict[str, Any], reference: str) -> None:
    """Finished normally ([DONE] last, no error payload, finish_reason length after max_tokens) with
    the text of the same request run alone."""
    assert sse.status == 200 and not sse.problems, (body["model"], sse.text[:300], sse.problems)
    assert sse.finish_reasons() == ["length"], (body["model"], sse.finish_reasons())
    assert {c["model"] for c in sse.chunks} == {body["model"]}, (body["model"], sse.chunks[0]["model"])
    assert sse.content() == reference, f"{body['model']}: the stream's text changed under the adapter operation"


def check_alive(srv: Server, pid: int, log_offset: int) -> None:
    """Same process, healthy, and no traceback or ERROR line logged since `log_offset`."""
    assert srv.proc.poll() is None and srv.proc.pid == pid, "the server process exited"
    assert HTTP.get(srv.url + "/health", timeout=10).status_code == 200
    log = srv.log()[log_offset:]
    assert not log_problems(log), log_problems(log)


def test_case018_load_and_unload_while_streams_run(lora_runtime_server, case_adapters):
    srv = lora_runtime_server
    steps = case_steps("018")
    assert (steps[0]["body"]["model"], steps[1]["body"]["model"]) == ("default", "adapter-a")
    # the served model's name for the case's "default" (a response names the model it was asked for)
    base_body = {**steps[0]["body"], "model": MODEL, "ignore_eos": True}
    a_body = {**steps[1]["body"], "ignore_eos": True}
    assert base_body["max_tokens"] == a_body["max_tokens"] == 256
    pid, offset = srv.proc.pid, len(srv.log())
    reference = {body["model"]: sse.content() for body, sse in zip(
        (base_body, a_body), parallel(*[lambda b=b: post_sse(srv.url + CHAT, b) for b in (base_body, a_body)]))}
    assert reference[MODEL] != reference["adapter-a"], "adapter-a does not change the output"
    bodies = [base_body] * 4 + [a_body] * 4
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        first = start_streams(pool, srv, bodies)
        loaded = load(srv, "adapter-b", case_adapters["adapter-b"])
        if loaded.status_code in (409, 503):       # documented retryable refusal
            assert not error_problems(loaded, loaded.status_code), loaded.text
            concurrent.futures.wait(first)
            loaded = load(srv, "adapter-b", case_adapters["adapter-b"])
        assert loaded.status_code == 200, loaded.text
        hi = post(srv.url + CHAT, steps[3]["body"])
        late = start_streams(pool, srv, [a_body, a_body])
        unloaded = unload(srv, steps[4]["body"]["lora_name"])
        unload_returned = time.monotonic()
        results = [f.result() for f in first + late]
    assert hi.status_code == 200 and hi.json()["model"] == "adapter-b", hi.text
    for body, sse in zip(bodies + [a_body, a_body], results, strict=True):
        check_stream(sse, body, reference[body["model"]])
    if unloaded.status_code == 409:
        assert not error_problems(unloaded, 409), unloaded.text
        assert unload(srv, "adapter-a").status_code == 200
    else:
        assert unloaded.status_code == 200, unloaded.text
        last_a = max(sse.finished_at for body, sse in zip(bodies + [a_body, a_body], results) if body is a_body)
        assert unload_returned >= last_a - 1.0, "the unload answered before the adapter's streams ended"
    ids = model_ids(srv)
    assert "adapter-a" not in ids and "adapter-b" in ids, ids
    gone = post(srv.url + CHAT, {**steps[3]["body"], "model": "adapter-a"})
    assert not error_problems(gone, 404), gone.text
    assert gone.json()["error"]["code"] == "model_not_found", gone.text
    check_alive(srv, pid, offset)


def test_case018_neighbours_bad_loads_are_400_and_leave_traffic_alone(lora_runtime_server, case_adapters, tmp_path):
    """Rank above --max-lora-rank, missing or malformed folders, a taken name, the base model's
    name and a body without lora_path are 400s (an unknown unload a 404), sent while streams of
    the base model and an adapter run; the streams and /v1/models are unchanged."""
    srv = lora_runtime_server
    pid, offset = srv.proc.pid, len(srv.log())
    assert load(srv, "n-a", case_adapters["adapter-a"]).status_code == 200
    bodies = [stream_body(MODEL, 64), stream_body("n-a", 64)] * 2
    reference = {b["model"]: s.content() for b, s in zip(bodies, parallel(
        *[lambda b=b: post_sse(srv.url + CHAT, b) for b in bodies[:2]]))}
    broken = broken_adapters(tmp_path, case_adapters["adapter-a"])
    bad = [({"lora_name": "n-big", "lora_path": str(case_adapters["adapter-big"])}, 400, "lora_path", "rank"),
           *[({"lora_name": f"n-{kind}", "lora_path": str(path)}, 400, "lora_path", None)
             for kind, path in broken.items()],
           ({"lora_name": "n-a", "lora_path": str(case_adapters["adapter-b"])}, 400, "lora_name", None),
           *[({"lora_name": name, "lora_path": str(case_adapters["adapter-b"])}, 400, "lora_name", None)
             for name in (MODEL, "default")],
           ({"lora_name": "n-nopath"}, 400, "lora_path", None)]
    before = model_ids(srv)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = start_streams(pool, srv, bodies)
        *answers, unknown = parallel(*[lambda b=b: post(srv.url + "/v1/load_lora_adapter", b[0]) for b in bad],
                                     lambda: post(srv.url + "/v1/unload_lora_adapter", {"lora_name": "n-unknown"}))
        results = [f.result() for f in streams]
    failures = {}
    for (body, status, param, mention), answer in zip(bad, answers, strict=True):
        problems = error_problems(answer, status, param, mention)
        if problems:
            failures[str(body)] = problems
    assert not failures, failures
    assert not error_problems(unknown, 404), unknown.text
    for body, sse in zip(bodies, results, strict=True):
        check_stream(sse, body, reference[body["model"]])
    assert model_ids(srv) == before
    assert unload(srv, "n-a").status_code == 200
    check_alive(srv, pid, offset)


def test_case018_neighbours_reload_in_place_never_switches_running_streams(lora_runtime_server, case_adapters):
    """An adapter reloaded in place with other weights (of another rank) while its streams run:
    they finish on the old weights, a request sent after the reload gets the new ones."""
    srv = lora_runtime_server
    pid, offset = srv.proc.pid, len(srv.log())
    for name, folder in (("n-b", "adapter-b"), ("n-c", "adapter-c")):
        assert load(srv, name, case_adapters[folder]).status_code == 200
    old, new = stream_body("n-b", 64), stream_body("n-c", 64)
    reference = {b["model"]: s.content() for b, s in zip(
        (old, new), parallel(*[lambda b=b: post_sse(srv.url + CHAT, b) for b in (old, new)]))}
    assert reference["n-b"] != reference["n-c"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = start_streams(pool, srv, [old, old])
        reloaded = load(srv, "n-b", case_adapters["adapter-c"], inplace=True)
        after = post_sse(srv.url + CHAT, old)
        results = [f.result() for f in streams]
    assert reloaded.status_code == 200, reloaded.text
    for sse in results:
        check_stream(sse, old, reference["n-b"])
    check_stream(after, old, reference["n-c"])
    for name in ("n-b", "n-c"):
        assert unload(srv, name).status_code == 200
    check_alive(srv, pid, offset)


def test_case018_neighbours_requests_racing_an_unload_get_404_or_finish(lora_runtime_server, case_adapters):
    """Requests naming an adapter sent together with its unload: each is either refused before it
    streams (404 error object) or streams to a normal end; never an error mid-stream."""
    srv = lora_runtime_server
    pid, offset = srv.proc.pid, len(srv.log())
    outcomes = []
    for _ in range(3):
        assert load(srv, "n-d", case_adapters["adapter-a"]).status_code == 200
        jobs = [lambda: post_sse(srv.url + CHAT, stream_body("n-d", 8)) for _ in range(6)]
        *answers, unloaded = parallel(*jobs, lambda: unload(srv, "n-d"))
        assert unloaded.status_code == 200, unloaded.text
        for sse in answers:
            if sse.status == 200:
                assert not sse.problems and sse.finish_reasons() == ["length"], (sse.text[:300], sse.problems)
                outcomes.append("finished")
            else:
                refused = httpx.Response(sse.status, headers={"content-type": sse.content_type},
                                         content=sse.text.encode())
                assert not error_problems(refused, 404), error_problems(refused, 404)
                assert refused.json()["error"]["code"] == "model_not_found", sse.text
                outcomes.append("404")
        assert "n-d" not in model_ids(srv)
    print("racing requests:", {o: outcomes.count(o) for o in set(outcomes)})
    check_alive(srv, pid, offset)
