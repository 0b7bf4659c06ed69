"""engine/threads.py: a fresh process gets one torch thread per usable core (its affinity mask),
an explicit count wins, and a count below 1 is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.threads import available_cores, configure_threads

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, sys, torch
cores = {cores}
if cores is not None:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
from engine.threads import configure_threads
print(configure_threads(None), torch.get_num_threads(), len(os.sched_getaffinity(0)))
"""


def fresh_process_threads(cores: int | None) -> list[int]:
    """(configure_threads' answer, torch's thread count, usable cores) in a new interpreter whose
    affinity is cut to `cores` cores first (None: left as inherited)."""
    out = subprocess.run([sys.executable, "-c", CHILD.format(cores=cores)], cwd=ROOT, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return [int(value) for value in out.stdout.split()]


def test_fresh_process_uses_every_usable_core() -> None:
    cores = len(os.sched_getaffinity(0))
    assert fresh_process_threads(None) == [cores, cores, cores]
    assert fresh_process_threads(1) == [1, 1, 1]


def test_explicit_count_wins_and_bad_counts_fail() -> None:
    previous = torch.get_num_threads()
    try:
        assert configure_threads(1) == 1 and torch.get_num_threads() == 1
        assert configure_threads(None) == available_cores() == torch.get_num_threads()
        with pytest.raises(ValueError, match="num_threads must be >= 1"):
            configure_threads(0)
    finally:
        torch.set_num_threads(previous)


RELEASE_CHILD = """
import os, time, torch
from engine.threads import _loaded_openmp_library, release_openmp_threads
torch.set_num_threads(2)
x = torch.randn(1 << 22)
def tasks():
    return len(os.listdir("/proc/self/task"))
before = tasks()
expected = x.add(1)           # a parallel region: this thread gets a pool with one worker
with_pool = tasks()
released = release_openmp_threads()
deadline = time.monotonic() + 10
while tasks() >= with_pool and time.monotonic() < deadline:
    time.sleep(0.01)
after = tasks()
again = torch.equal(x.add(1), expected)   # the runtime builds a new pool for the next region
print(_loaded_openmp_library() is not None, released, before, with_pool, after, again)
"""


def test_release_frees_the_calling_threads_openmp_workers() -> None:
    """After a parallel region the calling thread holds an OpenMP worker; releasing ends that
    worker's OS thread (so it no longer counts against the engine thread's pool), and the next
    region still runs and gives the same result. Without an OpenMP runtime the call says so."""
    out = subprocess.run([sys.executable, "-c", RELEASE_CHILD], cwd=ROOT, check=True, capture_output=True,
                         text=True, timeout=120).stdout.split()
    has_runtime, released, before, with_pool, after, again = out
    assert again == "True"
    if has_runtime == "False":
        assert released == "False"
        return
    assert released == "True"
    assert int(with_pool) > int(before) and int(after) < int(with_pool), (before, with_pool, after)
