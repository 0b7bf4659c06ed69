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
