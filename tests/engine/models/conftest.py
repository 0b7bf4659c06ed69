"""Model tests run torch on one thread: on a shared 2-core box, OpenMP barriers make the many tiny
matmuls of these models tens of times slower with two threads."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every parity test here runs on one torch thread (tests/conftest.py)."""
