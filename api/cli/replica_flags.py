"""`--data-parallel-size N` and the Ray Serve flags that go with it (`api/replicas/`).

Ray is imported only when N > 1: the single server never imports it.
"""

from __future__ import annotations

import argparse

from api.config import ServerConfig
from api.replicas.replica_choice import DEFAULT_IMBALANCE_THRESHOLD
from engine import EngineConfig


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --data-parallel-size, --ray-address, --request-router, --router-imbalance-threshold."""
    parser.add_argument(
        "--data-parallel-size", type=_positive, default=1,
        help="engine replicas (one model, KV cache and engine thread each) behind one endpoint on Ray Serve; "
             "1 = this process alone, without Ray",
    )
    parser.add_argument(
        "--ray-address", default=None,
        help="join this Ray cluster (e.g. HEAD:6379 after `ray start --head`) instead of starting a local one",
    )
    parser.add_argument(
        "--request-router", choices=["structserve", "default"], default="structserve",
        help="replica choice: structserve = owner of a stored response, then cached prefix, then resident "
             "adapter, then least loaded; default = Serve's power of two choices (for comparison)",
    )
    parser.add_argument(
        "--router-imbalance-threshold", type=int, default=DEFAULT_IMBALANCE_THRESHOLD,
        help="ongoing requests by which the preferred replica may exceed the least loaded one before the "
             "least loaded one gets the request",
    )


def serve_on_replicas(args: argparse.Namespace, engine_config: EngineConfig, server_config: ServerConfig) -> None:
    """Serve `args.data_parallel_size` (> 1) replicas on Ray Serve until SIGTERM / SIGINT (blocks).
    Raises ValueError for a bad replica flag, or when Ray Serve is not installed."""
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        raise ValueError("--data-parallel-size > 1 needs Ray Serve: pip install 'structserve[ray]' "
                         f"(ray[serve]==2.60.0): {exc}") from None
    from api.replicas.launch import ReplicasConfig, serve_replicas

    replicas = ReplicasConfig(num_replicas=args.data_parallel_size, ray_address=args.ray_address,
                              router=args.request_router, imbalance_threshold=args.router_imbalance_threshold)
    serve_replicas(engine_config, server_config, replicas)
