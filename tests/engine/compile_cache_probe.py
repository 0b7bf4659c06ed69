"""One fresh process's compile of a tiny model's decode step against a given on-disk cache folder:
`python -m tests.engine.compile_cache_probe MODEL_DIR CACHE_DIR [CROSSOVER_ROWS]` (from the repository root) prints
one JSON line with the warm-up's seconds, what torch's caches served (`CompiledDecode.cache_stats`),
the number of graphs it compiled, and the compiled and eager float32 logits of three decode
steps: 1 sequence (a graph of its own), 2 (the int4 copies, at most `CROSSOVER_ROWS` rows) and
`CROSSOVER_ROWS` + 1 (the bf16 oneDNN copies past it). Run by test_compile_cache.py, three times
on one folder: the second process must load what the first compiled, the third (another crossover)
must compile its own graphs.
"""

from __future__ import annotations

import json
import sys

import torch

from engine.attention_metadata import AttentionMetadata
from engine.compiled_decode import CompiledDecode
from engine.model_loader import load_model_weights
from engine.model_runner import ModelRunner, kv_block_bytes

CROSSOVER_ROWS = 2      # int4 up to 2 rows, bf16 past it: a graph on each side (and one for 1 row)
NUM_BLOCKS = 8


def decode(num_seqs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A decode step of `num_seqs` one-token sequences, sequence i in block i at position 0."""
    ints = {"dtype": torch.int32}
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_seqs) * 16,
        block_tables=torch.stack([torch.arange(num_seqs, **ints), torch.full((num_seqs,), -1, **ints)], dim=1),
        cu_seqlens_q=torch.arange(num_seqs + 1, **ints), seq_lens=torch.ones(num_seqs, **ints),
        query_lens=[1] * num_seqs, seq_lens_list=[1] * num_seqs, num_decodes=num_seqs, block_size=16,
        max_query_len=1, max_seq_len=1, decode_only=True)
    return torch.arange(5, 5 + 7 * num_seqs, 7), torch.zeros(num_seqs, dtype=torch.int64), meta


def main(model_dir: str, cache_dir: str, crossover_rows: int = CROSSOVER_ROWS) -> None:
    torch.set_num_threads(1)
    model, arch, _ = load_model_weights(model_dir, torch.float32, torch.device("cpu"), 128, "int4", crossover_rows)
    per_block = kv_block_bytes(arch.num_layers, 16, arch.num_kv_heads, arch.head_dim, torch.float32)
    runner = ModelRunner(model, arch, torch.device("cpu"), torch.float32, 16, NUM_BLOCKS * per_block, 128)
    compiled = CompiledDecode(model, cache_dir=cache_dir)
    compiled.warm_up(runner.kv_caches, runner.scratch_block)
    result: dict = {"compile_seconds": compiled.compile_seconds, "cache_stats": compiled.cache_stats,
                    "graphs": len(compiled.graph_seconds), "compiled": [], "eager": []}
    with torch.inference_mode():
        for num_seqs in (1, 2, crossover_rows + 1):
            input_ids, positions, meta = decode(num_seqs)
            result["compiled"].append(compiled.run(input_ids, positions, runner.kv_caches, meta).tolist())
            eager_meta = AttentionMetadata(**{**{f: getattr(meta, f) for f in meta.__dataclass_fields__},
                                              "decode_only": False})
            hidden = model(input_ids, positions, runner.kv_caches, eager_meta)
            result["eager"].append(model.compute_logits(hidden).tolist())
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(arg) for arg in sys.argv[3:4]))
