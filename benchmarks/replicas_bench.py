#!/usr/bin/env python3
"""`--data-parallel-size 2`: structserve's request router against Serve's default router (issue 16).

Starts the server twice on a free loopback port, 2 SmolLM2 replicas of one torch thread each:
first with `--request-router structserve`, then with `--request-router default` (Ray Serve's power
of two choices). Each gets the same load: 4 distinct system prompts of about 1,000 tokens, 32
streamed chat requests (request i uses prompt i % 4 and its own question) at concurrency 8,
`--max-tokens` output tokens, temperature 0. Reports, per router: the prefix-cache hit rate
(cached prompt tokens / prompt tokens, from each answer's usage), TTFT p50 and p90 (ms), how many
requests each replica served, and the start-up time (process start to /health 200); then the
ratios ours / default. Prints ONE JSON line. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter

import httpx

from server_process import start_server, stop_servers

TOPICS = ("astronomy", "cooking", "tax law", "sailing")


def system_prompt(topic: str) -> str:
    """About 1,000 SmolLM2 tokens of rules about `topic` (its first words already differ per topic)."""
    rules = " ".join(f"Rule {i} for {topic}: answer questions on {topic} subtopic {i} briefly, "
                     f"politely and with one concrete example." for i in range(38))
    return f"You are an expert assistant on {topic}. {rules}"


async def one(client: httpx.AsyncClient, system: str, question: str, max_tokens: int) -> dict:
    """TTFT (s), prompt and cached tokens and the serving replica of one streamed chat request."""
    body = {"model": "smollm2", "messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, usage = None, {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        replica = response.headers.get("x-structserve-replica")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": details.get("cached_tokens") or 0, "replica": replica}


async def run_load(base_url: str, a: argparse.Namespace) -> dict:
    """`a.requests` requests at `a.concurrency`: hit rate, TTFT p50/p90 and requests per replica."""
    prompts = [system_prompt(topic) for topic in TOPICS]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(a.requests):
        queue.put_nowait(i)
    results: list[dict] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600, trust_env=False,
                                 limits=httpx.Limits(max_connections=a.concurrency)) as client:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results.append(await one(client, prompts[i % len(prompts)], f"Question {i}: give one tip.",
                                         a.max_tokens))

        await asyncio.gather(*(worker() for _ in range(a.concurrency)))
    ttfts = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    prompt_tokens = sum(r["prompt_tokens"] for r in results)
    return {"hit_rate": sum(r["cached_tokens"] for r in results) / prompt_tokens,
            "prompt_tokens_per_request": prompt_tokens / len(results),
            "ttft_p50_ms": 1000 * statistics.median(ttfts), "ttft_p90_ms": 1000 * ttfts[int(0.9 * len(ttfts))],
            "requests_per_replica": dict(sorted(Counter(r["replica"] for r in results).items()))}


def measure(router: str, a: argparse.Namespace) -> dict:
    """Start the server with `router`, run the load once, stop it."""
    start = time.perf_counter()
    server = start_server(["--data-parallel-size", "2", "--request-router", router, "--num-threads", "1",
                           "--served-model-name", "smollm2", "--kv-cache-memory", "512MiB",
                           "--max-model-len", "4096", "--no-compile", "--responses-db", ":memory:"],
                          timeout_s=600)
    startup_s = time.perf_counter() - start
    try:
        return {"startup_s": startup_s, **asyncio.run(run_load(server.url, a))}
    finally:
        stop_servers(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--default-first", action="store_true",
                        help="measure Serve's default router first (to see the order's effect on a busy box)")
    a = parser.parse_args()
    if a.default_first:
        default, ours = measure("default", a), measure("structserve", a)
    else:
        ours, default = measure("structserve", a), measure("default", a)
    print(json.dumps({"structserve": ours, "default": default,
                      "hit_rate_ratio": ours["hit_rate"] / default["hit_rate"] if default["hit_rate"] else None,
                      "ttft_p50_ratio": ours["ttft_p50_ms"] / default["ttft_p50_ms"]}))


if __name__ == "__main__":
    main()
