"""Model tests run torch on one thread: on a shared 2-core box, OpenMP barriers make the many tiny
matmuls of these models tens of times slower with two threads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
