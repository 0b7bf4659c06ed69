"""`structserve serve` without --data-parallel-size never imports Ray (issue 16 item 1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.server_process import ROOT

_PROBE = """
import sys
from api.cli.serve import build_configs, build_parser
import api.app, api.http.shutdown
args = build_parser().parse_args(["serve"])
build_configs(args, {})
assert args.data_parallel_size == 1
print("ray" in sys.modules, any(name.startswith("ray.") for name in sys.modules))
"""


def test_the_single_server_path_imports_no_ray() -> None:
    result = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_the_replica_flags_parse_and_refuse_bad_values() -> None:
    from api.cli.serve import build_parser
    from api.replicas.launch import ReplicasConfig

    args = build_parser().parse_args(["serve", "--data-parallel-size", "2", "--ray-address", "head:6379",
                                      "--request-router", "default", "--router-imbalance-threshold", "8"])
    assert (args.data_parallel_size, args.ray_address, args.request_router, args.router_imbalance_threshold) == \
        (2, "head:6379", "default", 8)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--data-parallel-size", "0"])
    for kwargs in ({"num_replicas": 1}, {"num_replicas": 2, "router": "random"},
                   {"num_replicas": 2, "imbalance_threshold": -1}):
        with pytest.raises(ValueError):
            ReplicasConfig(**kwargs)


def test_cpu_threads_are_divided_between_the_replicas() -> None:
    from api.replicas.launch import replica_threads
    from engine import EngineConfig

    assert replica_threads(EngineConfig(num_threads=3), 2) == 3
    assert replica_threads(EngineConfig(), 2) == max(1, len(os.sched_getaffinity(0)) // 2)
    assert replica_threads(EngineConfig(), 1000) == 1
