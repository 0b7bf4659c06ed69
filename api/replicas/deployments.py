"""The two Serve deployments of `--data-parallel-size N`: `EngineReplica` (N of them) and `Ingress` (one).

`EngineReplica`: one engine (model, KV cache, engine thread) and the app of `api/app.py` around it,
driven in-process by `asgi_call.call_app`; every response carries `x-structserve-replica: <rank>`.
A request for a stored response of another rank (the router sent it here because its owner is
down) gets 503 `replica_unavailable`, as the owner's replacement reopens the owner's store,
unless the store is shared (PostgreSQL), where any replica answers it.
It reports its rank and loaded adapters to the router (`record_routing_stats`) and fails Serve's
health check once its engine thread is gone, so Serve replaces it; the replacement takes the same
rank and opens the same responses store.

`Ingress`: Serve's HTTP proxy hands it every request; it forwards each to an engine replica chosen by
`StructserveRequestRouter` and streams the answer back. /health and /metrics are its own: they ask
every replica (`target_rank`) and answer 200 only while each replica does, / merge the replicas'
metrics with a `replica` label (`x-structserve-replica` then lists the ranks that answered). A replica that dies before or while answering gives the client a
503 `replica_unavailable` in the route's error shape (an SSE stream already started ends with that
error as its last event).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import AsyncIterator

from ray import serve
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from api.config import ServerConfig
from api.errors import ReplicaUnavailable
from api.http.errors import error_response, is_anthropic_route
from api.protocol.common import ErrorInfo, ErrorResponse
from api.replicas.asgi_call import ResponseStart, call_app
from api.replicas.forwarded import ForwardedRequest, RoutingFacts, routing_facts
from api.replicas.lora_broadcast import ReplicaAnswer, combine, is_lora_broadcast, rollback_request
from api.replicas.metrics_merge import merge_metrics
from api.replicas.response_owner import replica_responses_db, response_id_prefix
from engine import EngineConfig

logger = logging.getLogger(__name__)

REPLICA_HEADER = b"x-structserve-replica"
PID_HEADER = b"x-structserve-replica-pid"   # only on the ingress's fan-out requests, never to clients
FAN_OUT_TIMEOUT_S = 5.0   # how long /health and /metrics wait for one replica's answer
LORA_TIMEOUT_S = 300.0    # how long a run-time LoRA load or unload waits for one replica's answer


@serve.deployment
class EngineReplica:
    """One engine and its app; `forward` answers one `ForwardedRequest` as a stream of parts."""

    async def __init__(self, engine_config: EngineConfig, server_config: ServerConfig) -> None:
        from api.app import create_app
        from engine import AsyncEngine   # torch and the model code, in the replica's process only

        context = serve.get_replica_context()
        self._rank, self._num_replicas = context.rank.rank, context.world_size
        self._engine = await asyncio.to_thread(AsyncEngine.start, engine_config)
        self._config = dataclasses.replace(
            server_config, responses_db=replica_responses_db(server_config.responses_db, self._rank),
            response_id_prefix=response_id_prefix(self._rank),
            # replicas share the endpoint's host:port: each owns its background responses by rank
            server_name=f"{server_config.server_name or f'{socket.gethostname()}:{server_config.port}'}/replica-{self._rank}")
        self._app = create_app(self._engine, self._config)
        self._replica_header = (REPLICA_HEADER, str(self._rank).encode())
        self._shared_store = "://" in self._config.responses_db   # PostgreSQL: every replica reads every response
        logger.info("engine replica %d ready (pid %d)", self._rank, os.getpid())

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        """The app's answer to `request`: a `ResponseStart`, then its body chunks."""
        extra = (self._replica_header,)
        if request.facts.target_rank is not None:
            if request.facts.target_rank != self._rank:   # that rank is down: Serve routed it here instead
                yield ResponseStart(503, extra)
                return
            extra += ((PID_HEADER, str(os.getpid()).encode()),)
        owner = request.facts.owner_rank
        if owner is not None and owner != self._rank and owner < self._num_replicas and not self._shared_store:
            # the owner is down (the router sends its requests to it while it lives): its
            # replacement reopens its store, so this is a retry-later, not a 404
            response = error_response(
                ReplicaUnavailable(f"engine replica {owner}, which holds this response, is restarting; retry"),
                headers={"Retry-After": "1"}, path=request.path)
            yield ResponseStart(response.status_code, tuple(response.raw_headers) + extra)
            yield bytes(response.body)
            return
        async for part in call_app(self._app, request, extra):
            yield part

    async def record_routing_stats(self) -> dict[str, object]:
        """What the router needs from this replica: its rank and the names of its loaded adapters."""
        adapters = self._engine.lora_adapters() if self._engine.lora_enabled else []
        return {"rank": self._rank, "adapters": sorted(adapter.name for adapter in adapters)}

    async def check_health(self) -> None:
        """Serve's health check: raises RuntimeError once the engine thread has stopped."""
        if not self._engine.is_healthy():
            raise RuntimeError(f"engine replica {self._rank}: the engine thread has stopped")

    async def __del__(self) -> None:
        """Serve's graceful stop: Serve has already let ongoing requests finish; cancel the
        background responses, close the store, stop the engine thread."""
        from api.http.shutdown import drain

        try:
            await drain(self._app.state.drain, self._app.state.responses.background, self._engine,
                        self._config.shutdown_grace_s)
            await self._app.state.responses.close()
        finally:
            self._engine.shutdown()


@serve.deployment
class Ingress:
    """Forwards every HTTP request to an engine replica; answers /health and /metrics from all of
    them, and sends run-time LoRA loads and unloads to all of them (`lora_broadcast.py`)."""

    def __init__(self, engines: DeploymentHandle, num_replicas: int) -> None:
        self._engines = engines.options(stream=True)
        self._num_replicas = num_replicas

    async def __call__(self, request: Request) -> Response:
        """Serve's HTTP entry point."""
        body = await request.body()
        forwarded = ForwardedRequest(
            method=request.method, path=request.url.path, query_string=request.scope.get("query_string", b""),
            headers=tuple((bytes(k), bytes(v)) for k, v in request.scope["headers"]), body=body,
            facts=routing_facts(request.method, request.url.path, body))
        if request.method == "GET" and forwarded.path == "/health":
            return await self._health(forwarded)
        if request.method == "GET" and forwarded.path == "/metrics":
            return await self._metrics(forwarded)
        if is_lora_broadcast(request.method, forwarded.path):
            return await self._broadcast(forwarded)
        return await self._forward(forwarded)

    async def _forward(self, forwarded: ForwardedRequest) -> Response:
        stream = self._engines.forward.remote(forwarded)
        try:
            start = await stream.__anext__()
        except (RayError, StopAsyncIteration) as exc:
            stream.cancel()
            return _unavailable(forwarded.path, exc)
        except asyncio.CancelledError:   # the client went away before the answer started
            stream.cancel()
            raise
        assert isinstance(start, ResponseStart), "EngineReplica.forward yields its ResponseStart first"
        response = StreamingResponse(_body(stream, forwarded.path, start), status_code=start.status)
        response.raw_headers = list(start.headers)
        return response

    async def _fan_out(self, forwarded: ForwardedRequest,
                       timeout_s: float = FAN_OUT_TIMEOUT_S) -> list[ReplicaAnswer | None]:
        """Each replica's answer to `forwarded`, by rank (None: it did not answer within `timeout_s`).

        One replica after the other: handle calls made while serving one HTTP request share its
        Serve internal request id, and Serve's router matches a chosen replica to its pending
        request by that id, so concurrent calls from one request would be assigned only once."""
        answers = []
        for rank in range(self._num_replicas):
            targeted = dataclasses.replace(forwarded, facts=RoutingFacts(target_rank=rank))
            answers.append(await self._collect(targeted, timeout_s))
        return answers

    async def _collect(self, forwarded: ForwardedRequest, timeout_s: float) -> ReplicaAnswer | None:
        """The targeted replica's whole answer; None when it did not answer in time or another
        replica did (no live replica has that rank: it died and its replacement is not up yet)."""
        stream = self._engines.forward.remote(forwarded)
        try:
            start, body = await asyncio.wait_for(_whole(stream), timeout_s)
        except (RayError, asyncio.TimeoutError, StopAsyncIteration):
            stream.cancel()
            return None
        if _header(start.headers, REPLICA_HEADER) != str(forwarded.facts.target_rank):
            return None
        return ReplicaAnswer(start.status, start.headers, body)

    async def _broadcast(self, forwarded: ForwardedRequest) -> Response:
        """A run-time LoRA load or unload on every replica, answered as one (`lora_broadcast.combine`)."""
        answers = await self._fan_out(forwarded, LORA_TIMEOUT_S)
        outcome = combine(forwarded.path, forwarded.body, answers)
        for rank in outcome.rollback:
            undone = await self._collect(rollback_request(forwarded, rank), LORA_TIMEOUT_S)
            if undone is None or undone.status != 200:
                logger.warning("engine replica %d: undoing the partial LoRA load failed (%s)", rank,
                               "no answer" if undone is None else undone.status)
        if outcome.answer is None:
            message = (f"engine replicas {list(outcome.missing)} did not answer the LoRA update; retry once "
                       "/health is 200 (a load is undone on the replicas that made it)")
            return error_response(ReplicaUnavailable(message), headers={"Retry-After": "1"}, path=forwarded.path)
        headers = _str_headers(outcome.answer.headers)
        if outcome.answer.status == 200:   # the header names every replica the change was made on
            headers[REPLICA_HEADER.decode()] = _ranks(answers)
        return Response(outcome.answer.body, status_code=outcome.answer.status, headers=headers)

    async def _health(self, forwarded: ForwardedRequest) -> Response:
        answers = await self._fan_out(forwarded)
        down = [rank for rank, answer in enumerate(answers) if answer is None or answer.status != 200]
        if not down:
            return Response(status_code=200, headers={REPLICA_HEADER.decode(): _ranks(answers)})
        body = ErrorResponse(error=ErrorInfo(message=f"engine replicas not healthy: {down}", type="server_error",
                                             code="engine_dead"))
        return JSONResponse(body.model_dump(), status_code=503, headers={REPLICA_HEADER.decode(): _ranks(answers)})

    async def _metrics(self, forwarded: ForwardedRequest) -> Response:
        answers = await self._fan_out(forwarded)
        refused = next((a for a in answers if a is not None and a.status != 200), None)
        if refused is not None:   # 401 with --protect-metrics: every replica answers alike
            return Response(refused.body, status_code=refused.status, headers=_str_headers(refused.headers))
        texts = {rank: (answer.body.decode("utf-8"), _header(answer.headers, PID_HEADER))
                 for rank, answer in enumerate(answers) if answer is not None}
        return Response(merge_metrics(texts), media_type="text/plain; version=0.0.4; charset=utf-8",
                        headers={REPLICA_HEADER.decode(): _ranks(answers)})


async def _whole(stream: DeploymentResponseGenerator) -> tuple[ResponseStart, bytes]:
    start = await stream.__anext__()
    assert isinstance(start, ResponseStart)
    return start, b"".join([chunk async for chunk in stream])


async def _body(stream: DeploymentResponseGenerator, path: str, start: ResponseStart) -> AsyncIterator[bytes]:
    """The replica's body chunks; if the replica dies mid-answer, an SSE stream gets a 503 error
    event as its last event (a whole answer is one chunk, so it cannot be cut this way)."""
    try:
        async for chunk in stream:
            yield chunk
    except RayError as exc:
        logger.warning("engine replica %s died while streaming %s: %s", _header(start.headers, REPLICA_HEADER),
                       path, exc)
        if _header(start.headers, b"content-type").startswith("text/event-stream"):
            yield _sse_error(path)
    finally:
        stream.cancel()   # the client went away (or the stream ended): the replica's app sees a disconnect


def _unavailable(path: str, exc: BaseException) -> Response:
    logger.warning("no engine replica answered %s: %s", path, exc)
    return error_response(ReplicaUnavailable(_unavailable_message()), headers={"Retry-After": "1"}, path=path)


def _unavailable_message() -> str:
    return "the engine replica serving this request stopped; retry (other replicas keep serving)"


def _sse_error(path: str) -> bytes:
    response = error_response(ReplicaUnavailable(_unavailable_message()), path=path)
    if is_anthropic_route(path):
        return b"event: error\ndata: " + bytes(response.body) + b"\n\n"
    return b"data: " + bytes(response.body) + b"\n\n"


def _ranks(answers: list[ReplicaAnswer | None]) -> str:
    """The ranks that answered 200, as the ingress's own answers name them: "0,1"."""
    return ",".join(str(rank) for rank, answer in enumerate(answers) if answer is not None and answer.status == 200)


def _header(headers: tuple[tuple[bytes, bytes], ...], name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in headers if k.lower() == name), "")


def _str_headers(headers: tuple[tuple[bytes, bytes], ...]) -> dict[str, str]:
    skip = (b"content-length", PID_HEADER)
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k.lower() not in skip}
