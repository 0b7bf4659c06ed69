"""Torch intra-op threads chosen per step by the step's rows (issue 12 item 5), on CPU.

A served step shares the cores with the API thread and, on one machine, the clients. When the
torch threads take every core, each wake-up of the API thread (every token of every stream) can
deschedule an OpenMP worker so that the whole step waits at the next barrier. On one 2-core box
(AMD EPYC, before inductor's C++ kernels released the GIL, engine/inductor_gil.py) served c=1
ran 44.3 tok/s on 1 thread against 37.7-39.1 on 2, c=8 the same, c=32 1.2x faster on 2. On
another (Intel Xeon, avx512_bf16, 2026-12-02, kernels releasing the GIL) the compiled step's
served c=1 token took 18.9 ms on 2 threads against 23.1 ms on 1 (medians of 3 alternating
requests, `benchmarks/decode_gap_bench.py --modes served --num-threads 0,2`), and run_bench's
c=1 and c=8 ran 1.28x and 1.36x faster. On a second box of that kind (Intel Xeon, avx512_bf16 and
AMX, 2026-12-05, `run_bench --loads plain_c1,plain_c8 --server-args "--kv-cache-memory 512MiB"`,
medians of 3, the two settings alternating twice) every core ran c=1 at 88.4 and 100.2 tok/s
against 75.0 and 75.2, c=8 at 271.8 and 292.9 against 231.1 and 229.4 (1.18-1.33x). So every
step runs on every core by default, as issue 12 asks and as llama.cpp and vLLM do
(`EngineConfig.leave_api_core` False); `serve --leave-api-core` turns the rule on, for a box
where the API thread's wake-ups cost more than a core (the AMD figures above predate the GIL
release and have not been measured again).
With the rule, steps of fewer than SMALL_STEP_ROWS rows leave one core to the API thread (every
core but one, at least 1) and larger steps use every core, as vLLM's CPU backend reserves a core
for its frontend.
`StepThreads` counts the steps run at each thread count (logged at shutdown).
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

logger = logging.getLogger(__name__)

# Steps of fewer rows than this leave one core to the API thread: on the 2-core box, served c=8 ran
# the same on 1 and 2 threads and c=32 1.2x faster on 2 (module docstring). Up to 8 rows, so that
# the boundary falls where the int4 copies' crossover usually does (8 rows, engine/models/
# crossover.py): the compiled decode then has one graph per copy regime rather than three
# (dynamo guards each graph on the thread count, engine/compiled_decode.py).
SMALL_STEP_ROWS = 9


class StepThreads:
    """The torch thread count of each step: `max_threads` for steps of at least `all_from_rows`
    rows (tokens), `max_threads - 1` (at least 1) below; `apply` sets it on the calling thread (the engine thread) when it
    changes (torch.set_num_threads, about a microsecond) and counts steps per count in
    `num_steps`. `all_from_rows` 0 keeps `max_threads` for every step. Raises ValueError for
    `max_threads` < 1 or `all_from_rows` < 0."""

    def __init__(self, max_threads: int, all_from_rows: int) -> None:
        if max_threads < 1 or all_from_rows < 0:
            raise ValueError(f"max_threads must be >= 1 and all_from_rows >= 0, got {max_threads}, {all_from_rows}")
        self.max_threads = max_threads
        self.all_from_rows = all_from_rows
        self.num_steps: Counter[int] = Counter()
        self._current = torch.get_num_threads()

    def threads_for(self, num_rows: int) -> int:
        """Threads for a step of `num_rows` tokens."""
        return self.max_threads if num_rows >= self.all_from_rows else self.small_threads

    @property
    def small_threads(self) -> int:
        """Threads of a step below `all_from_rows` rows: every core but one, at least 1."""
        return max(1, self.max_threads - 1)

    def apply(self, num_rows: int) -> int:
        """Set torch's threads for a step of `num_rows` tokens on this thread; returns the count."""
        n = self.threads_for(num_rows)
        if n != self._current or torch.get_num_threads() != n:
            torch.set_num_threads(n)
            self._current = n
        self.num_steps[n] += 1
        return n

    def describe(self) -> str:
        """One log / report line: the rule and the steps run at each count so far."""
        return (f"{self.small_threads} below {self.all_from_rows} rows, {self.max_threads} from it; "
                f"steps by threads {dict(sorted(self.num_steps.items()))}")


def plan_step_threads(num_threads: int, explicit: bool, leave_api_core: bool) -> StepThreads | None:
    """The per-step rule for serving on `num_threads` CPU threads: StepThreads(num_threads,
    SMALL_STEP_ROWS) when `leave_api_core` asks for it (`serve --leave-api-core`); None (every step on
    `num_threads`) when it does not, when the count was given explicitly (`--num-threads` is kept
    for every step) or when it is 1."""
    if not leave_api_core or explicit or num_threads <= 1:
        return None
    rule = StepThreads(num_threads, SMALL_STEP_ROWS)
    logger.info("step threads: %d below %d rows, %d from it", rule.small_threads, SMALL_STEP_ROWS, num_threads)
    return rule
