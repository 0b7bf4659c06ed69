"""LoRA on a quantized base (tiny Llama quantized at load): adapters apply on the outputs of the
int8/int4 and bf16 copies unchanged, so each request's greedy tokens through the engine equal
transformers + peft on the base's fake-quantized weights (the float values the quantized model
holds). Prompts of 12 tokens prefill through the bf16 copies (past the crossover of 4 rows), and
the decodes of up to 3 requests run through the int8/int4 copies."""

from __future__ import annotations

import pytest
from lora_support import (
    greedy_request,
    make_adapters,
    make_engine,
    peft_model,
    reference_greedy,
    run_to_completion,
    save_tiny_llama,
)

from engine.models.weight_format import cpu_has_native_bf16
from lora.config import LoraConfig, LoraModuleSpec
from tests.conftest import fake_quantized_copy

NUM_NEW_TOKENS = 8
PROMPTS = {None: list(range(3, 15)), "ad1": list(range(40, 52)), "ad2": list(range(90, 102))}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_adapters_on_a_quantized_base_match_peft_on_its_weights(tmp_path, quantization: str) -> None:
    save_tiny_llama(tmp_path / "base")
    specs = {"ad1": (4, 8, ["q_proj", "v_proj", "down_proj"], False), "ad2": (8, 8, ["o_proj", "gate_proj"], True)}
    folders = make_adapters(tmp_path, tmp_path / "base", specs)
    fake = fake_quantized_copy(tmp_path / "base", tmp_path / "fake", quantization)
    lora = LoraConfig(max_loras=2, max_lora_rank=8,
                      modules=tuple(LoraModuleSpec(name, str(folder)) for name, folder in folders.items()))
    # tinygemm: a weight-only kernel, so the float reference on the held weights is exact up to bf16
    # activations; the w4a8 kernel also rounds activations to int8 per group, which flips near-tied
    # tokens of this random model (its products are checked in tests/kernels/test_w4a8_linear.py)
    engine = make_engine(tmp_path / "base", lora, quantization=quantization, crossover_rows=4, int4_kernel="tinygemm")
    large = "bf16" if cpu_has_native_bf16() else "fp32"     # the CPU's large-batch format
    held, served_large = engine.runner.model.weight_summary.formats["layer"].split(" + ")
    assert held.split(" (")[0] == quantization and served_large == large   # "int4 (tinygemm)"
    for adapter, prompt in PROMPTS.items():
        engine.add_request(greedy_request(f"r-{adapter}", prompt, NUM_NEW_TOKENS, adapter))
    outputs = run_to_completion(engine)
    base = peft_model(fake, None)
    for adapter, prompt in PROMPTS.items():
        expected, _ = reference_greedy(peft_model(fake, folders[adapter]) if adapter else base, prompt, NUM_NEW_TOKENS)
        assert outputs[f"r-{adapter}"] == expected, adapter
        if adapter:   # the adapter changes these tokens: the comparison would catch it not being applied
            assert expected != reference_greedy(base, prompt, NUM_NEW_TOKENS)[0], adapter
