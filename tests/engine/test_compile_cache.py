"""The compiled decode step from inductor's on-disk caches (engine/compiled_decode.py): a fresh
process compiling the same model with the same cache folder loads every graph the first process
compiled (AOTAutograd and FX graph cache hits, no misses; how much faster that is belongs to
benchmarks/compiled_decode_bench.py), and its logits
equal the first process's exactly and the eager path's to rounding. The model is the tiny random
Llama with int4 layers and bf16 oneDNN copies past 2 rows (tests/engine/compile_cache_probe.py),
so its three graphs (one sequence; both weight-copy regimes), and the oneDNN operator as a graph
input, go through the caches; a start with another crossover compiles graphs of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.server_process import ROOT
from tests.conftest import save_tiny_model

pytestmark = pytest.mark.slow


def probe(model_dir: str, cache_dir: str, *crossover_rows: int) -> dict:
    """The JSON line of one compile_cache_probe process (its CROSSOVER_ROWS unless given)."""
    done = subprocess.run([sys.executable, "-m", "tests.engine.compile_cache_probe", model_dir, cache_dir,
                           *map(str, crossover_rows)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_step_and_another_crossover_compiles_its_own(tmp_path) -> None:
    """Three processes on one cache folder. The second loads every graph the first compiled, with
    the same logits. The third projects past 4 rows instead of 3 (the crossover is measured at load,
    so it can differ between starts): its 2-4 rows graph has the same FX code as the cached 2-3 rows
    one, which inductor's FX graph cache would serve with its `rows <= 3` guard, so that the
    warm-up's 4-rows check needs a new graph and the probe fails. Each graph's row range is part of
    its cache key (CompiledDecode.cache_key_tag), so all three of its graphs are new."""
    model_dir, cache_dir = tmp_path / "LlamaForCausalLM", tmp_path / "inductor"
    save_tiny_model(model_dir, "LlamaForCausalLM")
    cold = probe(str(model_dir), str(cache_dir), 3)
    warm = probe(str(model_dir), str(cache_dir), 3)
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
    wider = probe(str(model_dir), str(cache_dir), 4)
    assert wider["graphs"] == 3 and wider["cache_stats"]["fx_graph_misses"] == 3, wider["cache_stats"]
    for compiled, eager in zip(wider["compiled"], wider["eager"]):
        torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), atol=1e-3, rtol=2**-7)
