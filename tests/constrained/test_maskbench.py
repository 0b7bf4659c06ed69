"""MaskBench coverage (slow): every schema of /work/shared/data/maskbench on each backend.

A valid instance, serialized compactly and tokenized with SmolLM2, must be accepted token by
token and end terminated after EOS; an invalid one must be rejected at some token (its EOS
included). A schema a backend cannot compile must raise InvalidGrammar (its instances then count
as failures); any other exception, or a crash, fails the test. The floors below are the measured
rates rounded down (benchmarks/grammar_bench.py prints the same figures, with timings).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from constrained import GrammarCompiler, GrammarConfig, GrammarKind, GrammarSpec, InvalidGrammar

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)

DATA = Path("/work/shared/data/maskbench")
# Measured on the 385-schema / 1065-instance sample (xgrammar 0.2.9, llguidance 1.9.1):
# xgrammar 991/1065 = 0.9305, guidance 910/1065 = 0.8545, auto (guidance, then xgrammar) 1007/1065 = 0.9455.
MIN_PASS_RATE = {"xgrammar": 0.930, "guidance": 0.854, "auto": 0.945}
MIN_COMPILED = {"xgrammar": 384, "guidance": 303, "auto": 384}


def source_of(path: Path) -> str:
    stem = path.stem
    return stem.split("---")[0] if "---" in stem else stem.rsplit("_", 1)[0]


@pytest.fixture(scope="module")
def maskbench() -> list[tuple[Path, dict]]:
    if not DATA.is_dir():
        pytest.skip(f"{DATA} not present")
    return [(path, json.loads(path.read_text())) for path in sorted(DATA.glob("*.json"))]


def instance_passes(compiler, compiled, token_ids: list[int], valid: bool) -> bool:
    matcher = compiler.new_matcher(compiled)
    for token_id in token_ids:
        if not matcher.accept([token_id]):
            return not valid
    return valid and matcher.is_terminated()


@pytest.mark.parametrize("backend_name", ["xgrammar", "guidance", "auto"])
def test_maskbench_coverage(backend_name, maskbench, vocab_info, backends, encode):
    compiler = GrammarCompiler(vocab_info, GrammarConfig(compile_timeout_s=120), backends=backends)
    eos = vocab_info.eos_token_ids[0]
    backend = None if backend_name == "auto" else backend_name
    compiled_count = 0
    by_source: dict[str, list[int]] = {}
    for path, data in maskbench:
        counts = by_source.setdefault(source_of(path), [0, 0])
        counts[1] += len(data["tests"])
        try:
            compiled = compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(data["schema"]), backend))
        except InvalidGrammar:
            continue
        compiled_count += 1
        for test in data["tests"]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            counts[0] += instance_passes(compiler, compiled, [*encode(text), eos], test["valid"])
    compiler.close()
    passed = sum(p for p, _ in by_source.values())
    total = sum(t for _, t in by_source.values())
    report = {
        "backend": backend_name,
        "compiled": f"{compiled_count}/{len(maskbench)}",
        "pass_rate": round(passed / total, 4),
        "by_source": {s: f"{p}/{t}" for s, (p, t) in sorted(by_source.items()) if t},
    }
    logger.info("maskbench %s", json.dumps(report))
    assert compiled_count >= MIN_COMPILED[backend_name], report
    assert passed / total >= MIN_PASS_RATE[backend_name], report
