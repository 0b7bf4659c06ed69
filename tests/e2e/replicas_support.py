"""What the `--data-parallel-size` e2e modules share: the replica header, each replica's process id
(from the merged /metrics) and a burst of unrelated chats that reaches every replica."""

from __future__ import annotations

import concurrent.futures
import re
import time
import uuid

import httpx

REPLICA = "x-structserve-replica"


def replica_pids(server) -> dict[str, int]:
    """Replica rank -> the process id of its engine (`structserve:replica_process_id`)."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {rank: int(float(pid)) for rank, pid in re.findall(r'replica_process_id\{replica="(\d+)"\} (\S+)', text)}


def chat_on_both(server, model: str) -> dict[str, int]:
    """Replica -> HTTP status of 4 concurrent chats with unrelated prompts naming `model`: the router
    spreads them over both replicas (unless only one has the adapter `model`). Each prompt starts
    with a fresh nonce, so that no replica holds a cached prefix of it: a prompt seen before would
    pin all four to the replica that has it (the imbalance fallback waits for a longer queue)."""
    def one(i: int) -> tuple[str, int]:
        response = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": 2,
            "messages": [{"role": "system",
                          "content": f"{uuid.uuid4().hex}: {i} is the only number you talk about. " * 20},
                         {"role": "user", "content": "Hi"}]})
        return response.headers[REPLICA], response.status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, range(4)))


def statuses_on_both(server, model: str, status: int, timeout_s: float = 30.0) -> dict[str, int]:
    """Replica -> HTTP status of `chat_on_both` rounds, repeated until both replicas have answered
    (the router's view of who holds `model` follows the replicas' routing stats, refreshed every
    ROUTING_STATS_PERIOD_S, so right after a load or unload one round may reach one replica only) or
    `timeout_s` passed; every answer of every round must be `status`."""
    seen: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while set(seen) != {"0", "1"} and time.monotonic() < deadline:
        answers = chat_on_both(server, model)
        assert set(answers.values()) == {status}, answers
        seen.update(answers)
        if set(seen) != {"0", "1"}:
            time.sleep(1.0)
    return seen
