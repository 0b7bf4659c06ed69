"""The compiled decode step: torch.compile (inductor) of the model's own decode forward.

What is compiled is `CausalLM.forward` exactly as the eager path runs it, with
`AttentionMetadata.decode_only` set: attention then reads the paged cache in place
(`kernels.paged_attention.paged_decode_attention`) and K/V writes go through one `index_copy_`
per cache with no host sync (`write_kv_scratch`). Projections are whatever the model's layers call
(`linear(...)`), traced as they are. Why: an eager SmolLM2 decode step dispatches ~2,165 ATen ops
(~4 ms of a 19 ms step at batch 1) and copies every context's blocks before attention; one inductor
graph fuses the norms, RoPE, SiLU and residual adds into a few C++ loops and reads the blocks where
they lie (shared/research/cpu-performance.md, sections 2, 5 and 6).

The LM head (`compute_logits`) runs after the graph, eagerly, on the sampling rows only: a step
that carries grammar-forced runs has one row per forced token but samples once per sequence, and
the head on every row cost SmolLM2 ~11 ms of a 66-row step (6 runs of 11 tokens) for logits
nobody reads. Outside the graph, the head's own crossover (int8 up to a few rows, bf16 past it)
no longer splits the batch sizes between graphs either; the eager call adds a few ATen ops.

Shapes: the batch dimension (sequences) and the block-table width are dynamic, and so is the
number of cache blocks; everything else (hidden size, heads, block size) is static. Dynamo
specialises a size of 1 into a graph of its own, and the one-sequence decode (an agent's loop) gets
it: padding it to 2 rows cost 24% more per int4 projection and ~1 ms more in the int8 LM head on
this project's box (the CPU kernels' time grows with the rows even where the bytes do not). Block
tables are at least 2 wide (MIN_BLOCK_TABLE_WIDTH) so that the width never specialises. A model
whose decoder projections switch weight copies at a row count (int4/int8 up to `crossover_rows`,
bf16 past it) has one graph per side of the switch, and dynamo guards each graph on torch's thread
count: the warm-up compiles one graph per (one sequence or more, copy regime, thread count) the
engine can call with (`warm_up_shapes`; SmolLM2 under the step-thread rule: two or three) and then
checks that other batch sizes and widths run without compiling. The compile is most of the
start-up cost: ~60-100 s of CPU per graph for SmolLM2's 30 layers with a cold on-disk cache,
~7-14 s of dynamo tracing with a warm one. Serving calls run under
`torch.compiler.set_stance("fail_on_recompile")`: a call that would need a new graph raises
`CompiledDecodeUnavailable` instead of stalling a step for tens of seconds, and the caller runs
that step eagerly.

Guards: dynamo checks every call against each graph's guards, and for SmolLM2 most of them are
on the model's modules (every buffer's tensor metadata, every attribute read, ~6,400 lines per
graph): 0.82 ms of a 12.3 ms one-sequence step on 1 thread. The model never changes after load
(crossover rows are set before the warm-up, LoRA rows run eager and leave the modules alone), so
those guards are dropped (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`): 0.19 ms. What
tells the graphs apart stays guarded: the inputs' shapes, dtypes and strides, and the thread count.

On-disk caches: the weights are plain graph inputs (no `freezing`; the oneDNN-reordered copies go
through engine/models/onednn_linear.py's operator), so AOTAutograd's cache and inductor's FX graph
cache hold the lowered graphs, keyed by the graph and the inputs' shapes, dtypes and strides, not
by the weights' values, and tagged with each graph's row range (`CompiledDecode.cache_key_tag`),
so that a start with another crossover never loads a graph guarded on a narrower range. A second
start of the same model with the same `cache_dir` (and the same crossover regimes:
`EngineConfig.crossover_rows` pins them) only traces the model with dynamo and loads the rest.
`freezing=True` (weights folded into the graph as constants) is kept for comparison: those graphs cannot be cached (torch 2.13:
AOTAutograd refuses frozen graphs, inductor's FX cache refuses oneDNN constants).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config as inductor_config
import torch.fx.experimental._config as fx_config
from torch._dynamo.utils import counters

from engine.attention_metadata import AttentionMetadata
from engine.config import ALL_ROWS
from engine.errors import EngineError
from engine.inductor_gil import release_gil_in_cpp_kernels
from engine.memory_trim import release_free_memory

logger = logging.getLogger(__name__)

MIN_BLOCK_TABLE_WIDTH = 2   # narrower block tables would be too
WARM_UP_TABLE_WIDTH = 3     # block-table width of the warm-up's compiling calls; then checked:
CHECK_SHAPES = ((3, 2), (1, 4))
# (counter group, counter name) of torch's own compile caches -> the name in `cache_stats`
_CACHE_COUNTERS = {("aot_autograd", "autograd_cache_hit"): "aot_autograd_hits",
                   ("aot_autograd", "autograd_cache_miss"): "aot_autograd_misses",
                   ("aot_autograd", "autograd_cache_bypass"): "aot_autograd_bypasses",
                   ("inductor", "fxgraph_cache_hit"): "fx_graph_hits",
                   ("inductor", "fxgraph_cache_miss"): "fx_graph_misses",
                   ("inductor", "fxgraph_cache_bypass"): "fx_graph_bypasses"}


class CompiledDecodeUnavailable(EngineError):
    """The compiled decode step cannot run this call (not compiled, failed, or it would recompile);
    the step runs eagerly instead."""


def _decode_hidden(model: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                   kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
    """What is compiled: hidden states `[num_rows, hidden_size]` (model dtype, after the final
    norm) of one decode token per row."""
    return model(input_ids, positions, kv_caches, meta)


class CompiledDecode:
    """A model's decode step compiled once, shared by every engine over that model.

    `model`: a CausalLM in eval mode. `warm_up` compiles (blocking; for SmolLM2 minutes of CPU
    on a 2-core box when the on-disk cache is cold, seconds of tracing when it is warm);
    `start_warm_up` does it on a background thread while the eager path serves. Thread-safe:
    `ready` is an Event. `cache_dir`: the folder of inductor's on-disk caches
    (TORCHINDUCTOR_CACHE_DIR, which this sets for the whole process at warm-up: inductor has no
    other way to be told); None leaves it as it is (the variable, else torch's default under
    the temp folder). `freezing=True` folds the weights into the graph as constants (call nothing
    that changes weights afterwards); such graphs are never served from the on-disk cache.
    After warm-up, `cache_stats` counts what torch's caches served (see `_CACHE_COUNTERS`).
    `threads_for(rows)`: torch's intra-op thread count of a decode step of `rows` sequences, as the
    engine thread will set it (engine/step_threads.py); dynamo guards every graph on the count it
    was compiled under (inductor's C++ loops fix their OpenMP team size), so the warm-up compiles
    one graph per (weight-copy regime, thread count) the engine can call with. None: every step
    runs on the count the warm-up thread has. `shapes`: what the warm-up compiles
    (`warm_up_shapes`), fixed at construction.
    """

    def __init__(self, model: Any, freezing: bool = False, cache_dir: str | None = None,
                 threads_for: Callable[[int], int] | None = None) -> None:
        self.model = model
        self.threads_for = threads_for
        self.shapes = warm_up_shapes(model, threads_for)
        self.freezing = freezing
        self.cache_dir = cache_dir
        self.cache_stats: dict[str, int] = {}
        self.graph_seconds: list[float] = []      # warm-up seconds per shape of warm_up_shapes
        self._compiled = torch.compile(_decode_hidden, dynamic=False,
                                       options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        self._ready = threading.Event()
        self._finished = threading.Event()        # warm-up ended, ready or failed
        self.error: BaseException | None = None   # why warm-up failed, once it has
        self.compile_seconds: float | None = None

    @property
    def ready(self) -> bool:
        """True once the graph is compiled; False again if the warm-up's checks then fail."""
        return self._ready.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until a started warm-up ends (or `timeout_s` passes); returns `ready`."""
        self._finished.wait(timeout_s)
        return self.ready

    def start_warm_up(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], scratch_block: int) -> threading.Thread:
        """Run `warm_up` on a daemon thread and return it (logging COMPILE_STARTED first); failures
        are logged, not raised."""
        logger.info("%s (graphs for (batch sizes from, threads) %s); eager steps serve meanwhile", COMPILE_STARTED,
                    self._graph_keys())
        thread = threading.Thread(target=self._warm_up_logged, args=(kv_caches, scratch_block),
                                  name="structserve-compile", daemon=True)
        thread.start()
        return thread

    def _warm_up_logged(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], scratch_block: int) -> None:
        _lower_thread_priority()
        try:
            self.warm_up(kv_caches, scratch_block)
        except Exception as error:   # the eager path keeps serving; say why there is no fast path
            logger.warning("compiled decode step unavailable, every step stays eager: %s: %s",
                           type(error).__name__, error)

    def warm_up(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], scratch_block: int) -> None:
        """Compile the graph on dummy decodes that read and write only `scratch_block` of
        `kv_caches` (a block the block pool never hands out, so this may run while other threads
        serve from the same caches), then check that other batch sizes and widths (CHECK_SHAPES)
        run without compiling. Sets `ready`; raises what compiling raised (and records it in
        `error`)."""
        start = time.perf_counter()
        if self.cache_dir is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self.cache_dir
        release_gil_in_cpp_kernels()
        counted = _cache_counts()
        try:
            # freezing must be on while dynamo traces (it then installs the weights as graph constants,
            # guarded by identity), not only in inductor; duck shaping would give equal-sized dynamic
            # dims one symbol and guard on their equality
            # size_asserts off: the wrapper would check every input's size and stride on each call
            # (~600 checks, 0.5 ms of a one-sequence step); the guards check the step's inputs and
            # the weights never change
            with (torch.inference_mode(), inductor_config.patch(freezing=self.freezing, size_asserts=False),
                  fx_config.patch(use_duck_shape=False), torch.compiler.config.patch(cache_key_tag=self.cache_key_tag)):
                for rows, width in self.shapes:
                    shape_start = time.perf_counter()
                    self._set_threads(rows)
                    self._call(*_dummy_decode(rows, width, scratch_block, kv_caches), allow_compile=True)
                    self.graph_seconds.append(time.perf_counter() - shape_start)
            self._ready.set()
            with torch.inference_mode():
                for rows, width in check_shapes(self.model):
                    self._set_threads(rows)
                    self.run(*_dummy_decode(rows, width, scratch_block, kv_caches))
        except BaseException as error:
            self._ready.clear()
            self.error = error
            self._finished.set()
            raise
        self.compile_seconds = time.perf_counter() - start
        self.cache_stats = {name: count - counted[name] for name, count in _cache_counts().items()}
        drop_traced_graphs()
        release_free_memory()    # the compiler's temporaries: tens of MB that glibc would keep resident
        self._finished.set()
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        hits, misses = self.cache_stats["fx_graph_hits"], self.cache_stats["fx_graph_misses"]
        logger.info("compiled decode step ready in %.1f s (graphs for (batch sizes from, threads) %s, freezing=%s); "
                    "on-disk cache %s: %s (%d of %d graphs loaded; %s)", self.compile_seconds,
                    self._graph_keys(), self.freezing, cache_dir(),
                    "hit" if hits and not misses else "miss", hits, hits + misses + self.cache_stats["fx_graph_bypasses"],
                    ", ".join(f"{k} {v}" for k, v in self.cache_stats.items()))

    @property
    def cache_key_tag(self) -> str:
        """The tag this step's graphs carry in torch's on-disk cache keys: each graph's row range.

        Why: a graph's FX code is the same whichever row count its weight copies switch at (the
        `x.shape[0] <= crossover_rows` branch is a guard, not an op), and inductor's FX graph cache
        serves an entry whose stored shape guards hold for the compiling call's sizes, adding them
        to the new graph. Without the tag, a server whose crossover is 8 loaded the 2-4-rows graph
        an earlier start with a crossover of 4 (measured at load) had cached, so every step of 5-8
        rows would have recompiled and the whole compiled step was refused at warm-up."""
        starts = [rows for rows, _ in self.shapes]
        ranges = [f"{lo}-{hi - 1}" for lo, hi in zip(starts, starts[1:])] + [f"{starts[-1]}+"]
        return "structserve decode rows " + ",".join(ranges)

    def _graph_keys(self) -> list[tuple[int, int]]:
        """(smallest batch size, threads) of each graph, for the log."""
        return [(n, self.threads_for(n) if self.threads_for is not None else torch.get_num_threads())
                for n, _ in self.shapes]

    def _set_threads(self, rows: int) -> None:
        """Give this (the warm-up) thread the count the engine thread will run `rows` sequences on."""
        if self.threads_for is not None and torch.get_num_threads() != self.threads_for(rows):
            torch.set_num_threads(self.threads_for(rows))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
            sample_idx: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits of a decode-only step, K/V written to `kv_caches`: `[num_rows,
        vocab_size]`, or `[len(sample_idx), vocab_size]` for the rows `sample_idx` (int64) names,
        in its order; the LM head runs on those rows only, after the graph.

        input_ids, positions: int64 [num_rows]; meta: decode_only=True, block_tables with at least
        MIN_BLOCK_TABLE_WIDTH columns (the caches' last block is their scratch block). Each cache
        tensor must have a storage of its own (engine/kv_memory.py): caches that are views of one
        storage are aliases to the graph, which then copies a whole cache to write one slot. Raises
        CompiledDecodeUnavailable before `ready`, or when the call would compile a new graph
        (nothing was written then).
        """
        if not self._ready.is_set():
            raise CompiledDecodeUnavailable("the compiled decode step is not ready")
        hidden = self._call(input_ids, positions, kv_caches, meta, allow_compile=False)
        if sample_idx is not None and sample_idx.numel() == 0:    # a prefill chunk that does not sample
            return torch.empty((0, self.model.arch.vocab_size), dtype=torch.float32)
        if sample_idx is not None and sample_idx.numel() != hidden.shape[0]:
            hidden = hidden.index_select(0, sample_idx)
        return self.model.compute_logits(hidden)

    def _call(self, input_ids: torch.Tensor, positions: torch.Tensor,
              kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
              allow_compile: bool) -> torch.Tensor:
        assert meta.decode_only and meta.block_tables.shape[1] >= MIN_BLOCK_TABLE_WIDTH
        if allow_compile:
            _mark_dynamic(input_ids, positions, kv_caches, meta)
            return self._compiled(self.model, input_ids, positions, kv_caches, meta)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._compiled(self.model, input_ids, positions, kv_caches, meta)
        except RuntimeError as error:
            if "fail_on_recompile" not in str(error):
                raise
            raise CompiledDecodeUnavailable(f"the compiled decode step would recompile: {error}") from error


COMPILE_STARTED = "compiling the decode step in the background"
"""Start of the log line `start_warm_up` writes (benchmarks/server_process.py waits on it)."""

COMPILE_NICE = 19
"""Niceness of the background compile thread (and of the C++ compilers it starts, which inherit it):
while it compiles, the engine and API threads serve eagerly on the same cores and should win them."""


def _mark_dynamic(input_ids: torch.Tensor, positions: torch.Tensor,
                  kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> None:
    """Mark the dims that vary between decode steps dynamic on a call about to compile: sequences
    (dim 0 of the per-sequence tensors), the block-table width, and the caches' block count (so
    that engines with other cache sizes share the graphs). Only compiling calls need it: a
    compiled graph's guards accept any size of a dim it was compiled dynamic for."""
    for k_cache, v_cache in kv_caches:
        torch._dynamo.maybe_mark_dynamic(k_cache, 0)
        torch._dynamo.maybe_mark_dynamic(v_cache, 0)
    for tensor in (input_ids, positions, meta.slot_mapping, meta.seq_lens, meta.block_tables):
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
    torch._dynamo.maybe_mark_dynamic(meta.block_tables, 1)


_TRACE_HANDLES = ("zero_grad", "named_parameters", "named_buffers")


def drop_traced_graphs() -> int:
    """Let the FX GraphModules that dynamo traced be freed once their graphs are compiled; returns
    how many compiled functions held one.

    Why: dynamo installs each compiled graph as a `__compiled_fn_*` global of the module whose
    function it compiled (this one). In torch 2.13 that function is AOTAutograd's
    `aot_module_simplified` wrapper, which keeps `zero_grad`, `named_parameters` and
    `named_buffers` bound to the traced GraphModule "for convenience"; nothing on the inference
    call path reads them, yet they keep each graph's ~3,300 nodes with their fake tensors and
    symbolic sizes resident: ~30 MiB for SmolLM2's three graphs (measured with smaps_rollup).
    Dropping the three attributes (on the wrapper and every `__wrapped__` below it) leaves the
    compiled callable, its guards and its weights as they are. Later torch versions may hold the
    module elsewhere; then this finds nothing to drop and returns 0."""
    dropped = 0
    for name, fn in list(globals().items()):
        held = False
        while name.startswith("__compiled_fn") and fn is not None:
            attrs = getattr(fn, "__dict__", {})
            popped = [attrs.pop(attr, None) for attr in _TRACE_HANDLES]
            held |= any(handle is not None for handle in popped)
            fn = getattr(fn, "__wrapped__", None)
        dropped += held
    return dropped


def _cache_counts() -> dict[str, int]:
    """torch's compile-cache counters now, by their `cache_stats` names (process-wide totals)."""
    return {name: int(counters[group][counter]) for (group, counter), name in _CACHE_COUNTERS.items()}


def _lower_thread_priority() -> None:
    """Give the calling thread (a Linux task of its own) the niceness COMPILE_NICE; where the
    platform refuses, log it and go on at the normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
    except (AttributeError, OSError) as error:
        logger.info("compile thread keeps its priority: %s", error)


def _row_crossovers(model: Any) -> list[int]:
    """The row count at which the model's decoder projections (role "layer") switch weight copies
    (their `x.shape[0] <= crossover_rows` branch, engine/models/quantized_linear.py), if at least
    1: a guard that splits the batch sizes between graphs (ALL_ROWS is none: no branch is left).
    The LM head's crossover is not one: the head runs after the graph."""
    summary = getattr(model, "weight_summary", None)
    rows = summary.crossover_rows.get("layer", 0) if summary is not None else 0
    return [rows] if 1 <= rows < ALL_ROWS else []


def warm_up_shapes(model: Any, threads_for: Callable[[int], int] | None = None,
                   max_rows: int = 1024) -> list[tuple[int, int]]:
    """(sequences as the engine counts them, block-table width) to compile at warm-up: one per
    distinct graph key (one sequence or more, weight-copy regime, `threads_for` of the rows) over
    1..`max_rows` sequences, each the smallest row count of its key, so that every batch size has
    its graph before serving. A model with a single copy per projection on one thread count has
    two graphs (1 sequence, 2 or more); SmolLM2's int4/bf16 layer copies under the step-thread rule
    have three when the crossover and the rule's boundary agree (engine/step_threads.py), two
    when the layers keep no bf16 copy (crossover ALL_ROWS)."""
    crossovers = _row_crossovers(model)
    seen: dict[tuple[bool, int, int | None], int] = {}
    for rows in range(1, max_rows + 1):
        key = (rows == 1, sum(rows > c for c in crossovers), threads_for(rows) if threads_for is not None else None)
        seen.setdefault(key, rows)
    return [(rows, WARM_UP_TABLE_WIDTH) for rows in seen.values()]


def check_shapes(model: Any) -> list[tuple[int, int]]:
    """Shapes run after the warm-up (each on the thread count the engine would give it), none of
    which may compile: CHECK_SHAPES and, per crossover
    c, c sequences and c + 3 with other block-table widths."""
    extra = [shape for c in _row_crossovers(model) for shape in ((c, 4), (c + 3, 2))]
    return [*CHECK_SHAPES, *extra]


def _dummy_decode(num_seqs: int, table_width: int, scratch_block: int,
                  kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[Any, ...]:
    """Arguments of a decode of `num_seqs` one-token sequences that live in `scratch_block`."""
    device = kv_caches[0][0].device
    block_size = kv_caches[0][0].shape[1]
    ints = {"dtype": torch.int32, "device": device}
    meta = AttentionMetadata(
        slot_mapping=torch.full((num_seqs,), scratch_block * block_size, dtype=torch.int64, device=device),
        block_tables=torch.full((num_seqs, table_width), scratch_block, **ints),
        cu_seqlens_q=torch.arange(num_seqs + 1, **ints),
        seq_lens=torch.ones(num_seqs, **ints),
        query_lens=[1] * num_seqs, seq_lens_list=[1] * num_seqs, num_decodes=num_seqs,
        block_size=block_size, max_query_len=1, max_seq_len=1, decode_only=True,
    )
    zeros = torch.zeros(num_seqs, dtype=torch.int64, device=device)
    return zeros, zeros.clone(), kv_caches, meta
