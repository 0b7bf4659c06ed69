"""A throwaway PostgreSQL server for the tests (tests/conftest.py `postgres`) and benchmarks:
`initdb` in a temporary folder, `postgres` on a free loopback port, dying with the process that
started it (started through `benchmarks/server_process.spawn`, so PR_SET_PDEATHSIG sends it
SIGINT, PostgreSQL's fast shutdown, even when pytest is killed).

The binaries come from Debian's `postgresql` package (`/usr/lib/postgresql/<version>/bin`, which
`make test` installs when missing) or from `pg_config --bindir`. PostgreSQL refuses to run as
root, so as root the cluster runs as the `postgres` user that package creates.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.server_process import free_port, spawn

USER = "structserve"   # the cluster's superuser (trust authentication on loopback only)


@dataclass
class PostgresServer:
    """A running cluster: its `postgres` process, data folder and a libpq URI of its `postgres`
    database (`url`); `new_database(name)` gives each test module its own database."""

    proc: subprocess.Popen
    data_dir: Path
    port: int
    bin_dir: Path

    @property
    def url(self) -> str:
        """The URI of the default `postgres` database."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        """The URI of `database` on this server."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        """Create database `name` (raises CalledProcessError if it exists); its URI."""
        subprocess.run([str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                        name], check=True, capture_output=True)
        return self.url_of(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions are ended), waiting up to 30 s, then SIGKILL."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def find_bin_dir() -> Path:
    """The folder of `initdb` and `postgres`: the newest /usr/lib/postgresql/*/bin, else
    `pg_config --bindir`. Raises RuntimeError naming the package to install."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        bin_dir = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (bin_dir / "initdb").exists():
            return bin_dir
    raise RuntimeError("PostgreSQL is not installed: apt-get install -y postgresql (make test does it)")


def start_postgres(timeout_s: float = 60.0) -> PostgresServer:
    """initdb a cluster in a new temporary folder (directly under the temp dir: pytest's own are
    root-only) and start it on a free 127.0.0.1 port; returns once it accepts connections.
    Raises RuntimeError with the server log when it does not start. `stop()` removes the folder."""
    bin_dir = find_bin_dir()
    user = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="structserve-pg-"))
    data_dir, log_path = folder / "data", folder / "postgres.log"
    if user is not None:
        shutil.chown(folder, user)
    initdb = [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", USER, "--auth=trust", "-E", "UTF8",
              "--no-sync", "--no-instructions"]
    with open(folder / "initdb.log", "w") as log:
        spawn(initdb, log, dict(os.environ), cwd=folder, user=user).wait()
    port = free_port()
    cmd = [str(bin_dir / "postgres"), "-D", str(data_dir), "-p", str(port),
           "-c", "listen_addresses=127.0.0.1",
           "-c", f"unix_socket_directories={folder}", "-c", "fsync=off", "-c", "synchronous_commit=off",
           "-c", "full_page_writes=off", "-c", "max_connections=50"]
    with open(log_path, "w") as log:
        proc = spawn(cmd, log, dict(os.environ), cwd=folder, death_signal=signal.SIGINT, user=user)
    server = PostgresServer(proc, data_dir, port, bin_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        ready = subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", USER],
                               capture_output=True)
        if ready.returncode == 0:
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"PostgreSQL did not start:\n{log_path.read_text()[-4000:]}")
