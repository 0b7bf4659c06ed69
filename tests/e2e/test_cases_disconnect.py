"""Acceptance case 026 (../shared/cases): a client that disconnects (streaming, not streaming, or
during a long prefill) frees its slot and KV blocks at once, is logged as aborted, and other
streams complete normally. End to end on the real server, which must otherwise be idle (the
running-request gauge and KV usage are watched through /metrics).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.cases_support import (
    HTTP,
    case_steps,
    chat_url,
    counters,
    log_problems,
    metric,
    parallel,
    poll_until,
    post,
    post_sse,
    wait_idle,
)

pytestmark = pytest.mark.slow


# --- 026 -----------------------------------------------------------------------------------------------

def _idle_state(server) -> tuple[float, float]:
    wait_idle(server.url)
    return metric(server.url, "kv_cache_usage_perc"), metric(server.url, "generation_tokens_total")


def _step2_latency(server, body) -> float:
    start = time.monotonic()
    r = post(chat_url(server), body)
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def _raw_request(server, body: dict[str, Any], request_id: str) -> socket.socket:
    """Send a POST over a plain socket (so the test can drop the connection at any moment)."""
    url = urlparse(server.url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((url.hostname, url.port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nx-request-id: {request_id}\r\n\r\n")
    sock.sendall(head.encode() + data)
    return sock


def _drop(sock: socket.socket) -> float:
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    return time.monotonic()


def _after_disconnect(server, closed: float, kv_idle: float,
                      step2: dict[str, Any]) -> tuple[float, float | None, float | None]:
    """Send step 2 at once and watch /metrics meanwhile. Returns (step 2 latency, seconds from the
    disconnect until the abandoned request no longer ran or waited, seconds until nothing ran and
    KV usage was back at its idle value once step 2 was done); None: not within 30 s."""
    step2_done = threading.Event()
    prompt_before = counters(server.url)["prompt_tokens_total"]

    def run_step2() -> float:
        try:
            return _step2_latency(server, step2)
        finally:
            step2_done.set()

    def watch() -> tuple[float | None, float | None]:
        gone = idle = None
        while time.monotonic() - closed < 30 and (gone is None or idle is None):
            done = step2_done.is_set()
            now = counters(server.url)
            busy = now["num_requests_running"] + now["num_requests_waiting"]
            step2_in_engine = now["prompt_tokens_total"] > prompt_before and not done
            elapsed = time.monotonic() - closed
            if gone is None and (busy == 0 or (step2_in_engine and busy <= 1)):
                gone = elapsed
            if idle is None and done and busy == 0 and now["kv_cache_usage_perc"] == kv_idle:
                idle = elapsed
            time.sleep(0.1)
        return gone, idle

    latency, (gone, idle) = parallel(run_step2, watch)
    return latency, gone, idle


@pytest.fixture(scope="module")
def normal_latency(server) -> float:
    """Step 2's latency on the idle server, observed the same way as after a disconnect (the
    /metrics polling costs this small box some time); the second of two runs."""
    step2 = case_steps("026")[1]["body"]
    kv_idle, _ = _idle_state(server)
    _after_disconnect(server, time.monotonic(), kv_idle, step2)
    return _after_disconnect(server, time.monotonic(), kv_idle, step2)[0]


def _check_freed(gone: float | None, idle: float | None, latency: float, normal: float, what: str) -> None:
    assert gone is not None and gone <= 2.0, f"{what} held its slot {gone}s after the disconnect (None: > 30s)"
    assert idle is not None and idle <= max(2.0, latency + 1.0), f"KV usage back at idle only after {idle}s"
    assert latency <= normal + 2.0, f"step 2 took {latency:.2f}s (normal {normal:.2f}s)"


def test_case026_stream_disconnect_frees_slot_at_once(server, normal_latency):
    steps = case_steps("026")
    # ignore_eos: the abandoned request must really be able to run to its 4000 tokens
    victim = {**steps[0]["body"], "ignore_eos": True}
    step2 = steps[1]["body"]
    kv_idle, generated = _idle_state(server)
    offset = len(server.log())
    chunk_id = None
    with HTTP.stream("POST", chat_url(server), json=victim, timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        lines = r.iter_lines()   # held: a dropped iterator would close the connection at `break`
        for line in lines:
            if line.startswith("data: {"):
                seen += 1
                chunk_id = json.loads(line[6:])["id"]
            if seen >= 3:
                break
        assert metric(server.url, "num_requests_running") >= 1
    closed = time.monotonic()   # leaving the block closes the connection
    latency, gone, idle = _after_disconnect(server, closed, kv_idle, step2)
    _check_freed(gone, idle, latency, normal_latency, "the abandoned stream")
    assert metric(server.url, "generation_tokens_total") - generated < 200, "the abandoned request kept generating"
    time.sleep(0.3)
    log = server.log()[offset:]
    assert f"request {chunk_id}: aborted" in log, f"no abort recorded for {chunk_id}:\n{log[-2000:]}"
    assert not log_problems(log), log_problems(log)


def test_case026_nonstream_disconnect_frees_slot_at_once(server, normal_latency):
    steps = case_steps("026")
    victim = {**steps[0]["body"], "stream": False, "ignore_eos": True}
    step2 = steps[1]["body"]
    kv_idle, _ = _idle_state(server)
    generated = metric(server.url, "generation_tokens_total")
    offset = len(server.log())
    rid = f"case026-whole-{uuid.uuid4().hex[:8]}"
    sock = _raw_request(server, victim, rid)
    try:
        assert poll_until(lambda: metric(server.url, "generation_tokens_total") >= generated + 3, 60) is not None
    finally:
        closed = _drop(sock)
    latency, gone, idle = _after_disconnect(server, closed, kv_idle, step2)
    _check_freed(gone, idle, latency, normal_latency, "the abandoned request")
    time.sleep(0.3)
    log = server.log()[offset:]
    assert f"request {rid}: client disconnected; request cancelled" in log, log[-2000:]
    assert not log_problems(log), log_problems(log)


def test_case026_disconnect_during_long_prefill(server, normal_latency):
    """A long prompt (unique, so not prefix-cached) abandoned before its first token."""
    step2 = case_steps("026")[1]["body"]
    kv_idle, _ = _idle_state(server)
    generated = metric(server.url, "generation_tokens_total")
    words = " ".join(f"w{i % 89}" for i in range(260))
    prompt = f"{uuid.uuid4().hex}\n{words}\nCount the words above."
    count = HTTP.post(server.url + "/tokenize", json={"model": "default", "messages": [
        {"role": "user", "content": prompt}]}).json()["count"]
    assert 600 < count < 2048, count   # one prefill step (--max-num-batched-tokens 2048)
    victim = {"model": "default", "stream": True, "max_tokens": 50,
              "messages": [{"role": "user", "content": prompt}]}
    offset = len(server.log())
    rid = f"case026-prefill-{uuid.uuid4().hex[:8]}"
    sock = _raw_request(server, victim, rid)
    try:
        assert poll_until(lambda: metric(server.url, "num_requests_running") >= 1, 30, 0.01) is not None
    finally:
        closed = _drop(sock)
    latency, gone, idle = _after_disconnect(server, closed, kv_idle, step2)
    _check_freed(gone, idle, latency, normal_latency, f"the abandoned prefill ({count} prompt tokens)")
    # at most the token sampled when the prefill step running at the disconnect ends
    extra = metric(server.url, "generation_tokens_total") - generated - step2["max_tokens"]
    assert extra <= 1, f"the prompt abandoned during its prefill still generated {extra:.0f} token(s)"
    time.sleep(0.3)
    log = server.log()[offset:]
    assert f"request {rid}: client disconnected" in log, log[-2000:]
    assert not log_problems(log), log_problems(log)


def test_case026_other_streams_complete_normally(server):
    steps = case_steps("026")
    victim = {**steps[0]["body"], "ignore_eos": True}
    other = {"model": "default", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
             "max_tokens": 24, "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me about owls."}]}
    kv_idle, _ = _idle_state(server)

    def abandon() -> None:
        with HTTP.stream("POST", chat_url(server), json=victim, timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: {")
                if seen >= 3:
                    break

    def other_client():
        time.sleep(0.2)
        return post_sse(chat_url(server), other)

    _, result = parallel(abandon, other_client)
    assert result.status == 200 and not result.problems, result.problems
    assert result.finish_reasons() == ["length"] and result.chunks[-1]["usage"]["completion_tokens"] == 24
    assert poll_until(lambda: metric(server.url, "num_requests_running") == 0
                      and metric(server.url, "kv_cache_usage_perc") == kv_idle, 5) is not None
