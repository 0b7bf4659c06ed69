"""Grammar glue for the engine: compile futures, one matcher per sequence, the step's bitmask."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from constrained import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarConfig,
    GrammarSpec,
    VocabInfo,
    allocate_bitmask,
)
from constrained.closing import GrammarCloser
from engine.histogram import BucketHistogram
from engine.sequence import Sequence

logger = logging.getLogger(__name__)


GRAMMAR_COMPILE_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the grammar_compile_seconds buckets: most compiles take milliseconds,
pathological schemas up to the compile timeout (30 s by default)."""

CLOSING_WINDOW_TOKENS = 32
"""A sequence that closes its grammar plans a closing from this many tokens before its budget on."""

CLOSING_MARGIN_TOKENS = 2
"""The least slack of a closing: it is appended once the budget left is at most the plan's length
plus the larger of this margin and the plan's length. One sampled token can lengthen the plan by
about its own length (a `, ` opens one more member: a key and its value, `, "opt_22": 0` after
`}}\n</tool_call>`'s 7 tokens), so a fixed margin of 2 let the budget fall below the plan between
two steps and max_tokens cut the call (case 043 in the fixed layout of tool calls)."""


class StructuredOutputManager:
    """Owns the GrammarCompiler and the per-step bitmask for one engine.

    Compiles run on the compiler's thread pool; `on_ready` is called (from that pool) whenever a
    compile settles, so an idle engine thread can wake up. The bitmask of a step, int32
    [num_sampling_rows, ceil(vocab_size / 32)], is filled on a helper thread while the model's
    forward runs (both release the GIL), constrained rows by their matchers and the rest all ones.

    Metrics (plain counters, read by `LLMEngine.stats`): `num_forced_tokens` (bumped by the engine
    on jump-forward), `num_closed_outputs` (sequences ended by `closing_tokens`) and
    `compile_seconds`, submit-to-result wall seconds of every compile that missed the cache
    (observed on the compile thread).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...], max_rows: int,
                 config: GrammarConfig, on_ready: Callable[[], None] | None = None) -> None:
        self.vocab_info = VocabInfo.from_huggingface(tokenizer, vocab_size, list(eos_token_ids))
        self.compiler = GrammarCompiler(self.vocab_info, config)
        self.bitmask = allocate_bitmask(max_rows, vocab_size)
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="bitmask-fill")
        self.on_ready = on_ready
        self.num_forced_tokens = 0
        self.num_closed_outputs = 0
        self._closer: Future[GrammarCloser] | None = None
        self.compile_seconds = BucketHistogram(GRAMMAR_COMPILE_BUCKETS_S)

    def submit(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Start (or reuse from cache) the compile of `spec`; never blocks. Engine thread only: a
        change of the compiler's hit count across the call tells a cache hit from a compile."""
        start = time.perf_counter()
        hits_before = self.compiler.stats().cache_hits
        future = self.compiler.submit(spec)
        if self.compiler.stats().cache_hits == hits_before:
            histogram = self.compile_seconds
            future.add_done_callback(lambda _f: histogram.observe(time.perf_counter() - start))
        if self.on_ready is not None:
            callback = self.on_ready
            future.add_done_callback(lambda _f: callback())
        return future

    def new_matcher(self, compiled: CompiledGrammar) -> Any:
        """A fresh constrained.Matcher for one sequence."""
        return self.compiler.new_matcher(compiled)

    def prepare_closer(self) -> None:
        """Start building the closing planner in the background (it decodes the whole vocabulary,
        about 0.5 s), so the step that first needs it does not wait; called when a request that
        may close its grammar arrives. Idempotent."""
        if self._closer is None:
            builder = ThreadPoolExecutor(1, thread_name_prefix="grammar-closer")
            self._closer = builder.submit(GrammarCloser, self.vocab_info)
            self._closer.add_done_callback(_log_closer_failure)
            builder.shutdown(wait=False)

    def closing_tokens(self, matcher: Any, budget: int) -> list[int] | None:
        """Tokens to append now so that `matcher`'s grammar ends within `budget` more output tokens
        (max_tokens or the context, whichever is nearer); None while that is not yet due, when the
        grammar already accepts, or when no closing fits (then max_tokens cuts the output as usual).
        At an accepting state where nothing else could still close in time (another forced call),
        an EOS id: the output ends there instead of being cut inside a call (`GrammarCloser.must_end`).

        Engine thread only. Counts each closing returned in `num_closed_outputs`.
        """
        if budget > CLOSING_WINDOW_TOKENS:
            return None
        self.prepare_closer()
        assert self._closer is not None
        if self._closer.exception() is not None:   # logged once below; the output is cut as usual
            return None
        closer = self._closer.result()
        plan = closer.plan(matcher, limit=budget)
        if plan == [] and closer.must_end(matcher, budget):
            self.num_closed_outputs += 1
            return [self.vocab_info.eos_token_ids[0]]
        if not plan or len(plan) + max(CLOSING_MARGIN_TOKENS, len(plan)) < budget:
            return None
        self.num_closed_outputs += 1
        return plan

    def start_fill(self, seqs: list[Sequence]) -> Future[torch.Tensor] | None:
        """Begin filling the bitmask rows of `seqs` (row i = seqs[i]); None when none is constrained.

        The future's result is a view int32 [len(seqs), ceil(vocab_size / 32)] of the shared buffer,
        valid until the next call.
        """
        rows = [(seq.matcher, row) for row, seq in enumerate(seqs)]
        if all(matcher is None for matcher, _ in rows):
            return None
        num_rows = len(seqs)
        if num_rows > self.bitmask.shape[0]:
            self.bitmask = allocate_bitmask(num_rows, self.vocab_info.vocab_size)
        bitmask = self.bitmask[:num_rows]

        def fill() -> torch.Tensor:
            self.compiler.fill_bitmasks(rows, bitmask)   # rows without a matcher: all allowed
            return bitmask

        return self._filler.submit(fill)

    def close(self) -> None:
        """Stop the compile and fill threads."""
        self.compiler.close()
        self._filler.shutdown(wait=False, cancel_futures=True)


def _log_closer_failure(future: Future[GrammarCloser]) -> None:
    if future.exception() is not None:
        logger.error("grammar closing is off: building its planner failed: %r", future.exception())
