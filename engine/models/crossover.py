"""Choosing, by a short measurement at load, up to how many rows the int4/int8 copies beat the
bf16/float32 copies on this machine (the few-rows / many-rows crossover).

The loaded projections themselves are timed, in model order, so that each role's weights stream
from memory as in a decode step: a single projection timed on its own stays in the L3 cache and
hides the bandwidth that the int4/int8 copies save (shared/research/cpu-performance.md §3).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from engine.config import ALL_ROWS
from engine.models.quantized_linear import QuantizedLinear

logger = logging.getLogger(__name__)

# Up to 128 rows: a prefill chunk, a batch of forced runs, a c=32 decode step. A group whose small
# copies still win at the last one is served by them at every row count (ALL_ROWS): SmolLM2's w4a8
# layers on a 2-core EPYC (AVX512-VNNI and bf16) took 0.64-0.89x the bf16 copies' time at each of 1 to
# 512 rows (0.72x at 128, 0.83x at 512), both compute-bound past ~16 rows, so the ratio holds on.
CANDIDATE_ROWS = (1, 2, 4, 8, 16, 64, 128)
# Used for a group the time budget left undecided before its first row count: the research
# note's crossover on this project's machine was 4-8 rows (shared/research/cpu-performance.md §3).
FALLBACK_CROSSOVER_ROWS = 4
Product = Callable[[torch.Tensor], torch.Tensor]


def measure_crossovers(groups: dict[str, list[QuantizedLinear]], candidate_rows: tuple[int, ...] = CANDIDATE_ROWS,
                       repeats: int = 2, rounds: int = 2, budget_s: float = 4.0) -> dict[str, int]:
    """Per group (e.g. "layer": every decoder projection, "head": the LM head), the largest of
    `candidate_rows` (ascending) up to which the group's small copies together are at least as
    fast as its large copies at every candidate row count; 0 when the large copies already win at
    the first; ALL_ROWS when the small copies won at every candidate (the large copies are then
    dropped: see CANDIDATE_ROWS). Every projection in `groups` must hold both copies. About two
    seconds for SmolLM2.

    For each row count, a pass runs every group in order through one kind of copy and times each
    group; passes over the two kinds take turns for `rounds` blocks of `repeats` passes (after one
    warm-up pass), and each (group, kind) keeps its best block's median, so a burst of load from
    another process that hits one block does not decide. Row counts stop once every group is
    decided, or once `budget_s` seconds have gone (a busy machine can make every pass 10x slower):
    a group still undecided keeps the largest row count its small copies won so far, or
    FALLBACK_CROSSOVER_ROWS when none was timed; the log line says so.
    """
    crossover = {name: 0 for name in groups}
    undecided = set(groups)
    generator = torch.Generator().manual_seed(0)
    widths = {proj.in_features for projs in groups.values() for proj in projs}
    timings: dict[int, dict[str, tuple[float, float]]] = {}
    deadline = time.perf_counter() + budget_s
    measured_all = True
    for rows in candidate_rows:
        if time.perf_counter() > deadline:
            measured_all = False
            break
        inputs = {width: torch.randn(rows, width, generator=generator) for width in widths}
        best = {(name, kind): float("inf") for name in undecided for kind in ("small", "large")}
        for _ in range(rounds):
            for kind in ("small", "large"):
                samples = [_time_pass(groups, undecided, kind, inputs) for _ in range(repeats + 1)][1:]
                for name in undecided:
                    key = (name, kind)
                    best[key] = min(best[key], statistics.median(sample[name] for sample in samples))
        timings[rows] = {name: (best[(name, "small")], best[(name, "large")]) for name in undecided}
        for name in list(undecided):
            if best[(name, "small")] > best[(name, "large")]:
                undecided.discard(name)
            else:
                crossover[name] = rows
        if not undecided:
            break
    for name in undecided:
        if measured_all:
            crossover[name] = ALL_ROWS
        elif crossover[name] == 0 and not any(name in by_name for by_name in timings.values()):
            crossover[name] = FALLBACK_CROSSOVER_ROWS
    if measured_all:
        undecided.clear()
    logger.info("small vs large copies by rows (ms per pass): %s; crossover rows %s%s",
                {rows: {name: (round(1e3 * s, 3), round(1e3 * b, 3)) for name, (s, b) in by_name.items()}
                 for rows, by_name in timings.items()},
                {name: "all" if rows >= ALL_ROWS else rows for name, rows in crossover.items()},
                f" (time budget of {budget_s} s spent before deciding {sorted(undecided)})" if undecided else "")
    return crossover


def _time_pass(groups: dict[str, list[QuantizedLinear]], names: set[str], kind: str,
               inputs: dict[int, torch.Tensor]) -> dict[str, float]:
    """Seconds each named group takes through its `kind` copies, run in the groups' order."""
    seconds: dict[str, float] = {}
    for name, projs in groups.items():
        if name not in names:
            continue
        products: list[Product] = [proj.small_product if kind == "small" else proj.large_product for proj in projs]
        start = time.perf_counter()
        for proj, product in zip(projs, products, strict=True):
            product(inputs[proj.in_features])
        seconds[name] = time.perf_counter() - start
    return seconds
