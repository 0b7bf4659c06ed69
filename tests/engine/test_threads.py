"""engine/threads.py: the measured thread count is one of the candidates; an explicit count wins."""

from __future__ import annotations

import torch

from engine.threads import available_cores, configure_threads, measure_best_threads


def test_measure_returns_a_candidate_and_configure_sets_it() -> None:
    previous = torch.get_num_threads()
    try:
        candidates = list(range(1, available_cores() + 1))
        assert measure_best_threads(64, 128, num_rows=4, repeats=2) in candidates
        assert measure_best_threads(64, 128, num_rows=4, candidates=[1], repeats=2) == 1
        assert configure_threads(1, 64, 128) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
