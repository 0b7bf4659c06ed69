"""Our paged CausalLM against transformers on tiny random models (float32).

Three prompts are prefilled in chunks over two forwards (the second mixing a decode with two
prefill chunks), then decoded greedily in a shrinking batch; every computed row's logits must
match transformers' logits at that position within atol 1e-4, and the 32 greedy tokens must equal
transformers' own greedy tokens.
"""

from __future__ import annotations

import pytest
import torch
from paged_batch import PagedBatch

from engine.errors import ModelLoadError
from engine.model_loader import load_model_weights
from engine.models import MODEL_REGISTRY, get_model_class
from engine.models.quantized_tensor import Int8Channels
from kernels.cpu_ops import cpu_supports_common_ops
from tests.conftest import fake_quantized_copy

PROMPT_LENS = (5, 17, 33)
FIRST_CHUNK = (5, 9, 20)
NUM_NEW_TOKENS = 32
ATOL = 1e-4


def hf_greedy(hf_model, prompt: list[int], num_tokens: int) -> list[int]:
    """transformers' greedy continuation, one full forward per token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = hf_model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def paged_greedy(
    model, arch, prompts: list[list[int]]
) -> tuple[list[list[int]], list[dict[int, torch.Tensor]]]:
    """Our greedy continuations and, per sequence, the logits row of every position we computed."""
    batch = PagedBatch(arch, num_blocks=96, block_size=4)
    outputs: list[list[int]] = [[] for _ in prompts]
    logits_at: list[dict[int, torch.Tensor]] = [{} for _ in prompts]
    schedule = [[(i, prompt[:n]) for i, (prompt, n) in enumerate(zip(prompts, FIRST_CHUNK))]]
    while schedule:
        chunks = schedule.pop()
        input_ids, positions, meta = batch.step(chunks)
        logits = model.compute_logits(model(input_ids, positions, batch.kv_caches, meta))
        assert logits.dtype == torch.float32 and logits.shape == (len(input_ids), arch.vocab_size)
        row = 0
        for seq_id, token_ids in chunks:
            for offset in range(len(token_ids)):
                logits_at[seq_id][int(positions[row + offset])] = logits[row + offset]
            row += len(token_ids)
            if batch.num_computed[seq_id] >= len(prompts[seq_id]):
                outputs[seq_id].append(int(logits[row - 1].argmax()))
        decodes = [(i, [out[-1]]) for i, out in enumerate(outputs) if 0 < len(out) < NUM_NEW_TOKENS]
        prefills = [
            (i, p[batch.num_computed[i] :]) for i, p in enumerate(prompts) if batch.num_computed[i] < len(p)
        ]
        if decodes or prefills:
            schedule.append(decodes + prefills)
    return outputs, logits_at


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_paged_forward_matches_transformers(tiny_model_dir, architecture: str) -> None:
    folder, hf_model = tiny_model_dir(architecture)
    model, arch, max_model_len = load_model_weights(str(folder), torch.float32, torch.device("cpu"))
    assert (arch.architecture, max_model_len) == (architecture, 256)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, arch.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]

    outputs, logits_at = paged_greedy(model, arch, prompts)

    for prompt, output, rows in zip(prompts, outputs, logits_at):
        assert output == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS)
        full = prompt + output
        assert sorted(rows) == list(range(len(full) - 1))
        with torch.no_grad():
            expected = hf_model(torch.tensor([full])).logits[0, :-1]
        ours = torch.stack([rows[pos] for pos in range(len(full) - 1)])
        torch.testing.assert_close(ours, expected, atol=ATOL, rtol=0)


def test_bfloat16_model_tracks_float32(tiny_model_dir) -> None:
    folder, _ = tiny_model_dir("LlamaForCausalLM")
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, arch, _ = load_model_weights(str(folder), dtype, torch.device("cpu"))
        assert model.embed_tokens.dtype == dtype
        batch = PagedBatch(arch, num_blocks=16, block_size=4, dtype=dtype)
        input_ids, positions, meta = batch.step([(0, list(range(10, 30)))])
        logits[dtype] = model.compute_logits(model(input_ids, positions, batch.kv_caches, meta))
    assert logits[torch.bfloat16].dtype == torch.float32
    scale = logits[torch.float32].abs().max()
    assert (logits[torch.bfloat16] - logits[torch.float32]).abs().max() < 0.05 * scale


# Observed max |logit diff| / max |logit| on the project machine: against the float32 load of the
# fake-quantized checkpoint (the same weights; only the bf16 rounding of activations differs)
# 0.011-0.026; against the float32 load of the original, int8 0.04-0.06 and int4 0.51-0.53 (these
# random weights, N(0, 0.15), put int4's group step at ~13 % of a weight's spread, and nothing in a
# random 2-layer model damps the error). Bounds leave about 2x room.
FAKE_QUANT_BOUND = 0.05
ORIGINAL_BOUNDS = {"int8": 0.12, "int4": 0.9}


def teacher_forced_logits(folder, quantization: str) -> torch.Tensor:
    """A 20-token prefill (rows past the crossover of 4: the bf16 copies) then 12 decode rows
    (the int8/int4 copies); logits of every row `[32, vocab]`."""
    model, arch, _ = load_model_weights(str(folder), torch.float32, torch.device("cpu"), None, quantization, 4)
    assert model.weight_summary.formats["layer"].split(" + ")[0].split(" (")[0] == quantization   # "int4 (w4a8)"
    batch = PagedBatch(arch, num_blocks=16, block_size=4)
    rows = []
    for chunk in [list(range(10, 30))] + [[token] for token in range(40, 52)]:
        input_ids, positions, meta = batch.step([(0, chunk)])
        rows.append(model.compute_logits(model(input_ids, positions, batch.kv_caches, meta)))
    return torch.cat(rows)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_quantized_model_matches_its_dequantized_weights(tiny_model_dir, tmp_path, architecture: str,
                                                         quantization: str) -> None:
    """A float checkpoint quantized at load, against float32 loads of its fake-quantized copy
    (tight: the same weights) and of the original (loose: the quantization error itself)."""
    folder, _ = tiny_model_dir(architecture)
    quantized = teacher_forced_logits(folder, quantization)
    same_weights = teacher_forced_logits(fake_quantized_copy(folder, tmp_path / "fake", quantization), "none")
    original = teacher_forced_logits(folder, "none")
    scale = original.abs().max()
    assert (quantized - same_weights).abs().max() / scale < FAKE_QUANT_BOUND
    assert (quantized - original).abs().max() / scale < ORIGINAL_BOUNDS[quantization]


def test_registry_entries_import_and_unknown_names_fail() -> None:
    for name in MODEL_REGISTRY:
        assert issubclass(get_model_class(name), torch.nn.Module)
    with pytest.raises(ModelLoadError, match="supported: .*LlamaForCausalLM"):
        get_model_class("GPT2LMHeadModel")


def test_a_tied_int8_head_and_the_lookup_hold_one_table(tiny_model_dir) -> None:
    """With tied embeddings the INT8 head's copy is the lookup's table (the same tensor, in the
    head's kernel layout: row-major for int8pack, packed for w8a16), counted once, and the lookup
    returns the int8 rows of the checkpoint's embedding, dequantized."""
    folder, hf_model = tiny_model_dir("Qwen3ForCausalLM")
    model, _, _ = load_model_weights(str(folder), torch.float32, torch.device("cpu"), None, "int8", 4)
    head, lookup = model.lm_head, model.embed_tokens
    assert head.small_kernel == ("w8a16" if cpu_supports_common_ops() else "int8pack")
    held = head.w8a16_weight if head.small_kernel == "w8a16" else head.int8_weight
    assert lookup.int8_rows is held and lookup.shares_rows
    assert lookup.resident_bytes() == lookup.int8_scales.numel() * 4        # its scales only
    ids = torch.arange(hf_model.config.vocab_size)
    expected = Int8Channels.from_float(hf_model.model.embed_tokens.weight.detach()).dequantize()
    torch.testing.assert_close(lookup(ids), expected, atol=0, rtol=0)
