"""The compiled decode step: torch.compile (inductor) of the model's own decode forward and LM head.

What is compiled is `CausalLM.forward` + `compute_logits` exactly as the eager path runs them, with
`AttentionMetadata.decode_only` set: attention then reads the paged cache in place
(`kernels.paged_attention.paged_decode_attention`) and K/V writes go through one `index_copy_`
per cache with no host sync (`write_kv_scratch`). Projections are whatever the model's layers call
(`linear(...)`), traced as they are. Why: an eager SmolLM2 decode step dispatches ~2,165 ATen ops
(~4 ms of a 19 ms step at batch 1) and copies every context's blocks before attention; one inductor
graph fuses the norms, RoPE, SiLU and residual adds into a few C++ loops and reads the blocks where
they lie (shared/research/cpu-performance.md, sections 2, 5 and 6).

Shapes: the batch dimension (sequences) and the block-table width are dynamic, and so is the
number of cache blocks; everything else (hidden size, heads, block size) is static. Dynamo would
specialise a size of 1 into a graph of its own, so a one-sequence decode is padded with a dummy
row (slot -1: its K/V land in the scratch block, its logits are dropped) and block tables are at
least 2 wide: the warm-up compiles exactly one graph (the compile is most of the start-up cost:
about a minute of CPU for SmolLM2's 30 layers) and then checks that 1 and 3 sequences run
without compiling. A model whose projections switch weight copies at a row count (int4/int8 up to
`crossover_rows`, bf16 past it) has one graph per side of each switch: the warm-up compiles them
all (`warm_up_shapes`). The one-row padding costs next to nothing: a decode's projections and LM
head stream the weights once whether they multiply 1 row or 2. Serving calls run under
`torch.compiler.set_stance("fail_on_recompile")`: a call that would need a new graph raises
`CompiledDecodeUnavailable` instead of stalling a step for tens of seconds, and the caller runs
that step eagerly. inductor's on-disk cache (torch's default directory, `TORCHINDUCTOR_CACHE_DIR`
when set) keeps the compiled C++ kernels across restarts; the graph itself is traced and lowered
again at every start, because inductor's FX graph cache bypasses graphs whose frozen constants
are oneDNN-packed float32 weights ("mkldnn tensors unpickleable") and AOTAutograd's cache bypasses
frozen graphs (torch 2.13).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

import torch
import torch._inductor.config as inductor_config
import torch.fx.experimental._config as fx_config

from engine.attention_metadata import AttentionMetadata
from engine.errors import EngineError

logger = logging.getLogger(__name__)

MIN_NUM_SEQS = 2            # smaller decodes are padded: a batch of 1 would be a graph of its own
MIN_BLOCK_TABLE_WIDTH = 2   # narrower block tables would be too
WARM_UP_SHAPE = (2, 3)      # (sequences, block-table width) compiled at warm-up, then checked:
CHECK_SHAPES = ((3, 2), (1, 4))


class CompiledDecodeUnavailable(EngineError):
    """The compiled decode step cannot run this call (not compiled, failed, or it would recompile);
    the step runs eagerly instead."""


def _decode_logits(model: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                   kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
    """What is compiled: float32 logits `[num_seqs, vocab_size]` of one decode token per sequence."""
    return model.compute_logits(model(input_ids, positions, kv_caches, meta))


class CompiledDecode:
    """A model's decode step compiled once, shared by every engine over that model.

    `model`: a CausalLM in eval mode whose weights no longer change (`freezing` folds them into
    the graph as constants; call nothing that changes weights afterwards). `warm_up` compiles
    (blocking; for SmolLM2 about a minute of CPU on a quiet 2-core box, several on a busy one); `start_warm_up` does it
    on a background thread while the eager path serves. Thread-safe: `ready` is an Event.
    `freezing=False` cannot lower the oneDNN-packed float32 projections (inductor's
    `_linear_pointwise` lowering needs constant weights); it is there for weight formats that can.
    """

    def __init__(self, model: Any, freezing: bool = True) -> None:
        self.model = model
        self.freezing = freezing
        self._compiled = torch.compile(_decode_logits, dynamic=False)
        self._ready = threading.Event()
        self._finished = threading.Event()        # warm-up ended, ready or failed
        self._marked_caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None
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
        """Run `warm_up` on a daemon thread and return it; failures are logged, not raised."""
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
        try:
            # freezing must be on while dynamo traces (it then installs the weights as graph constants,
            # guarded by identity), not only in inductor; duck shaping would give equal-sized dynamic
            # dims one symbol and guard on their equality
            with (torch.inference_mode(), inductor_config.patch(freezing=self.freezing),
                  fx_config.patch(use_duck_shape=False)):
                for shape in warm_up_shapes(self.model):
                    self._call(*_dummy_decode(*shape, scratch_block, kv_caches), allow_compile=True)
            self._ready.set()
            with torch.inference_mode():
                for shape in check_shapes(self.model):
                    self.run(*_dummy_decode(*shape, scratch_block, kv_caches))
        except BaseException as error:
            self._ready.clear()
            self.error = error
            self._finished.set()
            raise
        self.compile_seconds = time.perf_counter() - start
        self._finished.set()
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        logger.info("compiled decode step ready in %.1f s (graphs for batch sizes from %s, freezing=%s, "
                    "inductor cache %s)", self.compile_seconds, [n for n, _ in warm_up_shapes(self.model)],
                    self.freezing, cache_dir())

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        """Float32 logits `[num_seqs, vocab_size]` of a decode-only step, K/V written to `kv_caches`.

        input_ids, positions: int64 [num_seqs]; meta: decode_only=True, block_tables with at least
        MIN_BLOCK_TABLE_WIDTH columns (the caches' last block is their scratch block). Each cache
        tensor must have a storage of its own (engine/kv_memory.py): caches that are views of one
        storage are aliases to the graph, which then copies a whole cache to write one slot. Raises
        CompiledDecodeUnavailable before `ready`, or when the call would compile a new graph
        (nothing was written then).
        """
        if not self._ready.is_set():
            raise CompiledDecodeUnavailable("the compiled decode step is not ready")
        num_seqs = input_ids.shape[0]
        if num_seqs < MIN_NUM_SEQS:
            input_ids, positions, meta = _pad_batch(input_ids, positions, meta, MIN_NUM_SEQS - num_seqs)
        logits = self._call(input_ids, positions, kv_caches, meta, allow_compile=False)
        return logits[:num_seqs] if num_seqs < MIN_NUM_SEQS else logits

    def _call(self, input_ids: torch.Tensor, positions: torch.Tensor,
              kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
              allow_compile: bool) -> torch.Tensor:
        assert meta.decode_only and meta.block_tables.shape[1] >= MIN_BLOCK_TABLE_WIDTH
        if kv_caches is not self._marked_caches:
            for k_cache, v_cache in kv_caches:     # any cache size: the engines of a test run share graphs
                torch._dynamo.maybe_mark_dynamic(k_cache, 0)
                torch._dynamo.maybe_mark_dynamic(v_cache, 0)
            self._marked_caches = kv_caches
        for tensor in (input_ids, positions, meta.slot_mapping, meta.seq_lens, meta.block_tables):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        torch._dynamo.maybe_mark_dynamic(meta.block_tables, 1)
        if allow_compile:
            return self._compiled(self.model, input_ids, positions, kv_caches, meta)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._compiled(self.model, input_ids, positions, kv_caches, meta)
        except RuntimeError as error:
            if "fail_on_recompile" not in str(error):
                raise
            raise CompiledDecodeUnavailable(f"the compiled decode step would recompile: {error}") from error


COMPILE_NICE = 19
"""Niceness of the background compile thread (and of the C++ compilers it starts, which inherit it):
while it compiles, the engine and API threads serve eagerly on the same cores and should win them."""


def _lower_thread_priority() -> None:
    """Give the calling thread (a Linux task of its own) the niceness COMPILE_NICE; where the
    platform refuses, log it and go on at the normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
    except (AttributeError, OSError) as error:
        logger.info("compile thread keeps its priority: %s", error)


def _row_crossovers(model: Any) -> list[int]:
    """The distinct row counts at which the model's projections switch weight copies (their
    `x.shape[0] <= crossover_rows` branch, engine/models/quantized_linear.py), at least
    MIN_NUM_SEQS: each is a guard that splits the batch sizes between graphs."""
    summary = getattr(model, "weight_summary", None)
    rows = summary.crossover_rows.values() if summary is not None else ()
    return sorted({r for r in rows if r >= MIN_NUM_SEQS})


def warm_up_shapes(model: Any) -> list[tuple[int, int]]:
    """(sequences, block-table width) to compile at warm-up: WARM_UP_SHAPE and, for each weight-copy
    crossover c of the model, c + 1 sequences, so that every batch size has its graph before serving
    (one graph per copy regime; one graph in all for a model with a single copy per projection)."""
    return [WARM_UP_SHAPE, *((c + 1, WARM_UP_SHAPE[1]) for c in _row_crossovers(model))]


def check_shapes(model: Any) -> list[tuple[int, int]]:
    """Shapes run after the warm-up, each of which must not compile: CHECK_SHAPES and, per crossover
    c, c sequences and c + 3 with other block-table widths."""
    extra = [shape for c in _row_crossovers(model) for shape in ((c, 4), (c + 3, 2))]
    return [*CHECK_SHAPES, *extra]


def _pad_batch(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
               pad: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The decode with `pad` dummy sequences appended: token 0 at position 0, slot -1 (written to the
    scratch slot), one key (read from block 0, harmless), block table all -1. Only the tensors the
    compiled graph reads are padded."""
    tables = meta.block_tables
    padded = dataclasses.replace(
        meta,
        slot_mapping=torch.cat([meta.slot_mapping, meta.slot_mapping.new_full((pad,), -1)]),
        block_tables=torch.cat([tables, tables.new_full((pad, tables.shape[1]), -1)]),
        seq_lens=torch.cat([meta.seq_lens, meta.seq_lens.new_ones(pad)]))
    return (torch.cat([input_ids, input_ids.new_zeros(pad)]), torch.cat([positions, positions.new_zeros(pad)]),
            padded)


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
