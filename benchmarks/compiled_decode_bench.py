#!/usr/bin/env python3
"""Decode forward per step, eager vs the compiled decode step, on SmolLM2 (in-process). Prints
ONE JSON line.

Loads the default SmolLM2 GGUF through engine/ (float32 activations; `--quantization` as the
server's flag, default `auto`: the GGUF's int4 layers and their bf16 oneDNN copies, as served; or
`--dtype bfloat16`: SmolLM2 loaded in bf16 (the server's --dtype), KV cache too), fills a KV cache of blocks handed out in shuffled order (as in a
server that has run a while) for `--batches` (B x context; the K/V of one real prefill copied to
every sequence) and times, per batch, the model forward plus the LM head of one decode step:
eager (the engine's path today: gather + SDPA attention) against `CompiledDecode`
(engine/compiled_decode.py), taking turns, `--repeats` each, medians in ms. It also times one
step's attention alone (30 layers' worth, same cache): `_decode_ref` (index_select gather + SDPA)
against compiled `paged_decode_attention`; the warm-up (compile) seconds, in all and per graph, "cold" with an
empty inductor cache (`--inductor-cache` a fresh folder) and "warm" on a second run with the same
folder (`cache_stats`: what AOTAutograd's and inductor's FX graph caches served; `--freezing`
compiles with the weights as constants, which those caches refuse); and the logit difference between the
two paths. Not a test: figures depend on the machine and on what else runs on it; compare ratios
from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


MAX_MODEL_LEN = 1024
BLOCK_SIZE = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1x128,32x256", help="comma list of BxCONTEXT")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--quantization", choices=["auto", "none", "int8", "int4"], default="auto")
    parser.add_argument("--crossover-rows", type=int, default=None,
                        help="int4/bf16 crossover (default: measured at load; pin it to reuse a warm cache)")
    parser.add_argument("--int4-kernel", choices=["auto", "w4a8", "tinygemm"], default="auto",
                        help="kernel of the int4 copies (the server's --int4-kernel)")
    parser.add_argument("--freezing", action="store_true", help="compile with inductor freezing (not cacheable)")
    parser.add_argument("--inductor-cache", default=None, help="TORCHINDUCTOR_CACHE_DIR for this run")
    return parser.parse_args()


def fill_cache(runner, batch: int, context: int, seed: int) -> list[list[int]]:
    """Real K/V for `batch` sequences of `context` tokens in shuffled blocks; their block tables.
    One eager prefill of `context` random tokens, its blocks then copied to every sequence's."""
    import torch

    bs = runner.block_size
    per_seq = -(-(context + 1) // bs)
    order = list(range(runner.num_blocks))
    random.Random(seed).shuffle(order)
    tables = [order[i * per_seq:(i + 1) * per_seq] for i in range(batch)]
    ids = torch.randint(0, 49152, (context,), generator=torch.Generator().manual_seed(seed))
    first = tables[0]
    meta = prefill_metadata(runner, first, context)
    runner.model(ids, torch.arange(context), runner.kv_caches, meta)
    src = torch.tensor(first)
    for table in tables[1:]:
        for k_cache, v_cache in runner.kv_caches:
            k_cache[torch.tensor(table)] = k_cache[src]
            v_cache[torch.tensor(table)] = v_cache[src]
    return tables


def prefill_metadata(runner, table: list[int], context: int):
    import torch

    from engine.attention_metadata import AttentionMetadata

    bs = runner.block_size
    return AttentionMetadata(
        slot_mapping=torch.tensor([table[p // bs] * bs + p % bs for p in range(context)]),
        block_tables=torch.tensor([table], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, context], dtype=torch.int32),
        seq_lens=torch.tensor([context], dtype=torch.int32), query_lens=[context], seq_lens_list=[context],
        num_decodes=0, block_size=bs, max_query_len=context, max_seq_len=context)


def decode_inputs(runner, tables: list[list[int]], context: int, decode_only: bool):
    import torch

    from engine.attention_metadata import AttentionMetadata

    bs, batch = runner.block_size, len(tables)
    width = max(2, len(tables[0]))
    block_tables = torch.full((batch, width), -1, dtype=torch.int32)
    block_tables[:, :len(tables[0])] = torch.tensor(tables, dtype=torch.int32)
    slots = [t[context // bs] * bs + context % bs for t in tables]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=block_tables,
        cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32),
        seq_lens=torch.full((batch,), context + 1, dtype=torch.int32), query_lens=[1] * batch,
        seq_lens_list=[context + 1] * batch, num_decodes=batch, block_size=bs, max_query_len=1,
        max_seq_len=context + 1, decode_only=decode_only)
    ids = torch.randint(0, 49152, (batch,), generator=torch.Generator().manual_seed(batch))
    return ids, torch.full((batch,), context), meta


def alternate(fns: dict, repeats: int) -> dict[str, float]:
    """Median ms of each callable, called in turns (one warm-up call each first)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: round(1000 * statistics.median(t), 3) for name, t in times.items()}


def main() -> int:
    args = parse_args()
    if args.inductor_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(args.inductor_cache).resolve())
    sys.path.insert(0, str(ROOT))
    import torch

    from engine.compiled_decode import CompiledDecode
    from engine.model_loader import load_model
    from engine.model_runner import ModelRunner, kv_block_bytes
    from kernels.paged_attention import _decode_ref, paged_decode_attention

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    dtype = getattr(torch, args.dtype)
    # loaded in `dtype` (the server's --dtype): a float32 load holds oneDNN-packed weights that .to() cannot convert
    loaded = load_model(None, dtype, torch.device("cpu"), MAX_MODEL_LEN, args.quantization, args.crossover_rows,
                        args.int4_kernel)
    model, arch = loaded.model, loaded.arch
    batches = [tuple(int(x) for x in b.split("x")) for b in args.batches.split(",")]
    # enough for every case's contexts, and at least one max_model_len sequence (ModelRunner's check)
    num_blocks = max(max(b * (-(-(c + 1) // BLOCK_SIZE)) for b, c in batches), MAX_MODEL_LEN // BLOCK_SIZE) + 8
    per_block = kv_block_bytes(arch.num_layers, BLOCK_SIZE, arch.num_kv_heads, arch.head_dim, dtype)
    runner = ModelRunner(model, arch, torch.device("cpu"), dtype, BLOCK_SIZE, num_blocks * per_block, MAX_MODEL_LEN)
    compiled = CompiledDecode(model, freezing=args.freezing)
    compiled.warm_up(runner.kv_caches, runner.scratch_block)
    result: dict = {"dtype": args.dtype, "quantization": args.quantization, "threads": torch.get_num_threads(),
                    "weights": loaded.model.weight_summary.describe(),
                    "freezing": args.freezing, "warm_up_s": round(compiled.compile_seconds or 0.0, 1),
                    "graph_s": [round(t, 1) for t in compiled.graph_seconds],
                    "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                    "cache_stats": compiled.cache_stats, "cases": []}
    attention = torch.compile(paged_decode_attention, dynamic=False)
    with torch.inference_mode():
        for batch, context in batches:
            tables = fill_cache(runner, batch, context, seed=batch)
            ids, pos, meta = decode_inputs(runner, tables, context, decode_only=False)
            _, _, cmeta = decode_inputs(runner, tables, context, decode_only=True)
            caches = runner.kv_caches
            eager_logits = model.compute_logits(model(ids, pos, caches, meta))
            compiled_logits = compiled.run(ids, pos, caches, cmeta)
            forward = alternate({
                "eager_ms": lambda: model.compute_logits(model(ids, pos, caches, meta)),
                "compiled_ms": lambda: compiled.run(ids, pos, caches, cmeta),
            }, args.repeats)
            k_cache, v_cache = caches[0]
            for tensor, dim in ((cmeta.block_tables, 0), (cmeta.block_tables, 1), (cmeta.seq_lens, 0)):
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
            q = torch.randn(batch, arch.num_heads, arch.head_dim).to(dtype)
            scale = arch.head_dim**-0.5
            attn = alternate({
                "gather_sdpa_ms": lambda: _decode_ref(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                                      context + 1, scale),
                "in_place_compiled_ms": lambda: attention(q, k_cache, v_cache, cmeta.block_tables,
                                                          cmeta.seq_lens, scale),
            }, args.repeats)
            result["cases"].append({
                "batch": batch, "context": context,
                "forward": {**forward, "speedup": round(forward["eager_ms"] / forward["compiled_ms"], 2),
                            "tok_s_compiled": round(1000 * batch / forward["compiled_ms"], 1)},
                "attention_per_step": {name: round(ms * arch.num_layers, 2) for name, ms in attn.items()},
                "max_abs_logit_diff": float((eager_logits - compiled_logits).abs().max()),
                "greedy_agree": float((eager_logits.argmax(-1) == compiled_logits.argmax(-1)).float().mean()),
            })
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
