"""The compiled decode step from inductor's on-disk caches (engine/compiled_decode.py): a fresh
process compiling the same model with the same cache folder loads every graph the first process
compiled (AOTAutograd and FX graph cache hits, no misses; how much faster that is belongs to
benchmarks/compiled_decode_bench.py), and its logits
equal the first process's exactly and the eager path's to rounding. The model is the tiny random
Llama with int4 layers and bf16 oneDNN copies past 2 rows (tests/engine/compile_cache_probe.py),
so its three graphs (one sequence; both weight-copy regimes), and the oneDNN operator as a graph
input, go through the caches."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.server_process import ROOT
from tests.conftest import save_tiny_model

pytestmark = pytest.mark.slow


def probe(model_dir: str, cache_dir: str) -> dict:
    """The JSON line of one compile_cache_probe process."""
    done = subprocess.run([sys.executable, "-m", "tests.engine.compile_cache_probe", model_dir, cache_dir],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_step_from_the_cache(tmp_path) -> None:
    model_dir, cache_dir = tmp_path / "LlamaForCausalLM", tmp_path / "inductor"
    save_tiny_model(model_dir, "LlamaForCausalLM")
    cold = probe(str(model_dir), str(cache_dir))
    warm = probe(str(model_dir), str(cache_dir))
    graphs = cold["cache_stats"]["fx_graph_misses"]
    assert graphs == cold["graphs"] == 3 and cold["cache_stats"]["fx_graph_hits"] == 0, cold["cache_stats"]
    assert cold["cache_stats"]["aot_autograd_misses"] == graphs
    assert warm["cache_stats"]["fx_graph_hits"] == graphs and warm["cache_stats"]["fx_graph_misses"] == 0, \
        warm["cache_stats"]
    assert warm["cache_stats"]["aot_autograd_hits"] == graphs and warm["cache_stats"]["aot_autograd_misses"] == 0
    assert warm["compiled"] == cold["compiled"]
    for compiled, eager in zip(warm["compiled"], warm["eager"]):
        # inductor fuses the norms and rounds activations to bf16 at other points than eager:
        # within one unit of bf16's last place, 2**-7 relative
        torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), atol=1e-3, rtol=2**-7)
