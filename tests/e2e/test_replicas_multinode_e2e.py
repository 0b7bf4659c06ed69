"""Issue 16 item 1, several hosts: `--ray-address` joins an existing Ray cluster (README, "More than
one engine": `ray start --head`, `ray start --address HEAD`, then `structserve serve
--data-parallel-size N --ray-address HEAD`).

The cluster is two real Ray nodes on this machine (`ray_cluster.py`: two raylets, one CPU each), so
Serve must place one engine replica on each node (a replica reserves its torch thread as one Ray
CPU). Requests are served by both; stopping the server removes its Serve application from the
cluster and leaves the cluster up (it belongs to whoever started it); stopping the cluster leaves
no Ray process behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import MODEL, start_server, stop_server
from tests.e2e.ray_cluster import is_alive, start_cluster
from tests.e2e.replicas_support import chat_on_both, replica_pids

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_ray_address_places_replicas_on_both_nodes_of_an_existing_cluster(tmp_path) -> None:
    cluster = start_cluster((1, 1), tmp_path)
    try:
        server = start_server(tmp_path, "--data-parallel-size", "2", "--ray-address", cluster.address,
                              threads=1, timeout_s=480, env=cluster.env)
        try:
            pids = replica_pids(server)
            assert set(pids) == {"0", "1"}
            # a replica is a worker of its node's raylet, the child of that node's `ray start`
            nodes = {rank: parent(parent(pid)) for rank, pid in pids.items()}
            assert sorted(nodes.values()) == sorted(node.pid for node in cluster.nodes), nodes
            assert chat_on_both(server, MODEL) == {"0": 200, "1": 200}
        finally:
            stop_server(server)
        assert server.proc.returncode == 0, server.log()[-3000:]
        assert not any(is_alive(pid) for pid in pids.values())   # Serve stopped the replicas it started
        assert all(node.poll() is None for node in cluster.nodes)   # the cluster is not the server's
        ray_processes = cluster.processes()
        assert len(ray_processes) >= 6
    finally:
        cluster.stop()
    assert not any(is_alive(pid) for pid in ray_processes)

