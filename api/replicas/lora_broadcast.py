"""Run-time LoRA loads and unloads on every engine replica (`--data-parallel-size N`).

POST /v1/load_lora_adapter and /v1/unload_lora_adapter change one engine; behind the ingress each
is sent to every replica in turn (by rank, as /health is) and the answers become one:

- load: 200 once every replica has loaded the adapter. Otherwise the replicas that did load it
  unload it again (`rollback_request`), so the adapter is on every replica or on none, and the
  client gets the first refusal (a bad folder or a taken name is refused alike by every replica),
  or 503 `replica_unavailable` when a replica did not answer. A `load_inplace` load is not rolled
  back (the previous weights are gone already): the replicas that answered 200 serve the new ones.
- unload: 200 once no answering replica has the adapter any more: each removed it, or had not
  got it (404: a replica Serve restarted since the load starts with the `--lora-modules` adapters
  only) and at least one removed it; otherwise the first refusal, or 503 as above.

The router learns the change from the replicas' next routing stats (`EngineReplica.record_routing_stats`).
This module is plain Python (no Ray), tested without a cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from api.replicas.forwarded import ForwardedRequest, RoutingFacts

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"


@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    """One replica's whole answer: HTTP status, (name, value) byte headers, body."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class BroadcastOutcome:
    """What the ingress answers: `answer` (a replica's answer to pass on) or, when None, a 503
    naming `missing` (the ranks that did not answer); `rollback`: ranks to unload again first."""

    answer: ReplicaAnswer | None
    missing: tuple[int, ...] = ()
    rollback: tuple[int, ...] = ()


def is_lora_broadcast(method: str, path: str) -> bool:
    """True for the two run-time LoRA routes, which go to every replica."""
    return method == "POST" and path.rstrip("/") in (LOAD_PATH, UNLOAD_PATH)


def combine(path: str, body: bytes, answers: list[ReplicaAnswer | None]) -> BroadcastOutcome:
    """The outcome of a broadcast `path` request (`body`: its JSON body) from the replicas' answers
    (index = rank; None: no answer). Rules in the module docstring; raises ValueError for no answers."""
    if not answers:
        raise ValueError("a broadcast needs at least one replica's answer")
    ok = tuple(rank for rank, answer in enumerate(answers) if answer is not None and answer.status == 200)
    missing = tuple(rank for rank, answer in enumerate(answers) if answer is None)
    unloading = path.rstrip("/") == UNLOAD_PATH
    refused = [answer for answer in answers if answer is not None and answer.status != 200
               and not (unloading and answer.status == 404 and ok)]
    if not refused and not missing:
        return BroadcastOutcome(answer=answers[ok[0]])
    rollback = () if unloading or _load_inplace(body) else ok
    return BroadcastOutcome(answer=refused[0] if refused else None, missing=missing, rollback=rollback)


def rollback_request(forwarded: ForwardedRequest, rank: int) -> ForwardedRequest:
    """The unload that undoes `forwarded` (a load, already validated by a replica's 200) on `rank`:
    same headers (the API key) with the new body's content-length."""
    body = json.dumps({"lora_name": json.loads(forwarded.body)["lora_name"]}).encode()
    headers = tuple((k, v) for k, v in forwarded.headers if k.lower() != b"content-length")
    return replace(forwarded, path=UNLOAD_PATH, query_string=b"", body=body,
                   headers=headers + ((b"content-length", str(len(body)).encode()),),
                   facts=RoutingFacts(target_rank=rank))


def _load_inplace(body: bytes) -> bool:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(parsed, dict) and parsed.get("load_inplace") is True
