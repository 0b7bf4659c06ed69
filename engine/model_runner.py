"""Model runner: flattens a scheduled step into one batch, runs the model, returns logits."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from engine.attention_metadata import AttentionMetadata
from engine.compiled_decode import MIN_BLOCK_TABLE_WIDTH, CompiledDecode, CompiledDecodeUnavailable
from engine.errors import ModelLoadError
from engine.scheduler import SchedulerOutput
from lora.batch import LoraBatch
from engine.kv_memory import zeroed_cache
from lora.manager import LoraManager

logger = logging.getLogger(__name__)

COMPILED_STEP_MAX_TOKENS = 128        # tokens of a step with multi-token queries run compiled
COMPILED_STEP_KEYS_PER_QUERY = 12288  # keys those queries may read there: this x (1 + their count)
"""A step with multi-token queries (a short prefill chunk, a prefix-cache hit's remainder, a
grammar-forced run) runs through the compiled decode graph, one row per token
(`ModelRunner.prepare`), when it has at most COMPILED_STEP_MAX_TOKENS tokens and its multi-token
queries read at most COMPILED_STEP_KEYS_PER_QUERY x (1 + their number) keys there: each query
token reads its whole context there (sum of query_len x seq_len over those sequences), while eager
prefill attention reads a context once per sequence but pays a fixed cost per sequence; so long
queries over long contexts stay eager. Steps of one token per sequence always run compiled.
Measured on SmolLM2 (int4/bf16, 2-core box, in-process step time eager -> compiled):
7 decodes + a 12-token admission over a 1,000-token cached prefix 41.8 -> 34.4 ms;
8 forced runs of 11 tokens over 370 (33k keys) 88.4 -> 73.8 ms, over 1,000 (89k keys)
133.4 -> 134.2 ms; 16 decodes + 8 forced runs of 8 tokens 130.3 -> 76.8 ms; one 40-token chunk
after 300 cached tokens (12k keys) 42.1 -> 38.6 ms, one of 32 after 1,000 (33k keys)
54.3 -> 57.9 ms, one of 128 after 300 (55k keys) 108.8 -> 114.2 ms. Those figures predate the
C++ decode operator's query runs (kernels/cpu/paged_decode_tasks.h): where it is loaded, the rows
of one query go to the prefill kernel's tiles, which read the context once per 16 tokens on both
paths, so the keys bound no longer follows the compiled path's attention cost there (the torch
reduction, without the C++ kernels, still reads it once per token). Dropping the bound gained
nothing in one served A/B on the AVX2 box (a 37-token query after 2,929 cached tokens: 130 ms
eager, 144 ms compiled), so it stays."""


def runs_compiled(query_lens: list[int], seq_lens: list[int]) -> bool:
    """Whether a step of these per-sequence query and KV lengths runs as compiled decode rows
    (see COMPILED_STEP_MAX_TOKENS); the caller checks the compiled step is ready and LoRA-free."""
    multi = [(q, n) for q, n in zip(query_lens, seq_lens) if q > 1]
    if not multi:
        return True
    query_keys = sum(q * n for q, n in multi)
    return (sum(query_lens) <= COMPILED_STEP_MAX_TOKENS
            and query_keys <= COMPILED_STEP_KEYS_PER_QUERY * (1 + len(multi)))


def kv_block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes that one block takes across all layers, K and V together."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


class ModelRunner:
    """Holds the model and the paged KV cache; runs one step's flattened batch.

    KV cache: per layer a (k_cache, v_cache) pair, each [num_blocks + 1, block_size, num_kv_heads,
    head_dim] in the model dtype on the model device: `num_blocks` (what the block pool hands out)
    sized from `kv_cache_memory_bytes`, plus the scratch block `scratch_block` (= num_blocks) that
    no sequence owns, where writes of slot -1 land and the compiled step's warm-up runs.
    Raises ModelLoadError when that memory cannot hold one max_model_len sequence.
    `lora` (None: LoRA off) gives each sequence's adapter slot for the per-token LoRA batch.
    `compiled` (None: always eager) runs steps without LoRA rows once it is ready, when
    `runs_compiled` says so (every decode-only step, short multi-token ones as one row per
    token); every other step, and any step it cannot run, runs the eager model (a fallback of an
    already flattened step runs its one-token rows eagerly, the same attention).
    `num_compiled_steps` and `num_eager_steps` count the steps each path ran.
    """

    def __init__(self, model: Any, arch: Any, device: torch.device, dtype: torch.dtype,
                 block_size: int, kv_cache_memory_bytes: int, max_model_len: int,
                 lora: LoraManager | None = None, compiled: CompiledDecode | None = None) -> None:
        self.model = model
        self.lora = lora
        self.compiled = compiled
        self.num_compiled_steps = 0
        self.num_eager_steps = 0
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        per_block = kv_block_bytes(arch.num_layers, block_size, arch.num_kv_heads, arch.head_dim, dtype)
        self.num_blocks = kv_cache_memory_bytes // per_block
        if self.num_blocks * block_size < max_model_len:
            raise ModelLoadError(
                f"--kv-cache-memory {kv_cache_memory_bytes} bytes holds {self.num_blocks * block_size} tokens, "
                f"fewer than max_model_len {max_model_len}; raise it or lower --max-model-len")
        self.scratch_block = self.num_blocks
        shape = (self.num_blocks + 1, block_size, arch.num_kv_heads, arch.head_dim)
        caches = zeroed_cache(2 * arch.num_layers, shape, dtype, device)
        self.kv_caches = [(caches[2 * i], caches[2 * i + 1]) for i in range(arch.num_layers)]

    def prepare(self, sched: SchedulerOutput, decode_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Build (input_ids int64 [T], positions int64 [T], metadata, sample_idx int64 [num_sampling]).

        sample_idx holds the flat row of the last token of each sequence that samples this step.
        `decode_only` builds the compiled step's metadata (`meta.decode_only` set, block tables at
        least MIN_BLOCK_TABLE_WIDTH wide) with every token as a one-token row of its own: a
        sequence scheduling n tokens from position p becomes n rows sharing its block table, with
        KV lengths p+1 .. p+n. The step writes every row's K/V before any row attends, and each
        row masks keys past its own position, so this is the causal attention of the n-token query
        (how a short prefill chunk or a grammar-forced run goes through the decode graph).
        """
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        cu = [0]
        sample_idx: list[int] = []
        for item in sched.scheduled:
            seq, n = item.seq, item.num_scheduled_tokens
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start:start + n])
            pos = range(start, start + n)
            positions.extend(pos)
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            if decode_only:
                query_lens.extend([1] * n)
                seq_lens.extend(range(start + 1, start + n + 1))
                tables.extend([table] * n)
                cu.extend(range(cu[-1] + 1, cu[-1] + n + 1))
            else:
                query_lens.append(n)
                seq_lens.append(start + n)
                tables.append(table)
                cu.append(cu[-1] + n)
            if item.samples:
                sample_idx.append(cu[-1] - 1)
        max_blocks = max(len(table) for table in tables)
        if decode_only:
            max_blocks = max(max_blocks, MIN_BLOCK_TABLE_WIDTH)
        block_tables = torch.tensor([table + [-1] * (max_blocks - len(table)) for table in tables], dtype=torch.int32)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=block_tables.to(dev),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_lens=query_lens,
            seq_lens_list=seq_lens,
            num_decodes=sum(1 for q in query_lens if q == 1),
            block_size=bs,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            decode_only=decode_only,
        )
        return (torch.tensor(input_ids, dtype=torch.int64, device=dev),
                torch.tensor(positions, dtype=torch.int64, device=dev), meta,
                torch.tensor(sample_idx, dtype=torch.int64, device=dev))

    def prepare_lora(self, sched: SchedulerOutput) -> LoraBatch | None:
        """The step's per-token LoRA slots (token_slots int32 [T], -1 = base); None when no
        scheduled sequence uses an adapter. Every adapter in the step is resident (the scheduler
        acquired its slot at admission)."""
        lora = self.lora
        if lora is None or not any(item.seq.adapter_id for item in sched.scheduled):
            return None
        seq_slots = [lora.slot_of(item.seq.adapter_id) if item.seq.adapter_id else -1 for item in sched.scheduled]
        assert all(slot >= 0 for slot, item in zip(seq_slots, sched.scheduled) if item.seq.adapter_id)
        return lora.prepare_batch(seq_slots, [item.num_scheduled_tokens for item in sched.scheduled])

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> torch.Tensor:
        """Run the step; returns float32 [num_sampling, vocab_size] logits on the CPU, in the order
        of the sampling sequences in `sched.scheduled`. Writes this step's K/V into the cache."""
        lora = self.prepare_lora(sched)
        compiled = self.compiled
        decode_only = (compiled is not None and compiled.ready and lora is None
                       and runs_compiled([item.num_scheduled_tokens for item in sched.scheduled],
                                         [item.seq.num_computed_tokens + item.num_scheduled_tokens
                                          for item in sched.scheduled]))
        input_ids, positions, meta, sample_idx = self.prepare(sched, decode_only)
        if decode_only:
            logits = self._execute_compiled(input_ids, positions, meta, sample_idx)
            if logits is not None:
                return logits
            meta = dataclasses.replace(meta, decode_only=False)
        self.num_eager_steps += 1
        hidden = self.model(input_ids, positions, self.kv_caches, meta, lora)
        if sample_idx.numel() == 0:
            return torch.empty((0, self.arch.vocab_size), dtype=torch.float32)
        logits = self.model.compute_logits(hidden[sample_idx])
        return logits.float().cpu()

    def _execute_compiled(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                          sample_idx: torch.Tensor) -> torch.Tensor | None:
        """The decode step through the compiled graph: logits of the sampling rows, or None (the
        caller then runs the step eagerly) when the graph cannot run it; that turns the compiled
        step off for the rest of the run, with a warning, rather than retrying every step."""
        assert self.compiled is not None
        try:
            logits = self.compiled.run(input_ids, positions, self.kv_caches, meta, sample_idx)
        except CompiledDecodeUnavailable as error:
            logger.warning("compiled decode step turned off, running eager from now on: %s", error)
            self.compiled = None
            return None
        self.num_compiled_steps += 1
        return logits
