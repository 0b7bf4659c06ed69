"""`StructserveRequestRouter`'s queue bookkeeping, driven through Serve's hooks in Serve's order.

The router is the real class on Serve's real `RequestRouter` base (with its queue-length cache on,
as Serve runs it); Serve's calls are replayed in the order `ray.serve._private.router` makes them
for one request: `choose_replicas`, `on_send_request` (the request is sent), `on_new_queue_len_info`
and `on_request_routed` (the replica accepted), then `on_request_completed` and
`decrement_queue_len_cache` (it ended). The replicas are `Replica`s: the two attributes of Serve's
`RunningReplica` the router reads (a real one needs a live actor). No Ray instance is started.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest

from api.replicas.forwarded import ForwardedRequest, RoutingFacts
from api.replicas.ongoing import OngoingRequests
from api.replicas.request_router import StructserveRequestRouter

DEPLOYMENT = DeploymentID(name="EngineReplica", app_name="structserve")
HOT = (b"p1", b"p2", b"p3")   # the prefix digests of one long system prompt


@dataclass
class Replica:
    """What the router reads of Serve's `RunningReplica`."""

    replica_id: ReplicaID
    routing_stats: dict = field(default_factory=dict)


def new_router(threshold: int = 4) -> tuple[StructserveRequestRouter, list[Replica]]:
    router = StructserveRequestRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.PROXY,
                                      use_replica_queue_len_cache=True)
    router.initialize_state(imbalance_threshold=threshold)
    replicas = [Replica(ReplicaID(unique_id=f"r{rank}", deployment_id=DEPLOYMENT), {"rank": rank, "adapters": []})
                for rank in range(2)]
    return router, replicas


def pending(request_id: str, prefix: tuple[bytes, ...]) -> PendingRequest:
    forwarded = ForwardedRequest("POST", "/v1/chat/completions", b"", (), b"{}", RoutingFacts(prefix_hashes=prefix))
    return PendingRequest(args=[forwarded], kwargs={},
                          metadata=RequestMetadata(request_id=request_id, internal_request_id=request_id))


async def choose(router: StructserveRequestRouter, replicas: list[Replica], request: PendingRequest) -> ReplicaID:
    groups = await router.choose_replicas(replicas, request)   # type: ignore[arg-type]
    return groups[0][0].replica_id


async def send(router: StructserveRequestRouter, replicas: list[Replica], request_id: str,
               prefix: tuple[bytes, ...]) -> ReplicaID:
    """Serve routes and sends one request (the replica has not answered the rejection protocol yet)."""
    request = pending(request_id, prefix)
    chosen = await choose(router, replicas, request)
    request.future.set_result(chosen)
    router.on_send_request(chosen)
    return chosen


def test_a_sent_request_counts_once_in_its_replicas_queue() -> None:
    async def scenario() -> None:
        router, replicas = new_router(threshold=4)
        hot_replica = await send(router, replicas, "a0", HOT)
        for i in range(1, 4):   # the same prompt: stays on its replica, 3 sent and not yet accepted
            assert await send(router, replicas, f"a{i}", HOT) == hot_replica
        # 4 ongoing against 0: within the threshold, so a fifth copy goes where its prefix is
        # cached (counting each sent request twice, from the send and from the choice, read 8)
        assert await send(router, replicas, "a4", HOT) == hot_replica
        # the sixth would make it 5 against 0: past the threshold, the idle replica gets it
        assert await send(router, replicas, "a5", HOT) != hot_replica

    asyncio.run(scenario())


def test_a_request_leaves_the_queue_when_serve_reports_it_complete() -> None:
    async def scenario() -> None:
        router, replicas = new_router(threshold=1)
        hot_replica = await send(router, replicas, "a0", HOT)
        router.on_new_queue_len_info(hot_replica, 1)   # the replica accepted it
        router.on_request_routed(pending("a0", HOT), hot_replica, None)
        assert await send(router, replicas, "a1", HOT) == hot_replica   # 1 against 0
        assert await send(router, replicas, "a2", HOT) != hot_replica   # 2 against 0: past 1
        for request_id in ("a0", "a1"):
            router.on_request_completed(hot_replica, request_id)
            router.decrement_queue_len_cache(hot_replica)
        assert await send(router, replicas, "a3", HOT) == hot_replica   # 0 against 1

    asyncio.run(scenario())


def test_a_stale_queue_length_in_serves_cache_does_not_make_an_idle_replica_look_busy() -> None:
    """Serve's cache still says replica 0 holds 3 requests (its figure from a burst that ended), this
    router has seen every one of them complete: two unrelated prompts go to both replicas."""
    async def scenario() -> None:
        router, replicas = new_router(threshold=10)
        for i in range(3):
            request = pending(f"old{i}", (b"old",))
            router.on_request_routed(request, replicas[0].replica_id, None)
        router.on_new_queue_len_info(replicas[0].replica_id, 3)
        for i in range(3):
            router.on_request_completed(replicas[0].replica_id, f"old{i}")
        assert router.replica_queue_len_cache.get(replicas[0].replica_id) == 3
        first = await send(router, replicas, "b0", (b"q1", b"q2"))
        second = await send(router, replicas, "b1", (b"r1", b"r2"))
        assert {first, second} == {replicas[0].replica_id, replicas[1].replica_id}

    asyncio.run(scenario())


def test_ongoing_requests_follow_serve_and_forget_cancelled_ones() -> None:
    ongoing = OngoingRequests()
    cancelled = {"x": False, "y": False}
    assert ongoing.chosen("x", "r0", lambda: cancelled["x"]) is None
    assert ongoing.chosen("y", "r0", lambda: cancelled["y"]) is None
    assert ongoing.chosen("y", "r0", lambda: cancelled["y"]) == "r0"   # Serve asked again
    assert (ongoing.count("r0"), ongoing.count("r1")) == (2, 0)
    assert ongoing.routed("y", "r1") == "r0" and ongoing.routed("y", "r1") is None   # the first choice was full
    assert (ongoing.count("r0"), ongoing.count("r1")) == (1, 1)
    cancelled["x"] = True   # the client went away before Serve sent it: Serve reports nothing
    assert ongoing.count("r0") == 0 and len(ongoing) == 1
    ongoing.completed("y")
    ongoing.completed("y")   # reported once per attempt; a second report changes nothing
    assert ongoing.count("r1") == 0 and len(ongoing) == 0
