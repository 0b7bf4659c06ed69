"""Start `--data-parallel-size N` on Ray Serve, serve until SIGTERM / SIGINT, then stop everything.

`ray.init()` starts a local Ray instance unless `ray_address` names a cluster to join (`ray start
--head` on the first host, `ray start --address HEAD:6379` on the others). Serve's HTTP proxy runs
on the head node only and listens on --host/--port; the Ingress deployment forwards to N
`EngineReplica`s routed by `StructserveRequestRouter` (or, with `router="default"`, by Serve's own
power-of-two-choices router, for comparison). CPU threads are divided between the replicas: each
gets `num_threads` when set, else the cores this process may use divided by N (at least one), and
reserves as many Ray CPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path

from api.config import ServerConfig
from api.replicas.replica_choice import DEFAULT_IMBALANCE_THRESHOLD
from engine import EngineConfig

logger = logging.getLogger(__name__)

APP_NAME = "structserve"
ROUTING_STATS_PERIOD_S = 1.0    # how often each replica reports its rank and adapters to the router
HEALTH_CHECK_PERIOD_S = 2.0     # how often Serve checks each replica (a dead engine thread fails it)
OBJECT_STORE_BYTES = 256 * 2**20   # local instance: requests and answers are small, pass by value
_ROOT = Path(__file__).resolve().parents[2]   # the folder holding api/, engine/, ...: workers import from it


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicasConfig:
    """num_replicas (>= 2); ray_address (None: a local Ray instance); router: "structserve" (ours) or
    "default" (Serve's power of two choices); imbalance_threshold: ongoing requests by which the
    preferred replica may exceed the least loaded one before the least loaded gets the request."""

    num_replicas: int
    ray_address: str | None = None
    router: str = "structserve"
    imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD

    def __post_init__(self) -> None:
        if self.num_replicas < 2:
            raise ValueError(f"Ray Serve replicas are for --data-parallel-size 2 or more, not {self.num_replicas}")
        if self.router not in ("structserve", "default"):
            raise ValueError(f"--request-router must be structserve or default, not {self.router!r}")
        if self.imbalance_threshold < 0:
            raise ValueError(f"--router-imbalance-threshold must be >= 0, not {self.imbalance_threshold}")


def replica_threads(engine_config: EngineConfig, num_replicas: int) -> int:
    """torch threads of one replica: `num_threads` when set, else this process's cores // N (>= 1)."""
    if engine_config.num_threads:
        return engine_config.num_threads
    return max(1, len(os.sched_getaffinity(0)) // num_replicas)


def serve_replicas(engine_config: EngineConfig, server_config: ServerConfig, replicas: ReplicasConfig) -> None:
    """Run the Serve application until SIGTERM / SIGINT; then shut Serve and Ray down (replicas
    drain for `shutdown_grace_s`). Blocks."""
    import ray
    from ray import serve

    threads = replica_threads(engine_config, replicas.num_replicas)
    engine_config = dataclasses.replace(engine_config, num_threads=threads)
    started = time.monotonic()
    _init_ray(replicas, threads)
    # after ray.init, which installs its own SIGTERM handlers (a sys.exit, and a C++ crash reporter
    # that ends the process with SIGABRT): Serve must be shut down from here, or on a joined
    # cluster the application outlives this process
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": server_config.host, "port": server_config.port,
                                  "keep_alive_timeout_s": math.ceil(server_config.keep_alive_s)},
                    proxy_location="HeadOnly")
        serve.run(_application(engine_config, server_config, replicas, threads), name=APP_NAME, route_prefix="/")
        logger.info("serving %d engine replicas (%d threads each) on http://%s:%d, ready in %.1f s",
                    replicas.num_replicas, threads, server_config.host, server_config.port,
                    time.monotonic() - started)
        stop.wait()
        logger.info("stopping: engine replicas drain for up to %g s", server_config.shutdown_grace_s)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _init_ray(replicas: ReplicasConfig, threads: int) -> None:
    import ray

    runtime_env = {"env_vars": {"PYTHONPATH": str(_ROOT)}}
    if replicas.ray_address is not None:
        ray.init(address=replicas.ray_address, runtime_env=runtime_env)
        return
    num_cpus = max(len(os.sched_getaffinity(0)), replicas.num_replicas * threads)
    # "local": a new instance even when `ray start` runs a cluster on this host (ray.init() without
    # an address would join the one named in RAY_ADDRESS or /tmp/ray/ray_current_cluster)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
             runtime_env=runtime_env)


def _application(engine_config: EngineConfig, server_config: ServerConfig, replicas: ReplicasConfig,
                 threads: int):   # -> ray.serve.Application
    from ray.serve.config import RequestRouterConfig

    from api.replicas.deployments import EngineReplica, Ingress
    from api.replicas.request_router import StructserveRequestRouter

    router_config = RequestRouterConfig(request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
                                        request_routing_stats_timeout_s=5.0)
    if replicas.router == "structserve":
        router_config = RequestRouterConfig(
            request_router_class=StructserveRequestRouter,
            request_router_kwargs={"imbalance_threshold": replicas.imbalance_threshold},
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S, request_routing_stats_timeout_s=5.0)
    engines = EngineReplica.options(
        num_replicas=replicas.num_replicas, ray_actor_options={"num_cpus": threads},
        max_ongoing_requests=engine_config.max_num_seqs + engine_config.max_waiting_requests,
        graceful_shutdown_timeout_s=server_config.shutdown_grace_s + 5.0,
        health_check_period_s=HEALTH_CHECK_PERIOD_S, request_router_config=router_config,
    ).bind(engine_config, server_config)
    return Ingress.options(num_replicas=1, ray_actor_options={"num_cpus": 0},
                           max_ongoing_requests=100_000).bind(engines, replicas.num_replicas)
