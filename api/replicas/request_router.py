"""`StructserveRequestRouter`: Ray Serve's request router for the engine replicas.

Serve calls `choose_replicas` for each pending request (the `ForwardedRequest` the ingress sent,
with its `RoutingFacts`) and tries the returned groups in order, each time the replica with the
shortest queue in the group that accepts the request (Serve's `RequestRouter` contract,
`ray.serve.request_router`). The policy itself is `replica_choice.order_candidates`; this class
feeds it each replica's queue length (Serve's queue-length cache), the rank and loaded adapters
the replica reports through `record_routing_stats` (`deployments.EngineReplica`), and the prompt
prefixes this router has sent where (`PrefixIndex`, updated in `on_request_routed`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from api.replicas.forwarded import ForwardedRequest, RoutingFacts
from api.replicas.prefix_index import PrefixIndex
from api.replicas.replica_choice import DEFAULT_IMBALANCE_THRESHOLD, CandidateState, order_candidates

logger = logging.getLogger(__name__)


class StructserveRequestRouter(RequestRouter):
    """Owner, then prefix, then adapter, then least loaded (`replica_choice.py`).

    `initialize_state` kwargs (`RequestRouterConfig.request_router_kwargs`): `imbalance_threshold`
    (ongoing requests by which the preferred replica may exceed the least loaded one) and
    `max_prefix_entries` (chunk digests remembered per replica).
    """

    def initialize_state(self, imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD,
                         max_prefix_entries: int = 100_000, **kwargs: Any) -> None:
        """Serve calls this once, after construction, with the configured kwargs."""
        self._imbalance_threshold = imbalance_threshold
        self._prefixes = PrefixIndex(max_prefix_entries)
        self._num_routed: dict[ReplicaID, int] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """One group per replica, most preferred first (never empty while there are candidates:
        Serve keeps retrying a request whose router returns nothing, even after it is cancelled)."""
        facts = _facts(pending_request)
        by_key = {replica.replica_id: replica for replica in candidate_replicas}
        states = [self._state(replica) for replica in candidate_replicas]
        ordered = order_candidates(states, facts, self._prefixes, self._imbalance_threshold)
        return [[by_key[state.key]] for state in ordered]   # type: ignore[index]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """Record the request's prompt prefix as now cached on the replica it went to."""
        self._prefixes.record(replica_id, _facts(pending_request).prefix_hashes)
        self._num_routed[replica_id] = self._num_routed.get(replica_id, 0) + 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica's prefixes: its replacement starts with an empty prefix cache."""
        super().on_replica_actor_died(replica_id)
        self._prefixes.forget(replica_id)
        self._num_routed.pop(replica_id, None)

    def _state(self, replica: RunningReplica) -> CandidateState:
        stats = replica.routing_stats or {}
        rank = stats.get("rank")
        return CandidateState(
            key=replica.replica_id,
            rank=rank if isinstance(rank, int) else None,
            queue_len=self.replica_queue_len_cache.get(replica.replica_id) or 0,
            adapters=frozenset(stats.get("adapters", ())),
            num_routed=self._num_routed.get(replica.replica_id, 0),
        )


def _facts(pending_request: PendingRequest | None) -> RoutingFacts:
    """The facts the ingress attached; none for a request that is not a `ForwardedRequest`."""
    if pending_request is not None and pending_request.args and isinstance(pending_request.args[0], ForwardedRequest):
        return pending_request.args[0].facts
    return RoutingFacts()
