#!/usr/bin/env python3
"""Weight formats on SmolLM2 (issue 12, item 1): resident bytes per copy, the decode-step forward
(model + LM head) at B = 1, 8, 32 for today's float32 oneDNN path (`--quantization none`) against
the GGUF's own formats (`auto`: int4 layers + int8 head, bf16 copies past the measured crossover)
and against each copy forced for every row count, and the server's RSS after load.

In-process and quiet: every variant is loaded once, then the variants take turns for `--rounds`
rounds (median of `--steps` decode steps each), so load from other processes spreads over all of
them; each variant's figure is the median of its steps, reported as the median and the best of
its rounds (the best round is the one other processes disturbed least); report ratios. Prints
ONE JSON line.

  python benchmarks/weights_bench.py [--rss]      # --rss also starts two servers (~1 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.server_process import start_server, stop_servers  # noqa: E402
from engine.attention_metadata import AttentionMetadata  # noqa: E402
from engine.model_loader import default_model_path, load_model_weights  # noqa: E402
from engine.threads import configure_threads  # noqa: E402

BATCHES = (1, 8, 32)
CONTEXT = 128
BLOCK_SIZE = 16
FORCED_ROWS = 10**9   # a crossover no batch reaches: the int4/int8 copies for every row count


def decode_batch(batch: int, context: int, arch, num_blocks: int):
    """(input_ids, positions, meta, kv_caches) of one decode step: `batch` sequences at `context`
    cached tokens each, their blocks interleaved as in a long-running server."""
    blocks_per_seq = context // BLOCK_SIZE + 1
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))[:batch * blocks_per_seq]
    tables = order.view(batch, blocks_per_seq).to(torch.int32)
    slots = tables[:, context // BLOCK_SIZE].long() * BLOCK_SIZE + context % BLOCK_SIZE
    seq_lens = [context + 1] * batch
    meta = AttentionMetadata(
        slot_mapping=slots, block_tables=tables, cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_lens=[1] * batch, seq_lens_list=seq_lens,
        num_decodes=batch, block_size=BLOCK_SIZE, max_query_len=1, max_seq_len=context + 1)
    shape = (num_blocks, BLOCK_SIZE, arch.num_kv_heads, arch.head_dim)
    gen = torch.Generator().manual_seed(1)
    kv = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in range(arch.num_layers)]
    ids = torch.randint(0, arch.vocab_size, (batch,), generator=gen)
    return ids, torch.full((batch,), context, dtype=torch.int64), meta, kv


def step_ms(model, batch_inputs, steps: int) -> float:
    """Median ms of one decode forward + LM head over `steps` runs (after one warm-up)."""
    ids, positions, meta, kv = batch_inputs
    times = []
    with torch.inference_mode():
        for i in range(steps + 1):
            start = time.perf_counter()
            model.compute_logits(model(ids, positions, kv, meta))
            if i:
                times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def set_crossover(model, rows: int) -> None:
    """Force every projection onto one side (benchmark only; keeps both copies)."""
    for module in model.modules():
        if hasattr(module, "crossover_rows") and module.small is not None:
            module.crossover_rows = rows


def server_rss_mib(args: list[str]) -> float:
    """VmRSS of a healthy `structserve serve --kv-cache-memory 512MiB --no-compile` process, MiB
    (the weights' and cache's memory, without the compiler's)."""
    server = start_server(["--kv-cache-memory", "512MiB", "--no-compile", *args])
    try:
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024
    finally:
        stop_servers(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rss", action="store_true", help="also measure two servers' RSS after load")
    args = parser.parse_args()
    threads = configure_threads(None)
    path, cpu = default_model_path(), torch.device("cpu")
    reference, arch, _ = load_model_weights(path, torch.float32, cpu, 1024, "none")
    quantized, _, _ = load_model_weights(path, torch.float32, cpu, 1024, "auto")
    summary = quantized.weight_summary
    crossover = dict(summary.crossover_rows)
    variants = {"float32 oneDNN (none)": (reference, None), "auto (measured crossover)": (quantized, None),
                "int4/int8 copies, every B": (quantized, FORCED_ROWS), "bf16 copies, every B": (quantized, 0)}
    num_blocks = max(BATCHES) * (CONTEXT // BLOCK_SIZE + 1)
    inputs = {batch: decode_batch(batch, CONTEXT, arch, num_blocks) for batch in BATCHES}
    runs: dict[str, dict[int, list[float]]] = {name: {b: [] for b in BATCHES} for name in variants}
    for _ in range(args.rounds):
        for name, (model, rows) in variants.items():
            if model is quantized:
                set_crossover(model, crossover["layer"] if rows is None else rows)
                if rows is None:
                    set_crossover(model.lm_head, crossover["head"])
            for batch in BATCHES:
                runs[name][batch].append(step_ms(model, inputs[batch], args.steps))
    medians = {name: {b: round(statistics.median(t), 2) for b, t in by_b.items()} for name, by_b in runs.items()}
    # each variant's best round: the one least disturbed by other processes on a shared machine
    best = {name: {b: round(min(t), 2) for b, t in by_b.items()} for name, by_b in runs.items()}
    base = best["float32 oneDNN (none)"]
    figures = {
        "threads": threads, "context": CONTEXT, "cpu": summary.cpu_capability, "native_bf16": summary.native_bf16,
        "formats": summary.formats, "crossover_rows": crossover,
        "resident_mib": {"none": _mib(reference.weight_summary), "auto": _mib(summary)},
        "decode_step_ms_median_of_rounds": medians,
        "decode_step_ms_best_round": best,
        "speedup_vs_float32_best_round": {name: {b: round(base[b] / ms, 2) for b, ms in by_b.items()}
                                          for name, by_b in best.items()},
    }
    if args.rss:
        figures["server_rss_mib_kv512"] = {q: round(server_rss_mib(["--quantization", q]), 1) for q in ("auto", "none")}
    print(json.dumps(figures))


def _mib(summary) -> dict[str, dict[str, float]]:
    return {role: {fmt: round(size / 2**20, 1) for fmt, size in copies.items()}
            for role, copies in summary.resident_bytes.items()}


if __name__ == "__main__":
    main()
