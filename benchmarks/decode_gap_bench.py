"""Where a served c=1 decode token's time goes: the same greedy decode loop three ways, alternating.

(a) `inproc`: LLMEngine.step() in a tight loop on this process's main thread;
(b) `async`: the same engine behind AsyncEngine (its own thread), consumed by an asyncio task, no HTTP;
(c) `served`: a real `api.cli serve` on loopback (server_process.py), streamed through the official
    openai client at concurrency 1.
Each round runs every mode once (one request of `--max-tokens` forced tokens, ignore_eos, after
one warm-up request per mode); the per-token time of a request is the median gap between its
successive outputs (prefill excluded). Prints one JSON line: per mode the median over rounds (ms per
token) and the rounds themselves, and each mode's ratio to `inproc`. The engine in (a)/(b) and the
server in (c) take the same `--num-threads`; (c) gets `--server-args` too.

    python benchmarks/decode_gap_bench.py [--rounds 3] [--max-tokens 128] [--num-threads N]
        [--modes inproc,async,served] [--server-args "..."]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from server_process import start_server, stop_servers  # noqa: E402

PROMPT = "Tell me a long story about a lighthouse keeper and the sea."


def _median_gap_ms(times: list[float]) -> float:
    """Median of successive differences of `times` (seconds), in ms."""
    return 1e3 * statistics.median(b - a for a, b in zip(times, times[1:]))


def _request(engine, request_id: str, max_tokens: int):
    from engine.request import EngineRequest
    from engine.sampling_params import SamplingParams

    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                add_generation_prompt=True)
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(request_id, list(ids), params, arrival_time=time.monotonic())


def run_inproc(engine, request_id: str, max_tokens: int) -> float:
    """(a): ms per decode token of LLMEngine.step() in a loop on a fresh thread, as the engine's
    own thread runs it (this process's main thread ran the load's measurements and has been seen
    to stall in OpenMP barriers on a busy machine)."""
    times: list[float] = []

    def loop() -> None:
        engine.add_request(_request(engine, request_id, max_tokens))
        while engine.has_work():
            if engine.step():
                times.append(time.perf_counter())

    thread = threading.Thread(target=loop, name="bench-inproc")
    thread.start()
    thread.join()
    return _median_gap_ms(times[1:])


def run_async(engine, request_id: str, max_tokens: int) -> float:
    """(b): ms per decode token through a fresh AsyncEngine over `engine`, an asyncio consumer."""
    from engine.async_engine import AsyncEngine

    front = AsyncEngine(engine, "bench", "bench")

    async def consume() -> list[float]:
        return [time.perf_counter() async for _ in front.generate(_request(engine, request_id, max_tokens))]

    try:
        times = asyncio.run(consume())
    finally:
        front.shutdown()
    return _median_gap_ms(times[1:])


def run_served(base_url: str, request_id: str, max_tokens: int) -> float:
    """(c): ms per decode token of one streamed chat completion through the openai client."""
    from openai import AsyncOpenAI

    async def consume() -> list[float]:
        client = AsyncOpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=600)
        times = []
        stream = await client.chat.completions.create(
            model="bench", messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
            temperature=0.0, stream=True, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
        await client.close()
        return times

    return _median_gap_ms(asyncio.run(consume())[1:])


def _build_engine(num_threads: int | None):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    front = AsyncEngine.start(EngineConfig(num_threads=num_threads))
    front.shutdown()            # keep its LLMEngine, drive it from here
    return front.engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-threads", default="", help="comma-separated torch thread counts to alternate "
                   "(one server each); 0 or none: the engine's own choice (served only: per-step threads)")
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for (a)/(b), s")
    p.add_argument("--modes", default="inproc,async,served")
    p.add_argument("--server-args", default="--no-compile",
                   help="extra serve flags (default --no-compile: the in-process modes run the eager step)")
    a = p.parse_args()
    modes = a.modes.split(",")
    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval)
    thread_counts = [int(n) for n in a.num_threads.split(",") if n] or [None]
    engine = _build_engine(thread_counts[0]) if {"inproc", "async"} & set(modes) else None
    default_threads = torch.get_num_threads() if engine is not None else None
    servers = {}
    runners = {}
    logs = tempfile.TemporaryDirectory(prefix="decode-gap-")   # the servers' logs: wait_for_compile reads them
    try:
        for n in thread_counts:
            if "served" in modes:
                threads = ["--num-threads", str(n)] if n else []
                log = Path(logs.name) / f"server-t{n}.log"
                servers[n] = start_server(["--served-model-name", "bench", *threads, *a.server_args.split()],
                                          log_path=log, timeout_s=300.0)
        for n, server in servers.items():   # a compiling server serves eager steps until its graphs are in
            outcome = server.wait_for_compile()
            if outcome:
                print(json.dumps({f"compile-t{n}": outcome.split(" - ")[-1]}), file=sys.stderr, flush=True)
        for n in thread_counts:
            for mode in modes:
                runners[f"{mode}-t{n}"] = _runner(mode, n or default_threads, engine, servers.get(n), a.max_tokens)
        for name, run in runners.items():
            run(f"warm-{name}")
        rounds: dict[str, list[float]] = {name: [] for name in runners}
        for r in range(a.rounds):
            for name in runners if r % 2 == 0 else reversed(runners):
                rounds[name].append(round(runners[name](f"{name}-{r}"), 3))
                print(json.dumps({name: rounds[name][-1]}), file=sys.stderr, flush=True)
    finally:
        stop_servers(*servers.values(), timeout_s=60.0)
        logs.cleanup()
    figures: dict[str, object] = {"switch_interval": a.switch_interval, "server_args": a.server_args,
                                  "load_avg": os.getloadavg()}
    for name in runners:
        figures[name] = {"ms_per_token": statistics.median(rounds[name]), "rounds": rounds[name]}
    for n in thread_counts:
        base = figures.get(f"inproc-t{n}")
        for mode in modes:
            if base is not None:
                entry = figures[f"{mode}-t{n}"]
                entry["over_inproc"] = round(entry["ms_per_token"] / base["ms_per_token"], 3)
    print(json.dumps(figures))


def _runner(mode: str, num_threads: int | None, engine, server, max_tokens: int):
    """A function of a request id that runs one request of `mode` and returns its ms per token;
    in-process modes set torch's thread count first (each runs on a new thread, which takes it)."""
    def run(request_id: str) -> float:
        if mode == "served":
            return run_served(server.url, request_id, max_tokens)
        torch.set_num_threads(num_threads)
        return (run_inproc if mode == "inproc" else run_async)(engine, request_id, max_tokens)
    return run


if __name__ == "__main__":
    main()
