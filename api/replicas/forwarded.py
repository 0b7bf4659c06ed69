"""What the ingress hands an engine replica: the HTTP request and the facts the router routes on.

The ingress reads the body once, extracts `RoutingFacts` from it and sends both in one
`ForwardedRequest` through the deployment handle; the request router reads the facts from the
pending request's first argument, so it never parses a body itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from api.replicas.prefix_hash import prefix_hashes
from api.replicas.response_owner import owner_rank, path_response_id


@dataclass(frozen=True, slots=True)
class RoutingFacts:
    """Why a request should go to one replica rather than another.

    target_rank: the one replica this request is for (the ingress's /health and /metrics fan-out),
        else None.
    owner_rank: rank of the replica owning the stored response the request names
        (`previous_response_id`, or the id in a /v1/responses/{id} path), else None.
    model: the body's `model` (a served name or a LoRA adapter name), else None.
    prefix_hashes: the body's prompt prefix as chained chunk digests (`prefix_hash.py`).
    """

    target_rank: int | None = None
    owner_rank: int | None = None
    model: str | None = None
    prefix_hashes: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """One HTTP request as the ingress received it (ASGI names: `headers` are lower-case
    (name, value) byte pairs, `query_string` without "?") plus its routing facts."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    facts: RoutingFacts = field(default_factory=RoutingFacts)


def routing_facts(method: str, path: str, body: bytes) -> RoutingFacts:
    """The facts of a request: owner from the path or `previous_response_id`, model and prompt
    prefix from a JSON object body. A body that is not a JSON object (or not JSON) gives none of
    the body's facts: the replica answers it with the API's 400 as the single server would."""
    owner = owner_rank(path_response_id(path))
    if method != "POST" or not body:
        return RoutingFacts(owner_rank=owner)
    try:
        parsed: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return RoutingFacts(owner_rank=owner)
    if not isinstance(parsed, dict):
        return RoutingFacts(owner_rank=owner)
    previous = parsed.get("previous_response_id")
    if owner is None and isinstance(previous, str):
        owner = owner_rank(previous)
    model = parsed.get("model")
    return RoutingFacts(owner_rank=owner, model=model if isinstance(model, str) else None,
                        prefix_hashes=prefix_hashes(parsed))
