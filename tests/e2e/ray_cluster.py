"""A real Ray cluster of several nodes on this one machine, for `--ray-address` tests.

Each node is `ray start ... --block` (the README's recipe, a head and then `--address HEAD`), in
its own process, with its own raylet and its own CPUs, on loopback. `ray start --block` makes
every Ray process of its node share its fate (the kernel's parent-death signal), and the process
itself is started by `benchmarks/server_process.spawn`, so it dies with the test run however that
ends: a killed pytest leaves no Ray process behind. Ray 2.60 authenticates every connection to a
cluster with a token (`RAY_AUTH_MODE=token`): the cluster has its own, and `env` hands it to the
nodes and to whatever joins (`structserve serve --ray-address`). The cluster keeps its files in its own
`--temp-dir`, so it never becomes /tmp/ray's "current cluster" that a plain `ray.init()` (another
process on this machine) would join. `ray stop` is never used: it stops every Ray instance on the
machine, other processes' too.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.server_process import free_port, spawn

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 80 * 2**20   # Ray's minimum is 75 MiB; requests and answers are small


@dataclass
class RayCluster:
    """A running cluster: `address` (HEAD:PORT for `--ray-address`), its temp dir, `env` (the
    variables a process needs to join it: its auth token) and its node processes (the `ray start
    --block` of each node, head first)."""

    address: str
    temp_dir: Path
    env: dict[str, str]
    nodes: list[subprocess.Popen] = field(default_factory=list)

    def processes(self) -> set[int]:
        """PIDs of every live process under the node processes (raylets, GCS, workers, ...)."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        found: set[int] = set()
        todo = [node.pid for node in self.nodes if node.poll() is None]
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo.extend(children.get(pid, ()))
        return found

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every node (their Ray processes follow), wait, SIGKILL any left; remove the temp dir."""
        left = self.processes()
        for node in reversed(self.nodes):
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            try:
                node.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        while (alive := {pid for pid in left if is_alive(pid)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def is_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def start_cluster(num_cpus_per_node: tuple[int, ...], log_dir: Path, timeout_s: float = 120.0) -> RayCluster:
    """Start a head node and one more node per further entry, each with that many CPUs, one after
    the other, each once the one before has started; logs go to `log_dir`. Raises RuntimeError
    (the cluster stopped) when a node exits or does not start within `timeout_s`."""
    port = free_port()
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    token_path = temp_dir / "auth_token"
    token_path.write_text(secrets.token_hex(32))
    token_path.chmod(0o600)
    cluster = RayCluster(f"127.0.0.1:{port}", temp_dir,
                         {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)})
    env = {**os.environ, **cluster.env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    try:
        for i, num_cpus in enumerate(num_cpus_per_node):
            role = ["--head", "--port", str(port), "--temp-dir", str(cluster.temp_dir), "--include-dashboard",
                    "false", "--ray-client-server-port", str(free_port())] if i == 0 else ["--address", cluster.address]
            cmd = [RAY, "start", "--block", *role, "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus),
                   "--object-store-memory", str(OBJECT_STORE_BYTES),
                   "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats"]
            log_path = log_dir / f"ray-node-{i}.log"
            with open(log_path, "w") as log:
                cluster.nodes.append(spawn(cmd, log, env))
            _wait_for_node(cluster, log_path, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for_node(cluster: RayCluster, log_path: Path, timeout_s: float) -> None:
    """Wait until the last node's `ray start` reports its node started (its raylet has joined)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.nodes[-1].poll() is not None:
            raise RuntimeError(f"ray node exited {cluster.nodes[-1].poll()}:\n{log_path.read_text()[-3000:]}")
        if "Ray runtime started" in log_path.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"ray node not up in {timeout_s} s:\n{log_path.read_text()[-3000:]}")
