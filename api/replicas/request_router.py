"""`StructserveRequestRouter`: Ray Serve's request router for the engine replicas.

Serve calls `choose_replicas` for each pending request (the `ForwardedRequest` the ingress sent,
with its `RoutingFacts`) and tries the returned groups in order, each time the replica with the
shortest queue in the group that accepts the request (Serve's `RequestRouter` contract,
`ray.serve.request_router`). The policy itself is `replica_choice.order_candidates`; this class
feeds it each replica's queue length (Serve's queue-length cache), the rank and loaded adapters
the replica reports through `record_routing_stats` (`deployments.EngineReplica`), the requests it
has placed on each replica and not seen complete (`OngoingRequests`), and the prompt prefixes it
has sent where (`PrefixIndex`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from api.replicas.forwarded import ForwardedRequest, RoutingFacts
from api.replicas.ongoing import OngoingRequests
from api.replicas.prefix_index import PrefixIndex
from api.replicas.replica_choice import DEFAULT_IMBALANCE_THRESHOLD, CandidateState, order_candidates

logger = logging.getLogger(__name__)


class StructserveRequestRouter(RequestRouter):
    """Owner, then prefix, then adapter, then least loaded (`replica_choice.py`).

    `initialize_state` kwargs (`RequestRouterConfig.request_router_kwargs`): `imbalance_threshold`
    (ongoing requests by which the preferred replica may exceed the least loaded one) and
    `max_prefix_entries` (chunk digests remembered per replica).

    A request counts for its first-choice replica (its prefix recorded there, one more in that
    replica's queue) as soon as it is chosen, not only once Serve reports it routed: Serve answers
    `on_request_routed` after the replica has accepted, and requests chosen meanwhile would
    otherwise all see the same state and pile onto one replica. A replica's queue is then this
    router's own count of the requests it placed there and has not seen complete (`ongoing.py`):
    with one ingress every request to a replica passes here, so the count is exact, while Serve's
    queue-length cache (the replica's own figure at its last accept, adjusted at sends and
    completions) can hold a replica's count from a burst that has ended. Taking the larger of the
    two once made a server's next burst see an idle replica as busy: all 4 system prompts of a
    replicas_bench round went to the other replica, and prefix affinity kept all 32 requests there.
    """

    def initialize_state(self, imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD,
                         max_prefix_entries: int = 100_000, **kwargs: Any) -> None:
        """Serve calls this once, after construction, with the configured kwargs."""
        self._imbalance_threshold = imbalance_threshold
        self._prefixes = PrefixIndex(max_prefix_entries)
        self._num_routed: dict[ReplicaID, int] = {}
        self._ongoing = OngoingRequests()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """One group per replica, most preferred first (never empty while there are candidates:
        Serve keeps retrying a request whose router returns nothing, even after it is cancelled)."""
        facts = _facts(pending_request)
        by_key = {replica.replica_id: replica for replica in candidate_replicas}
        states = [self._state(replica) for replica in candidate_replicas]
        ordered = order_candidates(states, facts, self._prefixes, self._imbalance_threshold)
        if ordered and pending_request is not None and facts.target_rank is None:
            self._count(pending_request, ordered[0].key, facts)   # type: ignore[arg-type]
        return [[by_key[state.key]] for state in ordered]   # type: ignore[index]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """Serve sent the request to `replica_id`: move its count there if that was not the first choice."""
        facts = _facts(pending_request)
        if facts.target_rank is not None:
            return
        moved_from = self._ongoing.routed(pending_request.metadata.internal_request_id, replica_id)
        if moved_from is not None:
            self._place(replica_id, moved_from, facts)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """Serve's hook once a sent request ends (on every path, rejected ones too): it leaves the queue."""
        self._ongoing.completed(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica's prefixes: its replacement starts with an empty prefix cache."""
        super().on_replica_actor_died(replica_id)
        self._prefixes.forget(replica_id)
        self._num_routed.pop(replica_id, None)

    def _count(self, pending_request: PendingRequest, replica_id: ReplicaID, facts: RoutingFacts) -> None:
        future = pending_request.future
        previous = self._ongoing.chosen(pending_request.metadata.internal_request_id, replica_id, future.cancelled)
        if previous != replica_id:   # else Serve asked again for the same request (its first choice was full)
            self._place(replica_id, previous, facts)

    def _place(self, replica_id: ReplicaID, previous: Any, facts: RoutingFacts) -> None:
        """Count a request on `replica_id` (off `previous`, where it was counted before, if any) and
        record its prompt's prefixes there."""
        if previous is not None:
            self._num_routed[previous] -= 1
        self._num_routed[replica_id] = self._num_routed.get(replica_id, 0) + 1
        self._prefixes.record(replica_id, facts.prefix_hashes)

    def _state(self, replica: RunningReplica) -> CandidateState:
        stats = replica.routing_stats or {}
        rank = stats.get("rank")
        return CandidateState(
            key=replica.replica_id,
            rank=rank if isinstance(rank, int) else None,
            queue_len=self._ongoing.count(replica.replica_id),
            adapters=frozenset(stats.get("adapters", ())),
            num_routed=self._num_routed.get(replica.replica_id, 0),
        )


def _facts(pending_request: PendingRequest | None) -> RoutingFacts:
    """The facts the ingress attached; none for a request that is not a `ForwardedRequest`."""
    if pending_request is not None and pending_request.args and isinstance(pending_request.args[0], ForwardedRequest):
        return pending_request.args[0].facts
    return RoutingFacts()
