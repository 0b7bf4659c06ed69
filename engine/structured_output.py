"""Grammar glue for the engine: compile futures, one matcher per sequence, the step's bitmask."""

from __future__ import annotations

import logging
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
    fill_all_ones,
)
from engine.sequence import Sequence

logger = logging.getLogger(__name__)


class StructuredOutputManager:
    """Owns the GrammarCompiler and the per-step bitmask for one engine.

    Compiles run on the compiler's thread pool; `on_ready` is called (from that pool) whenever a
    compile settles, so an idle engine thread can wake up. The bitmask of a step, int32
    [num_sampling_rows, ceil(vocab_size / 32)], is filled on a helper thread while the model's
    forward runs (both release the GIL), constrained rows by their matchers and the rest all ones.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...], max_rows: int,
                 config: GrammarConfig, on_ready: Callable[[], None] | None = None) -> None:
        self.vocab_info = VocabInfo.from_huggingface(tokenizer, vocab_size, list(eos_token_ids))
        self.compiler = GrammarCompiler(self.vocab_info, config)
        self.bitmask = allocate_bitmask(max_rows, vocab_size)
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="bitmask-fill")
        self.on_ready = on_ready
        self.num_forced_tokens = 0

    def submit(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Start (or reuse from cache) the compile of `spec`; never blocks."""
        future = self.compiler.submit(spec)
        if self.on_ready is not None:
            callback = self.on_ready
            future.add_done_callback(lambda _f: callback())
        return future

    def new_matcher(self, compiled: CompiledGrammar) -> Any:
        """A fresh constrained.Matcher for one sequence."""
        return self.compiler.new_matcher(compiled)

    def start_fill(self, seqs: list[Sequence]) -> Future[torch.Tensor] | None:
        """Begin filling the bitmask rows of `seqs` (row i = seqs[i]); None when none is constrained.

        The future's result is a view int32 [len(seqs), ceil(vocab_size / 32)] of the shared buffer,
        valid until the next call.
        """
        pairs = [(seq.matcher, row) for row, seq in enumerate(seqs) if seq.matcher is not None]
        if not pairs:
            return None
        num_rows = len(seqs)
        if num_rows > self.bitmask.shape[0]:
            self.bitmask = allocate_bitmask(num_rows, self.vocab_info.vocab_size)
        bitmask = self.bitmask[:num_rows]

        def fill() -> torch.Tensor:
            constrained_rows = {row for _, row in pairs}
            fill_all_ones(bitmask, [r for r in range(num_rows) if r not in constrained_rows])
            self.compiler.fill_bitmasks(pairs, bitmask)
            return bitmask

        return self._filler.submit(fill)

    def close(self) -> None:
        """Stop the compile and fill threads."""
        self.compiler.close()
        self._filler.shutdown(wait=False, cancel_futures=True)
