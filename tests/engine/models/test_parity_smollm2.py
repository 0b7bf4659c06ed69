"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) loaded by us against transformers' own GGUF
loader, both float32: same logits within atol 1e-3 (observed: bit-identical) and the same 32
greedy tokens for two chat prompts decoded together in one paged batch. The served default's
compiled decode step (engine/compiled_decode.py, all three graphs) against that model's eager
forward: logits to rounding and the same greedy tokens where they are clear. (The float32 path's
compiled step is compared on tiny models, tests/engine/test_compiled_decode.py.)"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from paged_batch import PagedBatch

from engine.compiled_decode import CompiledDecode
from engine.config import EngineConfig
from engine.model_loader import LoadedModel, default_model_path, load_model_weights
from engine.step_threads import StepThreads, plan_step_threads
from engine.threads import available_cores
from tests.conftest import COMPILED_CROSSOVER_ROWS, SERVER_MAX_MODEL_LEN, smollm2_gguf

pytestmark = pytest.mark.slow
NUM_NEW_TOKENS = 32
ATOL = 1e-3
MIN_CLEAR_MARGIN = 0.25   # logits; a smaller lead is a near-tie that rounding may flip
# compiled against eager on the quantized default: both round activations (to bf16 for the
# tinygemm/int8/bf16 kernels, to int8 per group of 32 for the w4a8 kernel) at inputs that differ in
# the last bits once inductor fuses the float32 ops before them, and an int8 step is coarser than a
# bf16 one. Observed on the project machine (logit standard deviation 5.9): max |logit diff| per
# step 0.16-0.59 with tinygemm; with w4a8 0.1-0.3 on the bf16 steps of 9 rows and 0.25-0.8 on its own
# steps (1.56 once), within the 2.0 that either kernel keeps against float32 weights
# (test_quantized_smollm2.py: 1.15 and 1.20 there)
MAX_COMPILED_DIFF = {"tinygemm": 1.0, "w4a8": 2.0}
QUESTIONS = ["What is the capital of France?", "Write a haiku about paged attention."]


@pytest.fixture(scope="module")
def loaded(smollm2_float32) -> LoadedModel:
    """Our float32 load of the default model (session fixture, conftest.py)."""
    return smollm2_float32


def hf_greedy(hf_model, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the logits `[NUM_NEW_TOKENS, vocab]` each was taken from."""
    cache_arg = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
    tokens, rows = [], []
    with torch.no_grad():
        out = hf_model(torch.tensor([prompt]), use_cache=True)
        for _ in range(NUM_NEW_TOKENS):
            logits = out.logits[0, -1]
            rows.append(logits)
            tokens.append(int(logits.argmax()))
            kv = {cache_arg: getattr(out, cache_arg)}  # transformers renamed past_key_values to cache
            out = hf_model(torch.tensor([[tokens[-1]]]), use_cache=True, **kv)
    return tokens, torch.stack(rows)


def test_loaded_model_describes_smollm2(loaded: LoadedModel) -> None:
    arch = loaded.arch
    assert loaded.name == "SmolLM2-135M-Instruct.Q4_1" and loaded.path.endswith(".gguf")
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (30, 576, 9, 3)
    assert (arch.vocab_size, arch.rope_theta, arch.tie_word_embeddings) == (49152, 100000.0, True)
    assert loaded.max_model_len == 1024 and 134e6 < loaded.num_params < 135e6
    assert "<|im_start|>" in loaded.tokenizer.chat_template
    assert loaded.tokenizer.convert_ids_to_tokens(list(arch.eos_token_ids)) == ["<|im_end|>"]


def chat_prompts(loaded: LoadedModel) -> list[list[int]]:
    """Token ids of QUESTIONS as single-turn chat prompts."""
    prompts = [
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        for q in QUESTIONS
    ]
    return [list(p["input_ids"]) if not isinstance(p, list) else p for p in prompts]


def test_greedy_decode_matches_transformers(loaded: LoadedModel, smollm2_hf_model) -> None:
    assert Path(default_model_path()).resolve() == smollm2_gguf().resolve()
    hf_model = smollm2_hf_model     # transformers' own load of that GGUF file
    prompts = chat_prompts(loaded)
    model, batch = loaded.model, PagedBatch(loaded.arch, num_blocks=32, block_size=16)
    chunks = [(i, prompt) for i, prompt in enumerate(prompts)]
    ours: list[list[int]] = [[], []]
    our_logits: list[list[torch.Tensor]] = [[], []]
    for _ in range(NUM_NEW_TOKENS):
        input_ids, positions, meta = batch.step(chunks)
        last_rows = (meta.cu_seqlens_q[1:] - 1).long()
        hidden = model(input_ids, positions, batch.kv_caches, meta)
        logits = model.compute_logits(hidden.index_select(0, last_rows))
        for i in range(2):
            our_logits[i].append(logits[i])
            ours[i].append(int(logits[i].argmax()))
        chunks = [(i, [ours[i][-1]]) for i in range(2)]

    for i, prompt in enumerate(prompts):
        tokens, expected = hf_greedy(hf_model, prompt)
        assert ours[i] == tokens, loaded.tokenizer.decode(ours[i])
        torch.testing.assert_close(torch.stack(our_logits[i]), expected, atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def served():
    """The compiled e2e server's model (tests/e2e/test_compiled_e2e.py): the default quantized load
    (int4 layers, int8 head, bf16 copies past COMPILED_CROSSOVER_ROWS) at SERVER_MAX_MODEL_LEN, and
    that server's step-thread rule. With the same model, flags and threads, its graphs have the
    server's cache keys, so they load from the run's one on-disk cache (tests/conftest.py) that
    the server filled, rather than compiling for minutes again."""
    model, arch, _ = load_model_weights(default_model_path(), torch.float32, torch.device("cpu"),
                                        SERVER_MAX_MODEL_LEN, "auto", COMPILED_CROSSOVER_ROWS)
    rule = plan_step_threads(available_cores(), explicit=False, leave_api_core=EngineConfig.leave_api_core)
    return model, arch, rule


def _clear_argmax(eager: torch.Tensor) -> torch.Tensor:
    """Rows whose top-1 logit leads the runner-up by at least MIN_CLEAR_MARGIN (else a near-tie)."""
    top2 = eager.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]) >= MIN_CLEAR_MARGIN


@pytest.mark.timeout(1800)     # a cold compile of 30 layers: ~1-2 min of CPU per graph, more on a busy box
@torch.inference_mode()
def test_compiled_decode_matches_eager(served, loaded: LoadedModel) -> None:
    """The served default: the compiled step's three graphs (1 sequence; 2-8 on the int4 copies;
    9 and more on the bf16 copies, on the server's thread counts) against the same model's eager
    forward, teacher-forced from the same prefill in two caches with the same block layout: 4
    steps of 9 sequences, 8 of 2, then 6 of 1. Logits within MAX_COMPILED_DIFF (bf16 rounding at
    other points); top-1 equal wherever the eager lead is
    at least MIN_CLEAR_MARGIN (observed: every row)."""
    model, arch, rule = served
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(available_cores())     # the server's count (engine/threads.py), else the rule's
    try:
        _compare_compiled_with_eager(model, arch, rule, loaded)
    finally:
        torch.set_num_threads(previous_threads)


def _compare_compiled_with_eager(model, arch, rule: StepThreads | None, loaded: LoadedModel) -> None:
    """test_compiled_decode_matches_eager's body, on the threads the server's engine thread would
    use: `rule`'s count per step, or every usable core for every step when `rule` is None."""
    threads_for = rule.threads_for if rule is not None else None
    kernel = model.layers[0].projections()["qkv"].int4_kernel
    scratch = 80
    eager_batch, compiled_batch = (PagedBatch(arch, num_blocks=scratch + 1, block_size=16) for _ in range(2))
    for batch in (eager_batch, compiled_batch):
        batch.free_blocks.remove(scratch)           # the scratch block: never handed to a sequence
    compiled = CompiledDecode(model, threads_for=threads_for)
    compiled.warm_up(compiled_batch.kv_caches, scratch)
    assert [rows for rows, _ in compiled.shapes][:3] == [1, 2, COMPILED_CROSSOVER_ROWS + 1]
    prompts = chat_prompts(loaded)
    chunks = [(i, prompts[i % len(prompts)]) for i in range(COMPILED_CROSSOVER_ROWS + 1)]
    for batch in (eager_batch, compiled_batch):
        input_ids, positions, meta = batch.step(chunks)
        hidden = model(input_ids, positions, batch.kv_caches, meta)
    tokens = model.compute_logits(hidden.index_select(0, (meta.cu_seqlens_q[1:] - 1).long())).argmax(-1).tolist()
    clear = 0
    for step in range(18):
        live = list(range(len(chunks))) if step < 4 else [0, 1] if step < 12 else [0]
        step_chunks = [(i, [tokens[i]]) for i in live]
        input_ids, positions, meta = eager_batch.step(step_chunks)
        eager = model.compute_logits(model(input_ids, positions, eager_batch.kv_caches, meta))
        input_ids, positions, meta = compiled_batch.step(step_chunks)
        if threads_for is not None:
            torch.set_num_threads(threads_for(len(live)))   # as the engine thread does (StepThreads)
        got = compiled.run(input_ids, positions, compiled_batch.kv_caches,
                           dataclasses.replace(meta, decode_only=True))
        assert float((got - eager).abs().max()) < MAX_COMPILED_DIFF[kernel], len(live)
        sure = _clear_argmax(eager)
        assert got.argmax(-1)[sure].tolist() == eager.argmax(-1)[sure].tolist()
        clear += int(sure.sum())
        for i, token in zip(live, eager.argmax(-1).tolist()):
            tokens[i] = token
    assert clear >= 0.8 * (4 * len(chunks) + 8 * 2 + 6), clear     # the comparison is not vacuous
