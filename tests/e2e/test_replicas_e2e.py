"""Issue 16 items 1, 2 and 4 end to end: `--data-parallel-size 2` on a local Ray Serve instance
(two SmolLM2 engine replicas, one torch thread each) behind one loopback endpoint.

One module-scoped deployment; the replica-failure test runs last (it kills a replica). Ray and
every replica die with the server process: SIGTERM shuts Serve and Ray down, and Ray's own
processes share the server's fate if it is killed (the server itself dies with the test run,
`benchmarks/server_process.py`)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import threading
import time

import httpx
import pytest

from tests.e2e.conftest import MODEL, start_server, stop_server
from tests.e2e.replicas_support import REPLICA, chat_on_both, replica_pids, statuses_on_both

pytestmark = [pytest.mark.slow, pytest.mark.ray]

SYSTEM = " ".join(f"Rule {i}: when asked about topic {i}, answer in one short, polite sentence." for i in range(40))


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("replicas"), "--data-parallel-size", "2", "--enable-lora",
                       "--allow-runtime-lora", "--max-lora-rank", "16", threads=1, timeout_s=480)
    yield srv
    stop_server(srv)


def chat(server, system: str, user: str, max_tokens: int = 4, model: str = MODEL) -> tuple[str, int]:
    """(replica, cached prompt tokens) of one chat completion, through the official client."""
    raw = server.client().chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=max_tokens, temperature=0)
    details = raw.parse().usage.prompt_tokens_details
    return raw.headers[REPLICA], (details.cached_tokens if details else 0) or 0


def test_health_and_metrics_cover_every_replica(replicas) -> None:
    health = httpx.get(replicas.url + "/health", timeout=30)
    assert health.status_code == 200 and health.headers[REPLICA] == "0,1"
    metrics = httpx.get(replicas.url + "/metrics", timeout=30).text
    for rank in ("0", "1"):
        assert f'structserve:num_requests_running{{model_name="{MODEL}",replica="{rank}"}}' in metrics
    assert set(replica_pids(replicas)) == {"0", "1"}
    models = httpx.get(replicas.url + "/v1/models", timeout=30)   # every route of the single server
    assert models.status_code == 200 and models.headers[REPLICA] in ("0", "1")


def test_a_shared_system_prompt_stays_on_one_replica_and_hits_its_prefix_cache(replicas) -> None:
    first, cached = chat(replicas, SYSTEM, "Tell me about topic 1.")
    later = [chat(replicas, SYSTEM, f"Tell me about topic {i}.") for i in (2, 3, 4)]
    assert {replica for replica, _ in later} == {first}
    assert all(cached_tokens >= 256 for _, cached_tokens in later), later
    unrelated = [f"{i} is the only number you ever talk about. " * 20 for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        landed = set(r for r, _ in pool.map(lambda system: chat(replicas, system, "Hi", max_tokens=16), unrelated))
    assert landed == {"0", "1"}


def lora(server, action: str, name: str, path: str | None = None) -> httpx.Response:
    body = {"lora_name": name} if path is None else {"lora_name": name, "lora_path": path}
    return httpx.post(f"{server.url}/v1/{action}_lora_adapter", json=body, timeout=120)


def test_runtime_adapter_loads_and_unloads_reach_every_replica(replicas, case_adapters) -> None:
    for name in ("sql", "kept"):
        loaded = lora(replicas, "load", name, str(case_adapters["adapter-a"]))
        assert loaded.status_code == 200 and loaded.headers[REPLICA] == "0,1", loaded.text
    assert statuses_on_both(replicas, "sql", 200) == {"0": 200, "1": 200}
    refused = lora(replicas, "load", "broken", "/nonexistent/adapter")
    assert refused.status_code == 400 and refused.json()["error"]["message"], refused.text
    unloaded = lora(replicas, "unload", "sql")
    assert unloaded.status_code == 200 and unloaded.headers[REPLICA] == "0,1", unloaded.text
    assert statuses_on_both(replicas, "sql", 404) == {"0": 404, "1": 404}
    assert lora(replicas, "unload", "sql").status_code == 404


def test_previous_response_id_and_background_responses_follow_their_owner(replicas) -> None:
    client = replicas.client()
    first = client.responses.with_raw_response.create(model=MODEL, input="Name a colour.", max_output_tokens=4)
    owner, first_id = first.headers[REPLICA], first.parse().id
    assert first_id.startswith(f"resp_r{owner}_")
    for turn in range(2):   # each turn is stored by the owner, so the chain stays there
        raw = client.responses.with_raw_response.create(model=MODEL, input=f"And another ({turn})?",
                                                        previous_response_id=first_id, max_output_tokens=4)
        turn_response = raw.parse()
        assert raw.headers[REPLICA] == owner and turn_response.previous_response_id == first_id
        assert turn_response.status in ("completed", "incomplete") and turn_response.output_text
        first_id = turn_response.id
    items = client.responses.input_items.list(first_id)
    assert len(items.data) >= 1
    background = client.responses.create(model=MODEL, input="Write a long story about a lighthouse keeper.",
                                         background=True, max_output_tokens=1000, temperature=0)
    bg_owner = owner_of(background.id)
    polled = client.responses.with_raw_response.retrieve(background.id)
    assert polled.headers[REPLICA] == bg_owner and polled.parse().status in ("queued", "in_progress")
    cancelled = client.responses.with_raw_response.cancel(background.id)
    assert cancelled.headers[REPLICA] == bg_owner and cancelled.parse().status == "cancelled"
    assert client.responses.retrieve(background.id).status == "cancelled"
    deleted = httpx.delete(f"{replicas.url}/v1/responses/{background.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.headers[REPLICA] == bg_owner
    assert httpx.get(f"{replicas.url}/v1/responses/{background.id}", timeout=30).status_code == 404


def owner_of(response_id: str) -> str:
    match = re.match(r"resp_r(\d+)_", response_id)
    assert match, response_id
    return match.group(1)


def test_killing_a_replica_fails_only_its_requests_and_serve_restarts_it(replicas) -> None:
    system = "You tell very long stories. " * 60
    body = {"model": MODEL, "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Go"}],
            "max_tokens": 400, "ignore_eos": True}
    stream: dict[str, object] = {}

    def read_stream() -> None:
        with httpx.stream("POST", replicas.url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=120) as response:
            stream["replica"] = response.headers[REPLICA]
            stream["lines"] = [line for line in response.iter_lines() if line]

    reader = threading.Thread(target=read_stream)
    reader.start()
    while "replica" not in stream:
        time.sleep(0.05)
    victim = str(stream["replica"])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        whole = pool.submit(httpx.post, replicas.url + "/v1/chat/completions", json=body, timeout=120)
        time.sleep(1.0)   # the whole request shares the stream's prefix: it runs on the same replica
        os.kill(replica_pids(replicas)[victim], signal.SIGKILL)
        reader.join(timeout=120)
        refused = whole.result()
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "replica_unavailable"
    last = json.loads(str(stream["lines"][-1]).removeprefix("data: "))
    assert last["error"]["code"] == "replica_unavailable"
    orphan = f"{replicas.url}/v1/responses/resp_r{victim}_{'0' * 32}"   # owned by the dead rank
    while_down = httpx.get(orphan, timeout=30)
    assert while_down.status_code == 503 and while_down.json()["error"]["code"] == "replica_unavailable"
    survivors = [chat(replicas, "Be brief.", f"Question {i}") for i in range(3)]
    assert all(replica != victim for replica, _ in survivors)
    deadline = time.monotonic() + 240
    while httpx.get(replicas.url + "/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the killed replica was not restarted"
        time.sleep(2.0)
    time.sleep(2.5)   # the replacement's first routing stats (every second): it has no run-time adapter
    survivor = "1" if victim == "0" else "0"
    assert chat_on_both(replicas, "kept") == {survivor: 200}   # loaded at run time before the kill
    assert httpx.get(orphan, timeout=30).status_code == 404   # the owner is back: it has no such response
    metrics = httpx.get(replicas.url + "/metrics", timeout=30).text
    for rank in ("0", "1"):   # nothing left running or holding KV blocks on either replica
        assert f'structserve:num_requests_running{{model_name="{MODEL}",replica="{rank}"}} 0.0' in metrics
        assert f'structserve:kv_cache_usage_perc{{model_name="{MODEL}",replica="{rank}"}} 0.0' in metrics
