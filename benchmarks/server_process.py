"""`python -m api.cli serve` in a child process on a free loopback port, healthy: the one helper
the e2e tests (tests/e2e/conftest.py) and the benchmarks start servers with.

A started server dies with the process that started it, however that process ends: each child
asks the kernel for SIGTERM when its parent goes (Linux `prctl(PR_SET_PDEATHSIG)`, so a SIGTERM
or SIGKILL to pytest or to a benchmark takes its servers down too), and an `atexit` hook stops
the ones still running at a normal exit. The death signal is tied to the thread that forked the
child, so every child is forked by one long-lived spawner thread, never by a short-lived worker.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1   # linux/prctl.h

# Forks every server (see the module docstring); its thread lives until the interpreter exits.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-spawner")
_LIVE: set[subprocess.Popen] = set()
COMPILE_STARTED = "compiling the decode step in the background"   # engine/compiled_decode.py's log lines
COMPILE_READY = "compiled decode step ready"
COMPILE_UNAVAILABLE = "compiled decode step unavailable"
_LIVE_LOCK = threading.Lock()


@dataclass
class ServerProcess:
    """A running server: base URL (no /v1), its process and its log file (None: output dropped)."""

    url: str
    proc: subprocess.Popen
    log_path: Path | None = None

    def log(self) -> str:
        """The server's output so far ("" when it is not logged)."""
        return self.log_path.read_text(errors="replace") if self.log_path is not None else ""

    def compiling(self) -> bool:
        """Whether the server started a background decode-step compile (logged before /health
        answers; a server of an older checkout, or `--no-compile`, logs none). Needs a logged server."""
        return COMPILE_STARTED in self.log()

    def wait_for_compile(self, timeout_s: float = 900.0) -> str:
        """Block until the server logs the outcome of its background decode-step compile and
        return that log line ("compiled decode step ready in N s ..." or "... unavailable ...").
        Compiling takes the cores for a minute or more; requests meanwhile run eager and slowly.
        Returns "" at once for a server that started no compile (`compiling`: `--no-compile`, an
        older checkout). Needs a logged server. Raises RuntimeError if the server exits or
        `timeout_s` passes."""
        if not self.compiling():
            return ""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.log().splitlines():
                if COMPILE_READY in line or COMPILE_UNAVAILABLE in line:
                    return line
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no compile outcome (exit {self.proc.poll()}):\n{self.log()[-4000:]}")
            time.sleep(1.0)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], log_path: Path | None = None, env: dict[str, str] | None = None,
                 timeout_s: float = 240.0, poll_s: float = 0.2, port: int | None = None,
                 cwd: Path = ROOT) -> ServerProcess:
    """Start `python -m api.cli serve --host 127.0.0.1 --port PORT *args` in the repository root (or
    `cwd`, another checkout of it, for before/after benchmarks) and wait until GET /health answers
    200 (polled every `poll_s` seconds).

    Output goes to `log_path` (None: dropped). `env` is added to this process's environment.
    Raises RuntimeError (with the log's tail) when the server exits first or is not healthy
    within `timeout_s` seconds (it is killed then).
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    log = open(log_path, "w") if log_path is not None else subprocess.DEVNULL
    try:
        proc = _SPAWNER.submit(_spawn, cmd, log, {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}, cwd).result()
    finally:
        if log_path is not None:
            log.close()   # the child holds its own copy
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _forget(proc)
            raise RuntimeError(f"server exited {proc.returncode}:\n{server.log()[-4000:]}")
        if _healthy(server.url):
            return server
        time.sleep(poll_s)
    proc.kill()
    proc.wait()
    _forget(proc)
    raise RuntimeError(f"server not healthy in {timeout_s}s:\n{server.log()[-4000:]}")


def stop_servers(*servers: ServerProcess, timeout_s: float = 30.0) -> None:
    """SIGTERM the servers (all at once: each takes a few seconds to drain and exit), wait for
    each, kill any still running after `timeout_s` seconds."""
    for server in servers:
        server.proc.terminate()
    for server in servers:
        try:
            server.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
        _forget(server.proc)


def spawn(cmd: list[str], log: object, env: dict[str, str], cwd: Path = ROOT,
          death_signal: int = signal.SIGTERM, user: str | None = None) -> subprocess.Popen:
    """Start `cmd` (output to the file object `log`) so that it gets `death_signal` when this
    process ends, however it ends (see the module docstring), running as `user` when given (the
    caller must be root; e.g. PostgreSQL refuses to run as root). Stopped at exit if still running."""
    return _SPAWNER.submit(_spawn, cmd, log, env, cwd, death_signal, user).result()


def _spawn(cmd: list[str], log: object, env: dict[str, str], cwd: Path = ROOT,
           death_signal: int = signal.SIGTERM, user: str | None = None) -> subprocess.Popen:
    parent = os.getpid()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=lambda: _die_with_parent(parent, death_signal, user))
    with _LIVE_LOCK:
        _LIVE.add(proc)
    return proc


def _die_with_parent(parent: int, death_signal: int = signal.SIGTERM, user: str | None = None) -> None:
    """In the child before exec: become `user` if given (before the death signal: changing
    credentials clears it), ask for `death_signal` when the forking thread's process ends; exit at
    once if it has already ended (it did between fork and this call)."""
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        os.initgroups(user, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _forget(proc: subprocess.Popen) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(proc)


@atexit.register
def _stop_live_servers() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    stop_servers(*(ServerProcess("", proc) for proc in live), timeout_s=10.0)
